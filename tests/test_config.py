"""The command line and the checks that refuse impossible configurations."""
import dataclasses
import os

import gymnasium
import numpy as np
import pytest
import torch

from fastrl.config import Config, ConfigError, build_parser, parse_args, validate
from fastrl.presets import preset_for_spaces


def test_every_field_has_help_and_a_flag():
    parser = build_parser()
    flags = {a.dest: a for a in parser._actions}
    for f in dataclasses.fields(Config):
        assert f.metadata["help"], f.name
        # An option --help leaves out keeps its text for --help_all.
        text = getattr(flags.get(f.name), "full_help", None) or flags[f.name].help
        assert text.replace("%%", "%") == f.metadata["help"]


def test_help_all_prints_every_option_as_a_user_runs_it():
    # argparse %-formats help texts: one literal "%" in a field's help broke --help outright
    # (build_parser doubles it; the reasons with percentages now live in docs/options.md).
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "fastrl.train", "--help_all"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for f in dataclasses.fields(Config):
        assert f"--{f.name}" in text


def test_parse_values_and_bool_forms():
    cfg, _ = parse_args(["--env", "CartPole-v1", "--num_workers", "3", "--lr", "0.001", "--use_rnn",
                         "--normalize_advantages", "false", "--stop_at_reward", "195"])
    assert (cfg.env, cfg.num_workers, cfg.lr, cfg.use_rnn, cfg.normalize_advantages, cfg.stop_at_reward) == \
        ("CartPole-v1", 3, 0.001, True, False, 195.0)
    assert cfg.experiment_dir == os.path.join("train_dir", "CartPole-v1")


def test_unknown_option_suggests_the_closest(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--env", "CartPole-v1", "--num_worker", "2"])
    assert exc.value.code == 2
    assert "Did you mean --num_workers?" in capsys.readouterr().err


@pytest.mark.parametrize("change, words", [
    ({"env": ""}, "--env"),
    ({"num_workers": 0}, "--num_workers is 0"),
    ({"num_envs_per_worker": -2}, "--num_envs_per_worker is -2"),
    ({"rollout": 32, "num_envs_per_worker": 16, "batch_size": 1000}, "use 512 or 1024"),
    ({"inference": "policy_worker", "num_envs_per_worker": 7}, "must be even"),
    ({"num_buffers": 1}, "can never fill a batch"),
    ({"max_batches_ahead": -2}, "--max_batches_ahead is -2"),
    ({"compile_learner": "on", "minibatch_split": "samples"}, "--minibatch_split samples does not use"),
    ({"hidden_sizes": "64,x"}, "--hidden_sizes"),
    ({"gamma": 1.5}, "--gamma"),
    ({"worker_nice": 20}, "--worker_nice is 20"),
    ({"worker_nice": -1}, "--worker_nice is -1"),
    ({"lr": float("nan")}, "--lr is nan but must be a finite number"),
    ({"stop_at_reward": float("inf")}, "--stop_at_reward is inf but must be a finite number"),
    ({"seed": -1}, "--seed is -1 but must lie in [0, 2147483647]"),
    ({"seed": 2**31}, "--seed is 2147483648"),
    ({"dist_timeout_seconds": 0.0}, "--dist_timeout_seconds is 0.0 but must be positive"),
    ({"dist_backend": "nccl", "device": "cpu"}, "--dist_backend nccl all-reduces CUDA tensors"),
])
def test_impossible_configs_are_refused_with_a_sentence(tmp_path, change, words):
    cfg = dataclasses.replace(Config(env="CartPole-v1", train_dir=str(tmp_path)), **change)
    with pytest.raises(ConfigError) as exc:
        validate(cfg)
    assert words in str(exc.value)


def test_unwritable_train_dir_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root ignores permissions)")
        with pytest.raises(ConfigError, match="cannot be written"):
            validate(Config(env="CartPole-v1", train_dir=str(locked / "runs")))
    finally:
        locked.chmod(0o700)


def test_unwritable_train_dir_under_a_file_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ConfigError, match="cannot be written"):
        validate(Config(env="CartPole-v1", train_dir=str(blocker / "runs")))


def test_a_rank_that_writes_nothing_leaves_the_experiment_folder_untried(tmp_path):
    # A torchrun rank other than 0: rank 0 makes the folder at the same moment.
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    validate(Config(env="CartPole-v1", train_dir=str(blocker / "runs")), writes=False)


def test_defaults_are_valid(tmp_path):
    validate(Config(env="CartPole-v1", train_dir=str(tmp_path)))


def test_env_presets_replace_defaults_but_never_explicit_options():
    cfg, extra = parse_args(["--env", "doom_battle", "--lr", "3e-4", "--use_rnn", "false"])
    assert (cfg.lr, cfg.use_rnn) == (3e-4, False)  # given by the user
    assert (cfg.separate_critic, cfg.num_workers, cfg.ppo_epochs) == (False, 2, 1)  # from the Doom preset
    assert extra.explicit == {"env", "lr", "use_rnn"}
    plain, _ = parse_args(["--env", "CartPole-v1"])
    assert (plain.separate_critic, plain.lr) == (True, 2e-3)


