"""--precision auto: bf16 for a role only where this machine computes it faster,
measured once per machine and model in the runner's process (with --plan off
too), and each choice reaches the processes that build the models; fp32 without
measuring where bf16 cannot pay."""
import json
import os
import types

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import make_experiment

from fastrl import enjoy
from fastrl.algo.model import Precision, build_model, flat_state, flat_state_size, native_bf16
from fastrl.config import Config, config_from_saved
from fastrl.learning.learner import Learner
from fastrl.plumbing.params import SharedParams
from fastrl.plumbing.stats_board import StatsBoard
from fastrl.sampling.inference import PolicyCopy
from fastrl.tuning import precision
from fastrl.tuning.precision import bf16_ratios, resolve_precision
from fastrl.tuning.profiling import FORWARD_BATCHES

IMAGE = gym.spaces.Box(0, 255, (3, 36, 36), np.uint8)  # the smallest frame the conv encoder takes
VECTOR = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACTIONS = gym.spaces.Discrete(3)
REACT = "react_env:ReactImage-v0"  # tests/react_env.py: 36x36 images, 2 actions


def cfg(**options) -> Config:
    return Config(**{"env": "CartPole-v1", "device": "cpu", "hidden_sizes": "16", "rollout": 4, **options})


def timings(acting: float, learning: float) -> dict:
    """A measurement in which bf16 takes `acting` and `learning` times fp32's time."""
    return {"acting": {"fp32": {b: 1e-4 for b in FORWARD_BATCHES}, "bf16": {b: acting * 1e-4 for b in FORWARD_BATCHES}},
            "learning": {"fp32": 1e-3, "bf16": learning * 1e-3}}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty measurement cache of this test's own; returns its folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "fastrl" / "profiles"


def set_native_bf16(monkeypatch, native: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)


def fake_measurement(monkeypatch, acting: float, learning: float) -> list:
    """Replace the timing with one that says `acting` and `learning`; returns the
    list of calls, one entry per measurement."""
    calls = []

    def measure(cfg_, obs_space, action_space, seconds):
        calls.append(obs_space)
        return timings(acting, learning)

    monkeypatch.setattr(precision, "measure_precision", measure)
    return calls


# -- the choice ------------------------------------------------------------------------------

@pytest.mark.parametrize("acting, learning, want", [
    (1.59, 1.41, ("fp32", "fp32")),  # the Intel Xeon with AVX512-BF16 of issue #16
    (0.60, 0.80, ("bf16", "bf16")),
    (0.60, 1.40, ("bf16", "fp32")),  # the roles choose apart
    (1.50, 0.70, ("fp32", "bf16")),
    (0.98, 0.97, ("fp32", "fp32")),  # within the noise: keep the exact arithmetic
])
def test_auto_picks_the_faster_arithmetic_for_each_role(monkeypatch, cache, acting, learning, want):
    set_native_bf16(monkeypatch, True)
    measured = fake_measurement(monkeypatch, acting, learning)
    got = resolve_precision(cfg(), IMAGE, ACTIONS)
    assert (got.acting, got.learning) == want and len(measured) == 1
    assert got.why == f"measured: bf16 takes {acting:.2f}x fp32's time acting, {learning:.2f}x learning"
    assert got.describe().startswith("precision: ")


def test_acting_weighs_every_batch_size_alike():
    # bf16 twice as slow at the smallest batch and twice as fast at the largest:
    # neither wins on the geometric mean, whatever the sizes' absolute times.
    mixed = timings(1.0, 1.0)
    mixed["acting"]["bf16"][FORWARD_BATCHES[0]] = 2e-4
    mixed["acting"]["bf16"][FORWARD_BATCHES[-1]] = 0.5e-4
    assert bf16_ratios(mixed)["acting"] == pytest.approx(1.0)


@pytest.mark.parametrize("why, options, native, obs", [
    ("auto: this CPU has no native bf16", {}, False, IMAGE),
    ("auto: bf16 is not measured on GPUs yet", {"device": "cuda"}, True, IMAGE),
    ("no image encoder", {}, True, VECTOR),
])
def test_fp32_without_measuring_where_bf16_cannot_pay(monkeypatch, cache, why, options, native, obs):
    set_native_bf16(monkeypatch, native)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # --device cuda passes; auto stays cpu above

    def never(*args, **kwargs):
        raise AssertionError("measured where nothing should be")

    monkeypatch.setattr(precision, "time_interleaved", never)
    monkeypatch.setattr(precision, "model_calls", never)
    assert resolve_precision(cfg(**options), obs, ACTIONS) == Precision("fp32", "fp32", why)
    assert not cache.exists()


@pytest.mark.parametrize("forced", ["fp32", "bf16"])
def test_a_forced_precision_applies_to_both_roles_without_measuring(monkeypatch, cache, forced):
    set_native_bf16(monkeypatch, True)
    measured = fake_measurement(monkeypatch, 0.5, 2.0)
    got = resolve_precision(cfg(precision=forced), IMAGE, ACTIONS)
    assert got == Precision(forced, forced, f"--precision {forced}")
    assert not measured


