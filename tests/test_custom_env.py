"""Envs users bring (fastrl.envs.register_env): examples/custom_env.py trained and played as a
user runs it, `--env module:name` from the command line, and the sentences for what does not fit."""
import json
import os
import subprocess
import sys

import gymnasium
import pytest
import torch
from fastrl.envs import EnvOptionError, EnvRegistrationError, get_spec, register_env
from helpers import REPO, TrainRun, read_summary

from fastrl.config import ConfigError, check_env_and_options, config_from_saved, env_options, parse_args
from fastrl.learning.checkpoint import checkpoint_dir, load_latest_checkpoint

EXAMPLE = os.path.join(REPO, "examples", "custom_env.py")
TINY = ["--plan", "off", "--num_workers", "1", "--num_envs_per_worker", "8", "--batch_size", "256",
        "--status_every_seconds", "1"]


def _first_layer_inputs(train_dir, experiment: str) -> int:
    """The width of the observation the trained network's first layer takes."""
    return next(t.shape[1] for k, t in _trained_weights(train_dir, experiment).items()
                if k.startswith("encoders.0.") and t.dim() == 2)


def _trained_weights(train_dir, experiment: str) -> dict:
    """The state_dict of the experiment's newest checkpoint."""
    with open(os.path.join(train_dir, experiment, "config.json")) as fh:
        state, _ = load_latest_checkpoint(checkpoint_dir(config_from_saved(json.load(fh))))
    return state["model"]