def test_vector_observations_and_continuous_actions_bring_their_defaults_unless_the_name_presets_set_them():
    box = gymnasium.spaces.Box(-2.0, 2.0, (1,))
    vector, image = gymnasium.spaces.Box(-1.0, 1.0, (4,)), gymnasium.spaces.Box(0, 255, (3, 36, 36), "uint8")
    assert preset_for_spaces("Pendulum-v1", vector, box) == {
        "lr": 1e-3, "target_kl": 0.01, "vtrace_lambda": 0.95,
        "normalize_obs": True, "log_std_init": -1.0, "minibatch_split": "samples",  # continuous control
        "eval_every_frames": 250_000, "eval_episodes": 10}  # and its evaluator, keeping the best policy
    walker = preset_for_spaces("Walker2d-v5", gymnasium.spaces.Box(-np.inf, np.inf, (17,)), box)
    assert walker == {**preset_for_spaces("Pendulum-v1", vector, box), "lr": 3e-4, "ppo_epochs": 4}  # locomotion
    hopper = preset_for_spaces("Hopper-v5", gymnasium.spaces.Box(-np.inf, np.inf, (11,)), box, budgeted=True)
    assert hopper == walker  # PPO's regime is Walker2d's alone
    assert preset_for_spaces("CartPole-v1", vector, gymnasium.spaces.Discrete(2)) == {"vtrace_lambda": 0.95}
    assert preset_for_spaces("ReactImage-v0", image, gymnasium.spaces.Discrete(2)) == {}  # images keep lambda 1
    assert preset_for_spaces("CarRace-v0", image, box) == {"lr": 1e-3, "target_kl": 0.01}  # pixels: no normaliser
    assert preset_for_spaces("doom_basic", image, box) == {}  # tuned as a whole: its own lr and lambda stand
    assert preset_for_spaces("atari_breakout", image, box) == {}


def test_the_locomotion_preset_knows_gymnasiums_own_tasks_by_name_and_origin():
    from fastrl.presets import is_locomotion_task

    assert all(is_locomotion_task(name) for name in ("Hopper-v5", "Walker2d-v4", "Ant-v5", "Humanoid-v5"))
    # HalfCheetah learned slower with it, MuJoCo's other tasks were not measured with it, and an
    # unregistered name is no task of gymnasium's.
    assert not any(is_locomotion_task(name) for name in ("HalfCheetah-v5", "HumanoidStandup-v5", "InvertedPendulum-v5",
                                                         "Reacher-v5", "Pendulum-v1", "Hopper-v99", "doom_basic"))
    gymnasium.register("Ant-v98", entry_point="my_robots.ant:AntEnv")  # a user's own, under the same name
    try:
        assert not is_locomotion_task("Ant-v98")
    finally:
        del gymnasium.envs.registry["Ant-v98"]


def test_walker2d_with_a_budget_takes_ppos_regime_and_keeps_the_defaults_without_one(tmp_path):
    pytest.importorskip("mujoco", reason='MuJoCo is not installed: pip install "gymnasium[mujoco]"')
    from fastrl.runtime.runner import prepare_experiment

    def prepared(**options):  # as a user gives them on the command line
        cfg = Config(env="Walker2d-v5", train_dir=str(tmp_path), plan="off", **options)
        return prepare_experiment(cfg, {"env", *options}).cfg

    regime = ("max_batches_ahead", "ppo_epochs", "num_minibatches", "target_kl", "lr_schedule", "lr")
    budgeted = prepared(train_for_env_frames=1_000_000)
    assert tuple(getattr(budgeted, k) for k in regime) == (0, 10, 16, 0.02, "linear", 3e-4)
    timed = prepared(train_for_seconds=600.0, experiment="timed")
    assert tuple(getattr(timed, k) for k in regime) == (0, 10, 16, 0.02, "linear", 3e-4)
    unbounded = prepared(experiment="unbounded")  # the annealed rate needs a budget: the defaults stand
    assert tuple(getattr(unbounded, k) for k in regime) == (-1, 4, 4, 0.01, "constant", 3e-4)
    given = prepared(train_for_env_frames=1_000_000, ppo_epochs=4, experiment="given")
    assert (given.ppo_epochs, given.lr_schedule) == (4, "linear")  # the user's option wins over the regime's


def test_under_torchrun_a_time_budget_brings_no_annealed_rate():
    pytest.importorskip("mujoco", reason='MuJoCo is not installed: pip install "gymnasium[mujoco]"')
    from fastrl.plumbing.ranks import Rank
    from fastrl.runtime.runner import _spaces_presets

    env = gymnasium.make("Walker2d-v5")
    two_ranks = Rank(world_size=2, local_world_size=2)
    for budget, schedule in (({"train_for_seconds": 600.0}, "constant"),  # each rank's clock is its own
                             ({"train_for_env_frames": 1_000_000}, "linear")):
        cfg = Config(env="Walker2d-v5", **budget)
        assert _spaces_presets(cfg, env.observation_space, env.action_space, {"env", *budget}, {},
                               two_ranks).lr_schedule == schedule
    env.close()


