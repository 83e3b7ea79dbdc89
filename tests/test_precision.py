"""--precision auto: bf16 for a role only where this machine computes it faster,
measured once per machine and model in the runner's process (with --plan off
too), and each choice reaches the processes that build the models; fp32 without
measuring where bf16 cannot pay."""
import json
import math
import os
import types

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import count_timed_calls, make_experiment

from fastrl import enjoy
from fastrl.algo.model import Precision, build_model, flat_state, flat_state_size, native_bf16
from fastrl.config import Config, config_from_saved
from fastrl.learning.learner import Learner
from fastrl.plumbing import machine_load
from fastrl.plumbing.params import SharedParams
from fastrl.plumbing.stats_board import StatsBoard
from fastrl.sampling.inference import PolicyCopy
from fastrl.tuning import precision
from fastrl.tuning.precision import bf16_ratios, decide_precision, resolve_precision
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


def always_cached(monkeypatch) -> None:
    """No wall-clock cap on the start-up's measurements and no verdict of a busy
    machine: a test run niced on a busy machine may get a few percent of a core, a
    full suite's other work (the kernel's writeback included) may take a core beside
    it, and a measurement that hit its cap or was disturbed is not cached, which is
    not what these tests are about."""
    from fastrl.runtime import runner

    monkeypatch.setattr(precision, "MEASURE_CAP_S", math.inf)
    monkeypatch.setattr(runner, "PROFILE_CAP_S", math.inf)
    monkeypatch.setattr(machine_load, "disturbed_since", lambda before: False)


def fake_measurement(monkeypatch, acting: float, learning: float, capped: bool = False) -> list:
    """Replace the timing with one that says `acting` and `learning` (and that it
    hit its cap, a busy machine's, if `capped`); returns the list of calls, one
    entry per measurement."""
    calls = []

    def measure(cfg_, obs_space, action_space, seconds, cap_s, device="cpu"):
        calls.append((obs_space, device))
        return timings(acting, learning), capped

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


@pytest.mark.parametrize("acting, learning, chosen", [(1.07, 1.09, ("fp32", "fp32")), (0.5, 0.6, ("bf16", "bf16"))])
def test_on_a_gpu_auto_times_both_on_the_gpu_whatever_the_cpu(monkeypatch, cache, acting, learning, chosen):
    # The CPU's bf16 instructions say nothing about the GPU's: it is timed there (the
    # first pair is what an H200 measured for the Doom model), cached apart from the
    # CPU's timings, and the profile times the CPU's own costs (no one-thread costs).
    set_native_bf16(monkeypatch, False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "a GPU")  # (the cache key names it)
    calls = fake_measurement(monkeypatch, acting, learning)
    for _ in range(2):
        chosen_now, one_thread = precision.decide_precision(cfg(device="cuda"), IMAGE, ACTIONS)
        assert (chosen_now.acting, chosen_now.learning) == chosen and "on the GPU" in chosen_now.why
        assert one_thread is None
    assert [device for _, device in calls] == ["cuda"]  # the second run read the cache
    set_native_bf16(monkeypatch, True)
    precision.decide_precision(cfg(device="cpu"), IMAGE, ACTIONS)
    assert [device for _, device in calls] == ["cuda", "cpu"]


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


def test_the_choice_comes_with_the_models_costs_in_the_chosen_arithmetic_for_the_profile(monkeypatch, cache):
    set_native_bf16(monkeypatch, True)
    fake_measurement(monkeypatch, 0.6, 1.4)  # bf16 acting, fp32 learning
    for how in ("measured", "measured on this machine earlier"):
        chosen, one_thread = decide_precision(cfg(), IMAGE, ACTIONS)
        assert chosen.why.startswith(how + ": ") and not one_thread.capped
        assert one_thread.forward_s == pytest.approx({b: 0.6e-4 for b in FORWARD_BATCHES})
        assert one_thread.train_s == pytest.approx(1e-3)
    assert decide_precision(cfg(precision="fp32"), IMAGE, ACTIONS)[1] is None  # nothing timed: the profile times