def test_the_flag_probe_reads_avx512_bf16_or_amx(monkeypatch):
    set_native_bf16(monkeypatch, False)
    assert not native_bf16()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert native_bf16()
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):  # a torch without them
        monkeypatch.delattr(torch.cpu, probe)
    assert not native_bf16()


# -- the cache -------------------------------------------------------------------------------

def test_a_measurement_is_cached_per_model_and_remeasured_when_unreadable(monkeypatch, cache):
    set_native_bf16(monkeypatch, True)
    measured = fake_measurement(monkeypatch, 0.6, 1.4)
    first = resolve_precision(cfg(), IMAGE, ACTIONS)
    again = resolve_precision(cfg(), IMAGE, ACTIONS)
    assert len(measured) == 1 and (again.acting, again.learning) == (first.acting, first.learning) == ("bf16", "fp32")
    assert again.why.startswith("measured on this machine earlier: ")
    # Another model is another measurement; the cache keeps both.
    resolve_precision(cfg(use_rnn=True), IMAGE, ACTIONS)
    assert len(measured) == 2 and len(os.listdir(cache)) == 2
    for name in os.listdir(cache):
        (cache / name).write_text("{}")
    resolve_precision(cfg(), IMAGE, ACTIONS)
    assert len(measured) == 3


def test_a_real_measurement_here_chooses_and_caches(monkeypatch, cache):
    set_native_bf16(monkeypatch, True)  # a CPU without bf16 emulates it: slower, but it runs
    monkeypatch.setattr(precision, "MEASURE_SECONDS", 0.0)  # the minimum of rounds
    got = resolve_precision(cfg(), IMAGE, ACTIONS)
    assert {got.acting, got.learning} <= {"fp32", "bf16"} and got.why.startswith("measured: ")
    (name,) = os.listdir(cache)
    with open(cache / name) as fh:
        saved = json.load(fh)
    assert set(saved["acting"]["bf16"]) == {str(b) for b in FORWARD_BATCHES}
    assert all(s > 0 for s in (*saved["acting"]["fp32"].values(), *saved["learning"].values()))
    assert resolve_precision(cfg(), IMAGE, ACTIONS)[:2] == got[:2]


# -- where the choice goes -------------------------------------------------------------------

@pytest.mark.parametrize("acting, learning", [("bf16", "fp32"), ("fp32", "bf16")])
def test_actors_and_the_learner_build_their_models_in_their_own_precision(acting, learning):
    config = cfg()
    model = build_model(config, IMAGE, ACTIONS)
    params = SharedParams(flat_state_size(model))
    params.publish(flat_state(model), 0)
    ctx = types.SimpleNamespace(obs_space=IMAGE, action_space=ACTIONS, params=params,
                                board=StatsBoard(["learner", "policy_0"]),
                                precision=Precision(acting, learning, "test"))
    actor = PolicyCopy(config, ctx, ctx.board.row("policy_0")).model
    learner = Learner(config, ctx, "cpu", None, 0).model
    assert actor.conv_bf16 is (acting == "bf16") and actor.encoders[0].bf16 is (acting == "bf16")
    assert learner.conv_bf16 is (learning == "bf16") and learner.encoders[0].bf16 is (learning == "bf16")


def react_experiment(train_dir: str) -> Config:
    """A saved image experiment whose config says precision auto, planned off."""
    return make_experiment(train_dir, "react", REACT, precision="auto", plan="off", device="cpu", hidden_sizes="16",
                           num_envs_per_worker=4, rollout=8, batch_size=32, num_minibatches=1)


def test_a_resumed_run_with_plan_off_measures_once_and_gives_its_children_the_choice(tmp_path, monkeypatch, cache):
    from fastrl.runtime import runner

    set_native_bf16(monkeypatch, True)
    measured = fake_measurement(monkeypatch, 0.6, 1.4)
    monkeypatch.setattr(runner, "start_process_server", lambda: None)  # no child is started here
    saved = react_experiment(str(tmp_path / "train"))
    run = runner.Runner(saved)
    assert run.resume_path and len(measured) == 1
    assert run.ctx.precision[:2] == ("bf16", "fp32")  # what every child builds its model from
    with open(os.path.join(saved.experiment_dir, "config.json")) as fh:
        assert json.load(fh)["precision"] == "auto"  # decided again where it resumes


def test_enjoy_decides_a_saved_auto_on_this_machine(tmp_path, monkeypatch, cache):
    set_native_bf16(monkeypatch, True)
    fake_measurement(monkeypatch, 0.6, 1.4)
    saved = react_experiment(str(tmp_path / "train"))
    assert config_from_saved(saved.to_dict()).precision == "auto"
    played = []
    original = enjoy.play_episode

    def play(env, model, *args):
        played.append(model.conv_bf16)
        return original(env, model, *args)

    monkeypatch.setattr(enjoy, "play_episode", play)
    assert enjoy.main(["--env", REACT, "--experiment", "react", "--train_dir", saved.train_dir, "--episodes", "1"]) == 0
    assert played == [True]  # the acting choice