def test_a_fresh_models_normaliser_starts_from_the_envs_own_observations(tmp_path):
    from fastrl.envs.registry import get_spec

    from fastrl.runtime.runner import NORMALIZER_SEED_STEPS, first_observations, prepare_experiment

    cfg = Config(env="CartPole-v1", train_dir=str(tmp_path), plan="off", normalize_obs=True, num_policies=2)
    models = prepare_experiment(cfg, {"normalize_obs"}).models
    # The same frames again, from an env made as the runner made its own.
    seen = first_observations(get_spec("CartPole-v1").make(seed=cfg.seed), NORMALIZER_SEED_STEPS)["obs"].double()
    for model in models:  # every policy's, and the actor's encoder and the critic's alike
        for encoder in [*model.encoders, *model.critic_encoders]:
            assert encoder.norm.count.item() == NORMALIZER_SEED_STEPS
            torch.testing.assert_close(encoder.norm.mean, seen.mean(0).float())
            torch.testing.assert_close(encoder.norm.var, seen.var(0, unbiased=False).float())


def test_the_action_space_preset_is_applied_once_the_env_is_made_and_never_over_the_user(tmp_path):
    from fastrl.runtime.runner import prepare_experiment

    cfg = Config(env="Pendulum-v1", train_dir=str(tmp_path), plan="off")
    prepared = prepare_experiment(cfg, set()).cfg
    assert (prepared.lr, prepared.target_kl) == (1e-3, 0.01)
    given = Config(env="Pendulum-v1", train_dir=str(tmp_path), plan="off", lr=3e-4)
    assert prepare_experiment(given, {"lr"}).cfg.lr == 3e-4  # --lr 3e-4 given: kept
    discrete = Config(env="CartPole-v1", train_dir=str(tmp_path), plan="off")
    assert prepare_experiment(discrete, set()).cfg.lr == 2e-3
    # CartPole's observation is a vector, as the env made it: the spaces' preset reaches it.
    assert prepare_experiment(discrete, set()).cfg.vtrace_lambda == 0.95
    assert prepare_experiment(discrete, {"vtrace_lambda"}).cfg.vtrace_lambda == 1.0  # given: kept


def test_each_value_off_its_default_names_where_it_came_from(tmp_path):
    import json

    from fastrl.config import config_from_saved, describe_origins, save_config
    from fastrl.runtime.runner import prepare_experiment

    cfg = Config(env="Pendulum-v1", train_dir=str(tmp_path), lr=3e-4, seed=3)
    prepared = prepare_experiment(cfg, {"env", "train_dir", "lr", "seed"})
    origins = prepared.origins
    assert {k: origins[k] for k in ("lr", "seed", "target_kl", "vtrace_lambda")} == {
        "lr": "given", "seed": "given", "target_kl": "spaces preset", "vtrace_lambda": "spaces preset"}
    planned = {k for k, v in origins.items() if v == "plan"}
    assert planned and all(getattr(prepared.cfg, k) != getattr(Config(), k) for k in planned)
    line = describe_origins(prepared.cfg, origins)
    assert "given: lr=0.0003, seed=3" in line and \
        "spaces preset: eval_episodes=10, eval_every_frames=250000, log_std_init=-1.0, minibatch_split=samples, " \
        "normalize_obs=True, target_kl=0.01, vtrace_lambda=0.95" in line
    # config.json keeps them beside the options, and reading it back takes the options alone.
    path = tmp_path / "config.json"
    save_config(prepared.cfg, str(path), origins)
    assert json.loads(path.read_text())["origins"] == origins
    assert config_from_saved(json.loads(path.read_text())) == prepared.cfg


@pytest.mark.parametrize("inference", ["local", "policy_worker"])
def test_max_batches_ahead_sizes_the_pool_for_its_bound(tmp_path, inference):
    base = Config(env="CartPole-v1", train_dir=str(tmp_path), num_workers=3, num_envs_per_worker=8, rollout=16,
                  batch_size=512, inference=inference)
    held_by_other_splits = 3 * (base.num_splits - 1)  # a worker waiting for a buffer holds its other splits' ones
    assert not base.frees_after_training
    for ahead in (0, 1, 2):
        cfg = dataclasses.replace(base, max_batches_ahead=ahead)
        assert cfg.frees_after_training
        assert cfg.total_buffers == held_by_other_splits + (ahead + 1) * cfg.buffers_per_batch
        validate(cfg)
    # The least pool that cannot wedge: enough when the learner frees after training,
    # one buffer per worker short when it frees at once (it may hold a batch's worth).
    least = dataclasses.replace(base, max_batches_ahead=0, num_buffers=held_by_other_splits + base.buffers_per_batch)
    validate(least)
    with pytest.raises(ConfigError, match="can never fill a batch"):
        validate(dataclasses.replace(least, max_batches_ahead=-1))
