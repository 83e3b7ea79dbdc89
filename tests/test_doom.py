"""Doom envs: every scenario steps with the right spaces and episode-end flags,
and no engine process or /dev/shm segment outlives its owner on any exit path."""
import mmap
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

vizdoom = pytest.importorskip("vizdoom")
pytest.importorskip("cv2")

from fastrl.envs.doom import engine  # noqa: E402
from fastrl.envs.doom._reaper import pid_alive, shm_names  # noqa: E402
from fastrl.envs.doom.engine import cleanup_stale_doom_shm  # noqa: E402
from fastrl.envs.registry import get_spec  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMED = ["doom_battle", "doom_deathmatch", "doom_duel", "doom_basic", "doom_defend_the_center", "doom_defend_the_line",
         "doom_health_gathering_supreme", "doom_deadly_corridor", "doom_my_way_home"]


def make(name, seed=0, **options):
    return get_spec(name).make(seed=seed, **options)


def leftovers(instance_id):
    return [n for n in shm_names(instance_id) if os.path.exists(os.path.join("/dev/shm", n))]


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def assert_gone(pid, instance_id, timeout=5.0):
    assert wait_until(lambda: not pid_alive(pid) and not leftovers(instance_id), timeout), (
        f"engine {pid} alive={pid_alive(pid)}, segments left={leftovers(instance_id)}")


def noop(env):
    return np.zeros(len(env.action_space.nvec), dtype=np.int64)


# -- every scenario ------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMED)
def test_scenario_constructs_resets_and_steps(name):
    env = make(name, seed=1)
    pid, iid = env.engine_pid, env.instance_id
    assert pid_alive(pid) and len(leftovers(iid)) == 3
    assert env.observation_space.shape == (3, 72, 128) and env.observation_space.dtype == np.uint8
    obs, info = env.reset()
    assert obs.shape == (3, 72, 128) and obs.dtype == np.uint8
    assert obs.transpose(1, 2, 0).flags.c_contiguous  # channels-last in memory, as the buffers store it
    assert env.observation_space.contains(obs) and obs.any()
    for _ in range(20):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
        assert isinstance(reward, float) and isinstance(terminated, bool) and isinstance(truncated, bool)
        if terminated or truncated:
            assert "true_objective" in info
            obs, _ = env.reset()
    env.close()
    assert_gone(pid, iid, timeout=2.0)


def test_battle_action_space_and_measurements():
    env = make("doom_battle", doom_measurements=True)
    assert env.action_space.nvec.tolist() == [3, 3, 2, 2, 11]
    obs, _ = env.reset()
    assert set(obs) == {"obs", "measurements"} and env.observation_space.contains(obs)
    m = obs["measurements"]
    assert m.dtype == np.float32 and m.shape == (5,)
    health, ammo, armor, kills, weapon = m.tolist()
    assert health == pytest.approx(1.0) and armor == 0.0 and kills == 0.0
    assert ammo > 0 and 0 < weapon <= 1  # a pistol with bullets
    for _ in range(10):
        obs, *_ = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
    env.close()


