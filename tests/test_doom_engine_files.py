"""The engine copy beside an uncompressed vizdoom.pk3 (envs/doom/engine_files.py)."""
import os
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import psutil
import pytest

vizdoom = pytest.importorskip("vizdoom")

from fastrl.envs.doom import engine  # noqa: E402
from fastrl.envs.doom.engine_files import PREFIX, RESOURCES, stored_engine  # noqa: E402
from fastrl.envs.registry import get_spec  # noqa: E402

VIZDOOM_DIR = os.path.dirname(vizdoom.__file__)


def play(engine_path, steps=60):
    """Screens and game variables of one seeded deathmatch.wad game under fixed
    actions, run by the engine at `engine_path` (None: ViZDoom's own)."""
    game = vizdoom.DoomGame()
    game.load_config(os.path.join(vizdoom.scenarios_path, "deathmatch.cfg"))
    game.set_doom_scenario_path(os.path.join(vizdoom.scenarios_path, "deathmatch.wad"))
    game.set_window_visible(False)
    game.set_screen_resolution(vizdoom.ScreenResolution.RES_160X120)
    game.set_seed(7)
    if engine_path:
        game.set_vizdoom_path(engine_path)
    game.init()
    buttons = game.get_available_buttons_size()
    rng = np.random.default_rng(0)
    screens, variables = [], []
    try:
        game.new_episode()
        for _ in range(steps):
            state = game.get_state()
            screens.append(state.screen_buffer.copy())
            variables.append(np.array(state.game_variables))
            game.make_action(rng.integers(0, 2, buttons).tolist(), 4)
            if game.is_episode_finished():
                break
    finally:
        game.close()
    return screens, variables


def test_the_copy_with_stored_resources_plays_the_same_game_as_vizdooms_own(tmp_path):
    copy = stored_engine(VIZDOOM_DIR, str(tmp_path))
    assert copy is not None and os.path.dirname(copy) != VIZDOOM_DIR
    with zipfile.ZipFile(os.path.join(os.path.dirname(copy), RESOURCES)) as pk3:
        assert {info.compress_type for info in pk3.infolist()} == {zipfile.ZIP_STORED}
    own, stored = play(None), play(copy)
    assert len(own[0]) == len(stored[0]) > 10
    for t, (a, b) in enumerate(zip(own[0], stored[0])):
        assert np.array_equal(a, b), f"screen {t} differs"
    np.testing.assert_array_equal(np.array(own[1]), np.array(stored[1]))


def test_the_copy_is_made_once_and_a_new_vizdoom_gets_its_own(tmp_path):
    fake = tmp_path / "site" / "vizdoom"
    fake.mkdir(parents=True)
    for name in ("vizdoom", RESOURCES):
        shutil.copy2(os.path.join(VIZDOOM_DIR, name), fake / name)
    libraries = os.path.join(os.path.dirname(VIZDOOM_DIR), "vizdoom.libs")
    if os.path.isdir(libraries):
        os.symlink(libraries, tmp_path / "site" / "vizdoom.libs")
    home = tmp_path / "private"
    home.mkdir()
    first = stored_engine(str(fake), str(home))
    made = os.stat(first).st_mtime_ns
    assert stored_engine(str(fake), str(home)) == first and os.stat(first).st_mtime_ns == made
    os.utime(fake / RESOURCES)  # an upgraded ViZDoom
    assert stored_engine(str(fake), str(home)) not in (None, first)
    assert not [p for p in os.listdir(home) if p.endswith(".tmp")]


def test_a_build_left_half_made_by_a_killed_process_is_removed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    abandoned = tmp_path / f"{PREFIX}0123456789ab.{dead.pid}.tmp"
    (abandoned / "bin").mkdir(parents=True)
    ours = tmp_path / f"{PREFIX}ba9876543210.{os.getpid()}.tmp"  # a build this process is making
    ours.mkdir()
    assert stored_engine(VIZDOOM_DIR, str(tmp_path)) is not None
    assert not abandoned.exists() and ours.exists()


def test_a_copy_that_would_not_load_its_libraries_is_not_used(tmp_path):
    # ViZDoom crashes the Python process whose engine exits during init: a copy
    # whose libraries cannot be found must never be handed to it.
    if not os.path.isdir(os.path.join(os.path.dirname(VIZDOOM_DIR), "vizdoom.libs")):
        pytest.skip("this ViZDoom links the system's libraries, which any copy finds")
    fake = tmp_path / "site" / "vizdoom"  # no vizdoom.libs beside it
    fake.mkdir(parents=True)
    for name in ("vizdoom", RESOURCES):
        shutil.copy2(os.path.join(VIZDOOM_DIR, name), fake / name)
    assert stored_engine(str(fake), str(tmp_path / "private")) is None


def test_fastrls_envs_run_the_copy():
    env = get_spec("doom_basic").make(seed=0)
    try:
        env.reset(seed=0)
        engines = [p for p in psutil.Process().children(recursive=True) if p.name() == "vizdoom"]
        assert engines, "no engine process found"
        expected = stored_engine(VIZDOOM_DIR, engine.private_dir())
        assert expected is not None and {p.exe() for p in engines} == {expected}
    finally:
        env.close()


@pytest.mark.parametrize("squatter", ["file", "foreign folder", "open folder"])
def test_a_squatted_temp_folder_falls_back_to_the_users_cache(tmp_path, monkeypatch, squatter):
    # Another user (or a stray file) holding /tmp/fastrl-<uid> must neither stop the engines nor
    # make them run files from a folder others can write.
    monkeypatch.setattr(engine.tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    squatted = tmp_path / "tmp" / f"fastrl-{os.getuid()}"
    squatted.parent.mkdir()
    if squatter == "file":
        squatted.write_text("not a folder")
    elif squatter == "foreign folder":
        if os.getuid() != 0:
            pytest.skip("giving a folder to another user takes root")
        squatted.mkdir(mode=0o700)
        os.chown(squatted, 12345, 12345)
    else:
        squatted.mkdir()
        squatted.chmod(0o777)
    fallback = engine.private_dir()
    assert fallback == str(tmp_path / "cache" / "fastrl" / "engine-files")
    assert os.stat(fallback).st_mode & 0o777 == 0o700
    # The engine copy is made there and runs.
    assert stored_engine(VIZDOOM_DIR, fallback) is not None


def test_no_safe_folder_at_all_leaves_the_engine_to_vizdoom(tmp_path, monkeypatch):
    monkeypatch.setattr(engine.tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "tmp" / f"fastrl-{os.getuid()}").write_text("")
    (tmp_path / "cache").write_text("")  # the cache's parent is a file: nothing can be made under it
    assert engine.private_dir() is None


def test_a_game_starts_through_the_launcher_in_the_fallback_folder(tmp_path):
    (tmp_path / f"fastrl-{os.getuid()}").write_text("squatted")
    script = ("from fastrl.envs.doom import engine\n"
              "from fastrl.envs.registry import get_spec\n"
              "env = get_spec('doom_basic').make(seed=0)\n"
              "env.reset(seed=0)\n"
              "env.step(env.action_space.sample())\n"
              "print(engine.engine_launcher_path())\n"
              "env.close()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TMPDIR": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-2000:]
    launcher = done.stdout.strip().splitlines()[-1]
    assert launcher.startswith(str(tmp_path / "cache" / "fastrl" / "engine-files") + os.sep), done.stdout