def test_a_measurement_that_hit_its_cap_decides_the_run_and_is_not_cached(monkeypatch, cache):
    # The cap is hit on a busy machine, where the ratios are the load's as much as
    # the CPU's (acting once read 1.00x where a quiet minute reads 0.78x).
    set_native_bf16(monkeypatch, True)
    measured = fake_measurement(monkeypatch, 0.6, 1.4, capped=True)
    chosen, one_thread = decide_precision(cfg(), IMAGE, ACTIONS)
    assert (chosen.acting, chosen.learning) == ("bf16", "fp32") and one_thread.capped
    assert chosen.why.startswith("measured on a busy machine, not cached: ")
    assert not cache.exists()
    decide_precision(cfg(), IMAGE, ACTIONS)
    assert len(measured) == 2


def test_a_real_measurement_past_its_cap_still_times_every_call(monkeypatch, cache):
    # A cap of 0 s: a machine so busy that the measurement overruns it at once.
    set_native_bf16(monkeypatch, True)
    monkeypatch.setattr(precision, "MEASURE_CAP_S", 0.0)
    chosen, one_thread = decide_precision(cfg(), IMAGE, ACTIONS)
    assert one_thread.capped and "busy machine" in chosen.why and not cache.exists()
    assert set(one_thread.forward_s) == set(FORWARD_BATCHES) and one_thread.train_s > 0


def test_a_real_measurement_here_chooses_and_caches(monkeypatch, cache):
    set_native_bf16(monkeypatch, True)  # a CPU without bf16 emulates it: slower, but it runs
    monkeypatch.setattr(precision, "MEASURE_SECONDS", 0.0)  # the minimum of rounds
    always_cached(monkeypatch)
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
    ctx = types.SimpleNamespace(obs_space=IMAGE, action_space=ACTIONS, params=[params],
                                board=StatsBoard(["learner", "policy_0"]),
                                precision=Precision(acting, learning, "test"))
    actor = PolicyCopy(config, ctx, ctx.board.row("policy_0")).model
    learner = Learner(config, ctx, "cpu").model
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


# -- the planner's profile takes the measurement -----------------------------------------------

def test_a_cold_start_times_each_forward_once_and_either_cache_alone_still_works(tmp_path, monkeypatch, cache):
    # The runner's start-up on an image env, --precision auto and --plan auto, each
    # forward counted: the precision's measurement times them in both arithmetics,
    # and the profile takes the chosen one's and times only the learner, on 1 and 2
    # threads, for the second thread's speed-up.
    from fastrl.plumbing.proc import usable_cores
    from fastrl.runtime import runner
    from fastrl.tuning import profiling

    set_native_bf16(monkeypatch, True)
    monkeypatch.setattr(precision, "MEASURE_SECONDS", 0.0)
    monkeypatch.setattr(runner, "PROFILE_SECONDS", 0.3)
    always_cached(monkeypatch)
    # fp32 whatever the timings say: a choice that changed between two starts would
    # be another profile (the profile's cache is per arithmetic).
    monkeypatch.setattr(precision, "MIN_GAIN", 1.0)
    measurements = {"precision": count_timed_calls(monkeypatch, precision),
                    "profile": count_timed_calls(monkeypatch, profiling)}
    config = Config(env=REACT, experiment="react", train_dir=str(tmp_path / "train"), precision="auto", plan="auto",
                    device="cpu", hidden_sizes="16", num_envs_per_worker=4, rollout=8, batch_size=32, num_minibatches=1)
    learner_timed = {("train", 1, None), ("train", 2, None)} if usable_cores() >= 2 else None

    def start() -> dict:
        """{measurement: the keys it timed}, of one start-up's measurements."""
        for made in measurements.values():
            made.clear()
        assert runner.prepare_experiment(config, set()).plan is not None  # a plan
        assert all(len(made) <= 1 for made in measurements.values())
        return {name: set(made[0]) for name, made in measurements.items() if made}

    def forget(kind: str) -> None:  # delete one cache's file: "precision" or "profile"
        for name in os.listdir(cache):
            with open(cache / name) as fh:
                if ("env_s" in json.load(fh)) == (kind == "profile"):
                    os.remove(cache / name)

    cold = start()
    assert cold["precision"] == {(role, p, b) for p in ("fp32", "bf16")
                                 for role, b in [("learning", None), *(("acting", b) for b in FORWARD_BATCHES)]}
    assert cold.get("profile") == learner_timed
    assert len(os.listdir(cache)) == 2
    assert start() == {}  # both cached
    forget("profile")
    assert start() == ({"profile": learner_timed} if learner_timed else {})  # the cached precision's timings
    forget("precision")
    assert set(start()) == {"precision"}  # the profile is still cached