def test_hud_draws_the_status_bar_at_the_bottom():
    plain, hud = make("doom_defend_the_center", seed=3), make("doom_defend_the_center", seed=3, doom_hud=True)
    a, b = plain.reset()[0].astype(np.int16), hud.reset()[0].astype(np.int16)
    plain.close()
    hud.close()
    assert a.shape == b.shape
    rows = np.abs(a - b).mean(axis=(0, 2))  # mean difference per image row
    height = a.shape[1]
    # Doom's status bar takes the bottom 32 of 200 rows (~16%), where the floor was;
    # the 3D view above it is squeezed, which moves the horizon too.
    assert rows[-height // 8:].mean() > 30
    assert rows[-height // 8:].mean() > 1.5 * rows[: height // 2].mean()


def test_seeds_reproduce_episodes():
    a, b = make("doom_basic", seed=7), make("doom_basic", seed=7)
    first_a, first_b = a.reset()[0], b.reset()[0]
    np.testing.assert_array_equal(first_a, first_b)  # make(seed) seeds the first reset
    starts = {s: a.reset(seed=s)[0] for s in (11, 12)}
    np.testing.assert_array_equal(b.reset(seed=11)[0], starts[11])
    assert not np.array_equal(starts[11], starts[12])  # basic places its monster at random
    a.close(), b.close()


def test_engine_recycling_replaces_the_engine_and_plays_the_same_episodes():
    # doom_basic places its monster at random each episode, so equal first frames
    # mean equal episode seeds; the engine of every second episode is a new process,
    # and the one it replaced is gone with its shared memory.
    keeping = make("doom_basic", seed=3)
    recycling = make("doom_basic", seed=3, doom_engine_recycle_episodes=2)
    engines = []
    for _ in range(5):
        np.testing.assert_array_equal(keeping.reset()[0], recycling.reset()[0])
        engines.append((recycling.engine_pid, recycling.instance_id))
        for _ in range(3):
            keeping.step(noop(keeping)), recycling.step(noop(recycling))
    assert [pid for pid, _ in engines[::2]] == list(dict.fromkeys(pid for pid, _ in engines))  # new at 0, 2, 4
    assert engines[0][0] == engines[1][0] and engines[2][0] == engines[3][0]
    assert recycling.engine_recycles == 2 and recycling.restarts == 0 and keeping.engine_recycles == 0
    for pid, instance in engines[:4:2]:
        assert_gone(pid, instance)
    keeping.close(), recycling.close()


def test_the_env_and_the_trainer_recycle_engines_at_one_default():
    # fastrl.enjoy, the evaluator and bench make DoomEnvs directly; the trainer
    # passes the option only when it differs from the env's own default.
    import inspect

    from fastrl.envs.doom.doom_env import DoomEnv

    from fastrl.config import env_options, parse_args

    env_default = inspect.signature(DoomEnv).parameters["engine_recycle_episodes"].default
    cfg, _ = parse_args(["--env", "doom_basic"])
    assert cfg.doom_engine_recycle_episodes == env_default > 0
    assert "doom_engine_recycle_episodes" not in env_options(cfg)
    cfg, _ = parse_args(["--env", "doom_basic", "--doom_engine_recycle_episodes", "0"])
    assert env_options(cfg)["doom_engine_recycle_episodes"] == 0


def test_engine_recycling_refuses_a_negative_count():
    with pytest.raises(ValueError, match="engine_recycle_episodes must be 0"):
        make("doom_basic", doom_engine_recycle_episodes=-1)


def test_render_rgb_array():
    env = make("doom_basic", render_mode="rgb_array")
    env.reset()
    env.step(noop(env))
    frame = env.render()
    assert frame.shape == (120, 160, 3) and frame.dtype == np.uint8 and frame.any()
    env.close()


# -- episode ends ----------------------------------------------------------------------------

def test_timeout_truncates():
    env = make("doom_basic", doom_episode_timeout=20)  # tics: 5 agent steps
    env.reset()
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(noop(env))
        total, steps = total + reward, steps + 1
        if terminated or truncated:
            break
        assert "true_objective" not in info
    assert truncated and not terminated and steps <= 6
    assert info["true_objective"] == pytest.approx(total)  # basic's objective: its own reward
    with pytest.raises(RuntimeError):
        env.step(noop(env))
    env.reset()
    env.step(noop(env))
    env.close()


def test_death_terminates():
    # Standing still on health_gathering_supreme's acid floor dies (96 steps here).
    env = make("doom_health_gathering_supreme")
    env.reset(seed=0)
    for _ in range(1, 600):
        _, _, terminated, truncated, info = env.step(noop(env))
        if terminated or truncated:
            break
    assert terminated and not truncated and env.game.is_player_dead()
    assert "true_objective" in info
    env.close()


def test_gathering_reward_pays_each_medikit_and_the_objective_is_the_game_score():
    # Random play on health_gathering_supreme picks up a medikit within a few episodes.
    # The reward is the game's (+1 a tic, -100 at death) plus the bonus exactly on the
    # steps whose health rose; the true objective stays the game's own score.
    from fastrl.envs.doom.scenarios import GATHERING_PICKUP_REWARD

    env = make("doom_health_gathering_supreme")
    env.reset(seed=0)
    env.action_space.seed(0)
    health = vizdoom.GameVariable.HEALTH
    pickups = 0
    for _ in range(10):
        env.reset()
        game_total, before = 0.0, env.game.get_game_variable(health)
        while True:
            _, reward, terminated, truncated, info = env.step(env.action_space.sample())
            done = terminated or truncated
            now = -1.0 if done else env.game.get_game_variable(health)
            game_reward = env.game.get_last_reward()
            rose = now > before
            assert reward == pytest.approx(game_reward + (GATHERING_PICKUP_REWARD if rose else 0.0))
            pickups += rose
            game_total, before = game_total + game_reward, now
            if done:
                break
        assert info["true_objective"] == pytest.approx(game_total)
        if pickups:
            break
    assert pickups > 0, "no medikit picked up in 10 random episodes"
    env.close()


def test_battle_reward_and_objective_on_death():
    env = make("doom_battle")
    env.reset()
    env.game.send_game_command("kill")
    _, reward, terminated, truncated, info = env.step(noop(env))
    assert terminated and not truncated
    assert reward == pytest.approx(-1.0)  # the death penalty, nothing else
    assert info["true_objective"] == 0.0  # kills
    env.close()


def test_battle_shaping_sums_each_variables_change_by_its_weight():
    # Against the scheme's own statement, as arrays: each change times its weight,
    # a variable marked "+" counting only when it rises.
    from fastrl.envs.doom.scenarios import BATTLE_SHAPING

    env = make("doom_battle")
    names = list(env.unwrapped._var_names)
    idx = np.array([names.index(n) for n, _, _ in BATTLE_SHAPING])
    rises_only = np.array([sign == "+" for _, sign, _ in BATTLE_SHAPING])
    weights = np.array([w for _, _, w in BATTLE_SHAPING])
    rng = np.random.default_rng(0)
    for _ in range(200):
        before = rng.integers(0, 5, len(names)).astype(float)
        now = before + rng.integers(-3, 4, len(names)) * rng.integers(0, 2, len(names))
        change = now[idx] - before[idx]
        expected = float(np.where(rises_only, np.maximum(change, 0.0), change) @ weights)
        assert env.unwrapped._reward(0.0, now.tolist(), before.tolist()) == pytest.approx(expected, abs=1e-12)
    env.close()


def test_an_action_gives_the_same_buttons_each_time_and_a_bad_one_is_refused_each_time():
    from fastrl.envs.doom.actions import ActionMapper

    mapper = ActionMapper(["ATTACK", "MOVE_FORWARD", "TURN_LEFT_RIGHT_DELTA"], frameskip=4)
    first = mapper(np.array([1, 1, 3]))
    assert mapper(np.array([1, 1, 3])) == first and mapper([1, 1, 3]) == first
    assert mapper(np.array([0, 0, 5])) != first
    for _ in range(2):  # remembered values must not let an out-of-range action through
        with pytest.raises(ValueError, match="outside"):
            mapper(np.array([2, 0, 0]))
        with pytest.raises(ValueError, match="entries"):
            mapper(np.array([1, 1]))


def test_deathmatch_respawns_and_ends_by_timeout():
    env = make("doom_deathmatch", doom_episode_timeout=120, doom_num_bots=2)
    env.reset()
    env.game.send_game_command("kill")
    total = 0.0
    while True:
        _, reward, terminated, truncated, info = env.step(noop(env))
        total += reward
        if terminated or truncated:
            break
        assert not env.game.is_player_dead()  # respawned within the step
    assert truncated and not terminated
    assert env.game.get_game_variable(vizdoom.GameVariable.DEATHCOUNT) == 1.0  # it died once
    # ZDoom usually charges the suicide a frag, but not always (about 1 run in 20, even
    # with one seed), so the reward is checked against the engine's own frag count.
    frags = env.game.get_game_variable(vizdoom.GameVariable.FRAGCOUNT)
    assert total == frags == info["true_objective"] and frags in (0.0, -1.0)
    env.close()


@pytest.mark.parametrize("launcher", ["fastrl's launcher", "none (ViZDoom's own engine)"])
def test_a_scenario_config_cannot_choose_the_engine(tmp_path, monkeypatch, launcher):
    # A .cfg handed over with an experiment names an executable of its own as the engine.
    marker = tmp_path / "it ran"
    impostor = tmp_path / "impostor.sh"
    impostor.write_text(f"#!/bin/sh\ntouch '{marker}'\nexit 1\n")
    impostor.chmod(0o755)
    cfg = tmp_path / "handed_over.cfg"
    cfg.write_text(f"vizdoom_path = {impostor}\n"
                   f"doom_scenario_path = {os.path.join(vizdoom.scenarios_path, 'basic.wad')}\n"
                   "available_buttons = { ATTACK }\n")
    if launcher.startswith("none"):
        monkeypatch.setattr(engine, "engine_launcher_path", lambda: None)
    env = make("doom_custom", doom_scenario=str(cfg))
    try:
        env.reset()
        env.step(env.action_space.sample())
    finally:
        env.close()
    assert not marker.exists()


def test_custom_scenario(tmp_path):
    cfg = tmp_path / "mine.cfg"
    cfg.write_text(textwrap.dedent(f"""\
        doom_scenario_path = {os.path.join(vizdoom.scenarios_path, "basic.wad")}
        doom_map = map01
        episode_timeout = 40
        living_reward = -1
        available_buttons = {{ MOVE_FORWARD TURN_LEFT_RIGHT_DELTA ATTACK USE }}
        """))
    env = make("doom_custom", doom_scenario=str(cfg))
    assert [h.name for h in env._actions.heads] == ["move", "attack", "turn", "use"]
    assert env.action_space.nvec.tolist() == [2, 2, 11, 2]
    obs, _ = env.reset()
    assert obs.shape == (3, 72, 128)
    total = 0.0
    while True:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total += reward
        if terminated or truncated:
            break
    assert truncated and info["true_objective"] == pytest.approx(total) and total < 0
    env.close()


def test_custom_scenario_errors(tmp_path, capfd):
    with pytest.raises(ValueError, match="doom_scenario"):
        make("doom_custom")
    with pytest.raises(ValueError, match="not a file"):
        make("doom_custom", doom_scenario=str(tmp_path / "missing.cfg"))
    (tmp_path / "notes.cfg").write_text("buy milk\n\nepisode_timeout = 40\nsee Bob\n")
    capfd.readouterr()
    with pytest.raises(ValueError, match=r"could not load the config .*notes.cfg: "
                                         r"Syntax error in line #1, and 1 more complaint\(s\)$"):
        make("doom_custom", doom_scenario=str(tmp_path / "notes.cfg"))
    assert capfd.readouterr().err == ""  # ViZDoom's own lines went into the error, not the terminal
    with pytest.raises(ValueError, match="did you mean doom_measurements"):
        make("doom_basic", doom_measurments=True)


# -- crashes and hangs -----------------------------------------------------------------------

def test_an_engine_that_fails_while_starting_in_a_reset_is_replaced_and_counted(monkeypatch):
    env = make("doom_basic", doom_engine_recycle_episodes=1)  # the next reset starts a new engine
    try:
        env.reset()
        real_init = engine.init_game
        calls = []

        def dies_once(game, hang_timeout):
            calls.append(1)
            if len(calls) == 1:
                raise vizdoom.ViZDoomUnexpectedExitException("killed while starting")
            return real_init(game, hang_timeout)

        monkeypatch.setattr(engine, "init_game", dies_once)
        _, info = env.reset()
        assert len(calls) == 2 and env.restarts == 1 and info["env_restarts"] == 1
        assert pid_alive(env.engine_pid)
    finally:
        env.close()


def test_engines_that_fail_while_the_env_is_made_are_reported_at_its_first_reset(monkeypatch):
    real_init = engine.init_game
    calls = []

    def dies_twice(game, hang_timeout):
        calls.append(1)
        if len(calls) <= 2:
            raise vizdoom.ViZDoomUnexpectedExitException("killed while starting")
        return real_init(game, hang_timeout)

    monkeypatch.setattr(engine, "init_game", dies_twice)
    env = make("doom_basic")
    try:
        _, info = env.reset()
        assert len(calls) == 3 and info["env_restarts"] == 2
        _, info = env.reset()
        assert "env_restarts" not in info  # each restart is reported once
    finally:
        env.close()


def test_restart_after_engine_is_killed():
    env = make("doom_battle")
    env.reset()
    env.step(noop(env))
    old_pid, old_iid = env.engine_pid, env.instance_id
    os.kill(old_pid, signal.SIGKILL)
    obs, reward, terminated, truncated, info = env.step(noop(env))
    assert truncated and not terminated and info["env_restarts"] == 1 and "true_objective" in info
    assert obs.shape == (3, 72, 128) and reward == 0.0
    assert_gone(old_pid, old_iid, timeout=2.0)
    obs, _ = env.reset()
    assert env.engine_pid != old_pid and pid_alive(env.engine_pid) and env.restarts == 1
    _, _, terminated, truncated, info = env.step(noop(env))
    assert not (terminated or truncated) and "env_restarts" not in info
    env.close()


def test_restart_after_engine_hangs():
    env = make("doom_basic", doom_hang_timeout=1.0)
    env.reset()
    pid, iid = env.engine_pid, env.instance_id
    os.kill(pid, signal.SIGSTOP)  # a hung engine: alive, never answers
    try:
        t0 = time.monotonic()
        _, _, terminated, truncated, info = env.step(noop(env))
        took = time.monotonic() - t0
    finally:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert truncated and info["env_restarts"] == 1 and 0.9 < took < 5.0
    assert_gone(pid, iid, timeout=2.0)
    env.reset()
    env.step(noop(env))
    env.close()


@pytest.mark.slow
def test_kills_during_busy_stepping_always_recover():
    """Killing the engine mid-step sometimes leaves ViZDoom's queue mutex locked by
    the dead engine; the watchdog must release it so that every kill recovers."""
    import random
    import threading

    env = make("doom_battle")
    rounds = 60  # about 2 in 100 kills land while the engine holds the mutex
    for r in range(rounds):
        env.reset()
        pid, iid = env.engine_pid, env.instance_id
        threading.Timer(random.uniform(0.02, 0.1), os.kill, (pid, signal.SIGKILL)).start()
        t0 = time.monotonic()
        while env.restarts == r:  # the kill shows in a step, or in a reset after an episode end
            _, _, terminated, truncated, info = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
            assert time.monotonic() - t0 < 10, "a killed engine was never noticed"
        assert_gone(pid, iid, timeout=2.0)
    assert env.restarts == rounds
    print(f"{rounds} kills, {env.mutex_repairs} abandoned queue mutexes released")
    env.close()


def test_watchdog_releases_a_mutex_whose_owner_died(tmp_path):
    """The repair itself, made deterministic: a process-shared mutex in a file named
    like a ViZDoom queue, locked by a process that then exits, and a thread of ours
    blocked on it. The watchdog's repair must release it and let the thread in."""
    import ctypes
    import threading

    if engine._FUTEX_SYSCALL is None:
        pytest.skip("futex repair is only implemented for x86_64 and aarch64 Linux")
    libc = ctypes.CDLL(None, use_errno=True)
    fake_id = "FakeQueue1"
    path = tmp_path / f"ViZDoomMQCtr{fake_id}"
    path.write_bytes(b"\0" * 4096)
    f = open(path, "r+b")
    mapping = mmap.mmap(f.fileno(), 4096)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(mapping)) + 64
    attr = ctypes.create_string_buffer(16)
    libc.pthread_mutexattr_init(attr)
    libc.pthread_mutexattr_setpshared(attr, 1)  # PTHREAD_PROCESS_SHARED
    assert libc.pthread_mutex_init(ctypes.c_void_p(addr), attr) == 0
    # Another process takes the mutex and dies holding it, as a killed engine does.
    subprocess.run([sys.executable, "-c", textwrap.dedent(f"""\
        import ctypes, mmap, os
        f = open({str(path)!r}, "r+b"); m = mmap.mmap(f.fileno(), 4096)
        a = ctypes.addressof(ctypes.c_char.from_buffer(m)) + 64
        assert ctypes.CDLL(None).pthread_mutex_lock(ctypes.c_void_p(a)) == 0
        os._exit(0)
        """)], check=True, timeout=10)
    got_it = threading.Event()

    def waiter():
        libc.pthread_mutex_lock(ctypes.c_void_p(addr))  # ctypes releases the GIL
        got_it.set()
        libc.pthread_mutex_unlock(ctypes.c_void_p(addr))

    threading.Thread(target=waiter, daemon=True).start()
    assert not got_it.wait(0.3), "the mutex should be stuck"
    assert engine.repair_abandoned_mutexes(fake_id) == 1
    assert got_it.wait(2.0), "the waiter was not released"
    assert engine.repair_abandoned_mutexes(fake_id) == 0  # nothing left to repair
    try:
        mapping.close()
    except BufferError:
        pass
    f.close()


# -- ownership: close, SIGTERM, SIGKILL ------------------------------------------------------

CHILD = textwrap.dedent("""\
    import os, signal, sys, time
    sys.path.insert(0, {repo!r})
    from fastrl.envs.registry import get_spec
    from fastrl.envs.doom import engine
    if {foreign_handler!r}:
        signal.signal(signal.SIGTERM, lambda *a: os._exit(3))  # a handler that closes nothing
    env = get_spec("doom_battle").make(seed=0)
    env.reset()
    print(env.engine_pid, env.instance_id, engine.REAPER.pid, flush=True)
    while True:
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            env.reset()
""")


@pytest.mark.parametrize("sig, foreign_handler", [
    (signal.SIGTERM, False),  # our handler closes the game
    (signal.SIGTERM, True),   # someone else's handler: the death signal and the reaper do it
    (signal.SIGKILL, False),
])
def test_killed_owner_leaves_no_engine_and_no_segments(sig, foreign_handler):
    before = set(os.listdir("/dev/shm"))
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(repo=REPO, foreign_handler=foreign_handler)],
                             stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().split()
        assert len(line) == 3, "the child did not start its game"
        engine_pid, iid, reaper_pid = int(line[0]), line[1], int(line[2])
        assert pid_alive(engine_pid) and len(leftovers(iid)) == 3 and pid_alive(reaper_pid)
        time.sleep(0.3)  # let it step
        child.send_signal(sig)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
    assert_gone(engine_pid, iid, timeout=5.0)
    assert wait_until(lambda: not pid_alive(reaper_pid), 5.0)
    new = {n for n in set(os.listdir("/dev/shm")) - before if iid in n}
    assert not new