def _enjoy(args: list, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fastrl.enjoy", *args, "--episodes", "2"], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_the_example_env_trains_with_its_option_and_plays_from_another_folder(tmp_path):
    # The script registers "corridor" at its top level; its workers are forked from a process
    # server that runs the script again, and the option must reach every env they make.
    run = subprocess.run([sys.executable, EXAMPLE, "--train_dir", str(tmp_path), *TINY,
                          "--env_option", "length=10", "--train_for_env_frames", "8000"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = read_summary(tmp_path, "corridor")
    assert summary["env_frames"] >= 8000 and summary["samples_trained"] > 0 and summary["episodes"] > 0
    saved = json.loads((tmp_path / "corridor" / "config.json").read_text())
    # The example's own length=12, then this command line's, which wins; and where the env came from.
    assert saved["env_option"] == "length=12,length=10"
    assert saved["modules"] == EXAMPLE
    assert _first_layer_inputs(tmp_path, "corridor") == 10  # one-hot of 10 cells
    # A saved config's code runs only when named: enjoy says which file to name, and runs nothing.
    refused = _enjoy(["--env", "corridor", "--train_dir", str(tmp_path)], cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"fastrl.enjoy: error: Experiment {tmp_path / 'corridor'} was trained with code of its own ({EXAMPLE}: what "
        "registered its env or model), which fastrl runs only when you name it; if you trust it, pass --modules "
        f"{EXAMPLE} (modules= to fastrl.load_policy)."], refused.stderr
    # Named, fastrl.enjoy in a fresh process, elsewhere, finds the env and makes it with the same
    # option: no episode of a 10-cell corridor is shorter than 9 steps.
    played = _enjoy(["--env", "corridor", "--train_dir", str(tmp_path), "--modules", EXAMPLE], cwd=tmp_path)
    assert played.returncode == 0, played.stdout + played.stderr
    lengths = [int(line.rsplit("length ", 1)[1]) for line in played.stdout.splitlines() if ", length " in line]
    assert len(lengths) == 2 and min(lengths) >= 9, played.stdout


def test_module_name_and_module_factory_train_from_the_command_line(tmp_path):
    # No script of the user's runs here: every process imports examples.custom_env and
    # examples.custom_model from the names, with the repository as the working folder.
    env, model = "examples.custom_env:corridor", "examples.custom_model:build_encoder"
    run = TrainRun(["--env", env, "--model", model, "--env_option", "length=6", "--experiment", "cli",
                    "--train_dir", str(tmp_path), "--train_for_env_frames", "6000", *TINY])
    assert run.wait(timeout=180) == 0, run.output()
    assert read_summary(tmp_path, "cli")["samples_trained"] > 0
    saved = json.loads((tmp_path / "cli" / "config.json").read_text())
    assert (saved["env"], saved["model"], saved["env_option"]) == (env, model, "length=6")
    assert _first_layer_inputs(tmp_path, "cli") == 6
    assert any(key.startswith("encoders.0.net.blocks.") for key in _trained_weights(tmp_path, "cli"))
    # --env names the env's module; the model's must be named too, as it is code the config asks for.
    refused = _enjoy(["--env", env, "--experiment", "cli", "--train_dir", str(tmp_path)], cwd=REPO)
    assert refused.returncode == 2 and "pass --modules examples.custom_model (" in refused.stderr, refused.stderr
    played = _enjoy(["--env", env, "--experiment", "cli", "--train_dir", str(tmp_path),
                     "--modules", "examples.custom_model"], cwd=REPO)
    assert played.returncode == 0, played.stdout + played.stderr


def test_modules_names_the_file_that_registers_the_env_for_every_process(tmp_path):
    # What fastrl.train(cfg) runs: the command line of the run, not the user's script, with --modules
    # leading each process to the file; from a folder where no module of the repository is importable.
    run = subprocess.run([sys.executable, "-m", "fastrl.train", "--modules", EXAMPLE, "--env", "corridor",
                          "--env_option", "length=5", "--train_dir", str(tmp_path), "--train_for_env_frames", "4000",
                          *TINY], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert read_summary(tmp_path, "corridor")["samples_trained"] > 0
    assert _first_layer_inputs(tmp_path, "corridor") == 5


def test_a_bad_env_option_is_refused_in_one_line_before_any_process_starts(tmp_path):
    refused = subprocess.run([sys.executable, "-m", "fastrl.train", "--env", "examples.custom_env:corridor",
                              "--env_option", "lenght=5", "--train_dir", str(tmp_path)],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "fastrl: error: --env_option: examples.custom_env:corridor has no option 'lenght'; it declares length, "
        "slip. Did you mean length?"]
    assert not (tmp_path / "examples.custom_env:corridor").exists()


def _make_square(side: int = 3, loud: bool = False, seed=None):
    """A maker that takes the seed as well as its options."""
    env = gymnasium.make("CartPole-v1")
    env.unwrapped.made_with = (side, loud, seed)
    return env


register_env("test_square", _make_square, options={"side": (3, "Cells on a side."),
                                                   "loud": (False, "Says more.")})


def test_declared_options_are_read_as_their_defaults_type_and_checked(tmp_path):
    cfg, _ = parse_args(["--env", "test_square", "--env_option", "side=5", "--env_option", "loud=yes",
                         "--train_dir", str(tmp_path)])
    spec = check_env_and_options(cfg)
    assert cfg.env_option == "side=5,loud=yes"
    assert spec.read_options({"side": "5", "loud": "yes"}) == {"side": 5, "loud": True}
    # fastrl's own families' options and render_mode are for other envs: a registered env ignores them.
    env = spec.make(seed=7, **env_options(cfg), atari_episodic_life=False, render_mode="rgb_array")
    assert env.unwrapped.made_with == (5, True, 7)
    env.close()
    for given, sentence in [("side=big", "--env_option: side=big is not a whole number, which side takes (default 3)."),
                            ("loud=maybe", "--env_option: loud=maybe is not true or false, which loud takes "
                                           "(default False)."),
                            ("side", "--env_option 'side' must be key=value, like size=7.")]:
        cfg, _ = parse_args(["--env", "test_square", "--env_option", given, "--train_dir", str(tmp_path)])
        with pytest.raises(ConfigError) as refused:
            check_env_and_options(cfg)
        assert str(refused.value) == sentence
    cfg, _ = parse_args(["--env", "CartPole-v1", "--env_option", "side=5", "--train_dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="CartPole-v1 declares no options, so it takes no side=...; drop it."):
        check_env_and_options(cfg)
    with pytest.raises(EnvOptionError, match="test_square has no option 'sides'"):
        get_spec("test_square").make(sides=4)


def test_a_config_file_may_give_the_env_options_as_a_mapping(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("env: test_square\nenv_option: {side: 4, loud: true}\n")
    cfg, _ = parse_args(["--config", str(config), "--train_dir", str(tmp_path)])
    assert cfg.env_option == "side=4,loud=true"
    assert check_env_and_options(cfg).read_options({"side": "4"}) == {"side": 4, "loud": False}


@pytest.mark.parametrize("name, sentence", [
    ("CartPole-v1", "register_env: the env name 'CartPole-v1' is taken (a gymnasium id); choose another name."),
    ("doom_mine", "register_env: the env name 'doom_mine' is taken (a fastrl Doom or Atari name: those prefixes "
                  "belong to fastrl's own envs); choose another name."),
    ("has:colon", "register_env: the name 'has:colon' must be letters, digits, '_', '.' or '-', like my_env or "
                  "MyEnv-v0."),
])
def test_a_name_that_is_taken_or_malformed_gets_one_sentence(name, sentence):
    with pytest.raises(EnvRegistrationError) as refused:
        register_env(name, _make_square)
    assert str(refused.value) == sentence


def test_the_same_module_may_register_again_but_another_may_not():
    register_env("test_square", _make_square, options={"side": (3, "Cells on a side."),
                                                       "loud": (False, "Says more.")})  # a re-import: replaced
    other = {"__name__": "someone_else", "register_env": register_env, "maker": _make_square}
    with pytest.raises(EnvRegistrationError, match="'test_square' is taken \\(already registered by "
                                                   "test_custom_env\\)"):
        exec("register_env('test_square', maker)", other)
    with pytest.raises(EnvRegistrationError, match="must be declared as \\(default, help\\)"):
        register_env("test_other", _make_square, options={"side": 3})
    with pytest.raises(EnvRegistrationError, match="must be a Python identifier other than seed"):
        register_env("test_other", _make_square, options={"seed": (1, "no")})
    with pytest.raises(EnvRegistrationError, match="frameskip=0 must be a whole number >= 1"):
        register_env("test_other", _make_square, frameskip=0)
    with pytest.raises(EnvRegistrationError, match="make_fn takes no parameter 'size', which it declares as an "
                                                   "option; add it to make_fn's parameters."):
        register_env("test_other", _make_square, options={"size": (3, "Cells.")})


def test_a_maker_that_returns_no_env_is_named():
    register_env("test_not_an_env", lambda seed: torch.zeros(1))
    with pytest.raises(TypeError, match="the make_fn of env 'test_not_an_env' returned Tensor, not a gymnasium.Env."):
        get_spec("test_not_an_env").make(seed=0)