MAPPER = textwrap.dedent("""\
    import mmap, sys, time
    with open(sys.argv[1], "r+b") as f:
        m = mmap.mmap(f.fileno(), 4096)
    print("mapped", flush=True)
    time.sleep(60)
""")


def test_reaper_removes_a_starting_game_whose_engine_outlives_the_owner(tmp_path):
    """An init under way when the owner dies: its game's segments may still be
    mapped at EOF (an engine not yet killed by its parent-death signal). The
    reaper must look again once that process is gone, and never take a game
    another process still maps or one older than the init."""
    def segments(iid, age=0.0):
        for name in shm_names(iid):
            path = tmp_path / name
            path.write_bytes(b"\0" * 4096)
            os.utime(path, (time.time() - age, time.time() - age))

    def mapper(iid):
        proc = subprocess.Popen([sys.executable, "-c", MAPPER, str(tmp_path / f"ViZDoomSM{iid}")],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "mapped"
        return proc

    reaper = subprocess.Popen([sys.executable, "-I", "-S", os.path.join(REPO, "envs", "doom", "_reaper.py"),
                               str(os.getpid()), str(tmp_path)], stdin=subprocess.PIPE)
    segments("OlderGame1", age=60)   # unmapped, from before the init: not the init's
    reaper.stdin.write(b"+Registerd1 999999999\n?\n")  # a registered game (engine gone), then an init
    reaper.stdin.flush()
    time.sleep(0.1)
    segments("Registerd1")
    segments("StartingG1")            # the init's game, its engine still alive at EOF
    segments("OtherOwnr1")            # another owner's live game
    starting, other = mapper("StartingG1"), mapper("OtherOwnr1")
    try:
        reaper.stdin.close()          # the owner is gone
        time.sleep(0.3)
        starting.kill()               # the engine dies after the reaper's first look
        starting.wait()
        reaper.wait(timeout=15)
        left = set(os.listdir(tmp_path))
        assert not left & set(shm_names("StartingG1")), "the starting game's segments were kept"
        assert not left & set(shm_names("Registerd1"))
        assert set(shm_names("OtherOwnr1")) <= left and set(shm_names("OlderGame1")) <= left
    finally:
        for proc in (starting, other, reaper):
            if proc.poll() is None:
                proc.kill()


def test_close_leaves_nothing_and_is_idempotent():
    env = make("doom_basic")
    env.reset()
    pid, iid = env.engine_pid, env.instance_id
    env.close()
    assert not pid_alive(pid) and not leftovers(iid)
    env.close()
    with pytest.raises(RuntimeError):
        env.reset()


def test_close_with_a_stopped_engine_does_not_hang():
    env = make("doom_basic")
    env.reset()
    pid, iid = env.engine_pid, env.instance_id
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    env.close()
    assert time.monotonic() - t0 < 3.0
    assert_gone(pid, iid, timeout=2.0)


def test_parent_death_signal_alone_kills_the_engine():
    """With the reaper gone too, the kernel still ends the engine with its owner."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    assert engine.engine_launcher_path() is not None, "the launcher failed its self-test"
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(repo=REPO, foreign_handler=False)],
                             stdout=subprocess.PIPE, text=True)
    try:
        engine_pid, iid, reaper_pid = child.stdout.readline().split()
        engine_pid, reaper_pid = int(engine_pid), int(reaper_pid)
        with open(f"/proc/{engine_pid}/status") as f:
            assert "Name:\tvizdoom" in f.read()  # the launcher exec'd the engine: same process
        os.kill(reaper_pid, signal.SIGKILL)
        assert wait_until(lambda: not pid_alive(reaper_pid), 2.0)
        child.kill()
        child.wait(timeout=10)
        assert wait_until(lambda: not pid_alive(engine_pid), 2.0)
    finally:
        if child.poll() is None:
            child.kill()
        for name in shm_names(iid):  # without a reaper nobody unlinks them: expected here
            try:
                os.unlink(os.path.join("/dev/shm", name))
            except OSError:
                pass


def test_cleanup_stale_doom_shm(tmp_path):
    def segment(iid, age):
        for name in shm_names(iid):
            path = tmp_path / name
            path.write_bytes(b"\0" * 4096)
            os.utime(path, (time.time() - age, time.time() - age))

    segment("StaleOld01", age=60)    # nobody maps it, old: removed
    segment("FreshNew01", age=0)     # may be a game being created: kept
    segment("MappedOld1", age=60)    # a live process maps it: kept
    (tmp_path / "unrelated.bin").write_bytes(b"x")
    with open(tmp_path / "ViZDoomSMMappedOld1", "r+b") as f:
        mapping = mmap.mmap(f.fileno(), 4096)
        try:
            removed = cleanup_stale_doom_shm(grace_s=10.0, shm_dir=str(tmp_path))
        finally:
            mapping.close()
    assert sorted(removed) == sorted(shm_names("StaleOld01"))
    left = set(os.listdir(tmp_path))
    assert set(shm_names("FreshNew01")) <= left and set(shm_names("MappedOld1")) <= left
    assert "unrelated.bin" in left
