"""The planner's choices on hand-set costs move the right way, and its
predictions agree with the plan it makes."""
import dataclasses
import json
import math
import os

import pytest
from helpers import count_timed_calls

from fastrl.config import Config
from fastrl.plumbing.proc import on_one_core
from fastrl.tuning.planner import (
    LEARNER_LOAD,
    NICE_STEP,
    OUTPACE,
    TIE,
    Costs,
    Layout,
    Plan,
    Workload,
    choose,
    describe,
    predict,
    worker_nice,
)


def cfg(**kw):
    return Config(env="CartPole-v1", **kw)


CHEAP_MODEL = {4: 20e-6, 8: 12e-6, 16: 8e-6, 32: 6e-6, 64: 5e-6, 512: 3e-6}


def env_bound(cores):  # slow env (1 ms a step), cheap model and learner
    return Costs(cores=cores, env_s=1e-3, forward_s=CHEAP_MODEL, train_s={1: 20e-6})


def learner_bound(cores):  # cheap env, a learner that costs 50x the env
    return Costs(cores=cores, env_s=20e-6, forward_s=CHEAP_MODEL, train_s={1: 1e-3, 2: 0.55e-3})


@pytest.mark.parametrize("cores", [2, 32])
def test_more_workers_when_env_bound_fewer_when_learner_bound(cores):
    env_plan = choose(env_bound(cores), cfg(), explicit=set())
    learner_plan = choose(learner_bound(cores), cfg(), explicit=set())
    assert env_plan.num_workers > learner_plan.num_workers
    assert learner_plan.num_workers == 1
    assert learner_plan.predicted["bottleneck"] == "learner"
    if cores == 32:  # with cores to spare, an env-bound run spreads over many of them
        assert env_plan.num_workers >= 16
        assert env_plan.predicted["bottleneck"] in ("env", "learner")


def test_a_learner_bound_run_gives_the_learner_the_spare_core():
    plan = choose(learner_bound(2), cfg(), explicit=set())
    assert plan.learner_threads == 2
    one = predict(learner_bound(2), Layout(1, plan.num_envs_per_worker, "local", 1, 1), Workload(2, 32, 1024))
    assert plan.predicted["trained_steps_per_s"] > one["trained_steps_per_s"]


# doom_battle on a 2-core Intel Xeon: the cached profile that planned its 2-thread
# learner (the second thread 2.4x faster on quiet cores).
XEON_DOOM = Costs(cores=2, env_s=731e-6, forward_s={8: 683e-6, 16: 437e-6, 32: 361e-6, 64: 306e-6},
                  train_s={1: 947e-6, 2: 390e-6})


def test_a_second_learner_thread_needs_a_core_the_actors_leave_idle():
    # The model ranks a 2-thread learner ahead beside two workers that keep a core
    # busy; it trained 0.65-0.69x of a 1-thread one there, so it is not offered.
    doom = cfg(rollout=32, batch_size=1024, ppo_epochs=1)
    two = predict(XEON_DOOM, Layout(2, 32, "local", 1, 2), Workload(1, 32, 1024))
    one = predict(XEON_DOOM, Layout(2, 32, "local", 1, 1), Workload(1, 32, 1024))
    assert two["trained_steps_per_s"] > 1.03 * one["trained_steps_per_s"]
    actors_busy = one["trained_steps_per_s"] * (XEON_DOOM.env_s + XEON_DOOM.forward_s[32])
    assert actors_busy > 1.0
    plan = choose(XEON_DOOM, doom, explicit=set())
    assert plan.learner_threads == 1 and plan.worker_nice > 0
    # Asked for by the user, it is what the run gets.
    asked = choose(XEON_DOOM, dataclasses.replace(doom, learner_threads=2), explicit={"learner_threads"})
    assert asked.learner_threads == 2
    # Where sampling and learning take turns (Atari's preset), the workers wait while
    # the learner trains: its threads have the cores, and the faster step is planned.
    turns = choose(XEON_DOOM, dataclasses.replace(doom, max_batches_ahead=0), explicit=set())
    assert turns.learner_threads == 2 and turns.predicted["schedule"] == "turns"


def test_local_inference_when_the_model_is_cheap_and_cores_are_few():
    plan = choose(Costs(cores=2, env_s=30e-6, forward_s=CHEAP_MODEL, train_s={1: 15e-6}), cfg(), explicit=set())
    assert plan.inference == "local"


def test_policy_workers_when_inference_is_expensive_and_cores_many():
    # A forward that costs 2 ms at a batch of 4 but 0.05 ms per sample at 512:
    # only batching across many workers makes it affordable.
    costly = {4: 2e-3, 8: 1e-3, 16: 5e-4, 32: 2.5e-4, 64: 1.3e-4, 512: 5e-5}
    plan = choose(Costs(cores=32, env_s=1e-3, forward_s=costly, train_s={1: 5e-5}), cfg(max_policy_lag=100),
                  explicit=set())
    assert plan.inference == "policy_worker"


# doom_battle's costs as a 16-core H200 machine measured them (gpu_check.sh's bench):
# an env step of 435 us a core, a CPU forward of 110-143 us a sample, the learner's
# GPU step 28 us a sample, a GPU forward 60 us a sample at 16 and 1.5 us at 1,024.
H200_DOOM = Costs(cores=16, env_s=435e-6, forward_s={16: 143e-6, 128: 110e-6}, train_s={1: 28e-6}, gpu=True,
                  device_forward_s={16: 60e-6, 64: 16e-6, 256: 5e-6, 1024: 1.5e-6})


def test_on_a_gpu_the_learner_and_policy_workers_are_costed_at_the_gpus_time():
    # Read as CPU costs, a 1-ms learner holds the run to a few workers; on the GPU it
    # keeps up with nearly every core stepping envs, and their forwards go to a GPU
    # policy worker rather than cost a third more per step.
    gpu = H200_DOOM
    doom = cfg(max_policy_lag=100, ppo_epochs=1)
    plan = choose(gpu, doom, explicit=set())
    assert plan.inference == "policy_worker" and plan.num_workers >= 12 and plan.learner_threads == 1
    as_cpu = choose(dataclasses.replace(gpu, gpu=False, train_s={1: 1e-3}), doom, explicit=set())
    assert as_cpu.num_workers <= 4
    assert plan.predicted["trained_steps_per_s"] > 10 * as_cpu.predicted["trained_steps_per_s"]


def test_one_gpu_runs_every_policy_workers_forward_and_the_learners_steps_in_turn():
    # Four policy workers at 12 x 8 each batch a quarter of the requests (a split of 4
    # envs from every worker: 12 samples), and their forwards queue on the one GPU
    # with the learner's steps: an H200 ran that layout at 60k env frames/s and one
    # policy worker at 15 x 32 at 93k, where the model,
    # as if each policy worker had a GPU of its own, had predicted 152k and 73k.
    four = predict(H200_DOOM, Layout(12, 8, "policy_worker", 4, 1), Workload(1, 32, 1024))
    one = predict(H200_DOOM, Layout(15, 32, "policy_worker", 1, 1), Workload(1, 32, 1024))
    assert four["bottleneck"] == "gpu"
    plan = Plan(12, 8, "policy_worker", 4, 1, 16, predicted=four)
    assert f"GPU {four['gpu_steps_per_s'] * 4:,.0f}; gpu-bound)" in describe(plan, 4)
    assert four["trained_steps_per_s"] == pytest.approx(1 / (60e-6 + 28e-6))  # forward(12) held at forward(16)'s
    assert one["trained_steps_per_s"] > four["trained_steps_per_s"]
    # A GPU policy worker sleeps while its forward runs: only its round trip takes a core.
    assert one["cores_steps_per_s"] == pytest.approx(16 / (435e-6 + H200_DOOM.comm_s + 28e-6))
    # Local actors leave the GPU to the learner: its bound is the learner's own.
    local = predict(H200_DOOM, Layout(8, 16, "local", 1, 1), Workload(1, 32, 1024))
    assert local["gpu_steps_per_s"] == pytest.approx(local["consumption_steps_per_s"])
    assert local["bottleneck"] != "gpu"


def test_policy_workers_share_the_requests_so_each_batches_a_part_of_them():
    # 8 workers x 16 envs send a split of 8 envs each: 64 samples a round, 32 for
    # each of two policy workers, each at forward(32)'s cost.
    costs = Costs(cores=32, env_s=1e-6, forward_s={8: 4e-4, 16: 2e-4, 32: 1e-4, 64: 5e-5}, train_s={1: 1e-6},
                  comm_s=0.0)
    two = predict(costs, Layout(8, 16, "policy_worker", 2, 1), Workload(1, 32, 1024))
    one = predict(costs, Layout(8, 16, "policy_worker", 1, 1), Workload(1, 32, 1024))
    assert two["production_steps_per_s"] == pytest.approx(2 / 1e-4)
    assert one["production_steps_per_s"] == pytest.approx(1 / 5e-5)


def test_a_near_tie_goes_to_actors_that_outpace_the_learner():
    # doom_battle-like costs on 2 cores: one worker of 32 envs is predicted within
    # TIE of two workers, but it would keep the learner waiting for samples.
    costs = Costs(cores=2, env_s=0.9e-3, forward_s={16: 0.32e-3, 32: 0.29e-3}, train_s={1: 1.12e-3, 2: 0.9e-3})
    plan = choose(costs, cfg(rollout=32, batch_size=1024, ppo_epochs=1), explicit=set())
    one = predict(costs, Layout(1, 32, "local", 1, 1), Workload(1, 32, 1024))
    assert one["trained_steps_per_s"] >= (1 - TIE) * plan.predicted["trained_steps_per_s"]
    assert one["production_steps_per_s"] < one["consumption_steps_per_s"]
    assert plan.num_workers == 2
    assert plan.predicted["production_steps_per_s"] > plan.predicted["consumption_steps_per_s"]


def test_actors_only_just_ahead_of_the_learner_do_not_count_as_outpacing_it():
    # doom_battle's costs as a Zen 3 profiled them: one worker x 16 envs would produce
    # 7% more than the learner consumes, and is predicted to train as fast as two
    # workers; it measured 15-19% slower.
    zen3 = Costs(cores=2, env_s=0.708e-3, forward_s={16: 0.613e-3, 32: 0.515e-3, 64: 0.468e-3},
                 train_s={1: 1.43e-3, 2: 1.38e-3})
    c = cfg(rollout=32, batch_size=1024, ppo_epochs=1)
    one = predict(zen3, Layout(1, 16, "local", 1, 1), Workload(1, 32, 1024))
    assert one["consumption_steps_per_s"] < one["production_steps_per_s"] < OUTPACE * one["consumption_steps_per_s"]
    plan = choose(zen3, c, explicit=set())
    assert one["trained_steps_per_s"] >= (1 - TIE) * plan.predicted["trained_steps_per_s"]
    assert (plan.num_workers, plan.num_envs_per_worker, plan.inference) != (1, 16, "local")
    assert plan.predicted["production_steps_per_s"] >= OUTPACE * plan.predicted["consumption_steps_per_s"]


# LunarLander-v3's costs as a profile on 2 cores measured them (AMD EPYC): a cheap
# learner, envs that cost most of a step.
LUNAR_LIKE = Costs(cores=2, env_s=107e-6, forward_s={16: 35e-6, 32: 19e-6, 64: 10.5e-6}, train_s={1: 29e-6, 2: 28e-6})


def test_a_near_tie_goes_to_fewer_workers_where_the_envs_cost_most():
    # Every layout of 2 or more workers is held to the same rate by the cores. A third
    # worker would outpace the learner on paper, but the learner's step is the cheap
    # part of a sample: the third worker's envs would only add a batch of lag.
    c = cfg(rollout=32, batch_size=1024, ppo_epochs=2)
    plan = choose(LUNAR_LIKE, c, explicit=set())
    three = predict(LUNAR_LIKE, Layout(3, 32, "local", 1, 1), Workload(2, 32, 1024))
    assert three["trained_steps_per_s"] == plan.predicted["trained_steps_per_s"] == plan.predicted["cores_steps_per_s"]
    assert plan.predicted["production_steps_per_s"] < plan.predicted["consumption_steps_per_s"]
    assert (plan.num_workers, plan.num_envs_per_worker) == (2, 32)
    assert plan.predicted["lag_max_learner_steps"] < three["lag_max_learner_steps"]


def test_prediction_is_consistent_with_the_plan():
    costs = env_bound(8)
    c = cfg()
    plan = choose(costs, c, explicit=set())
    layout = Layout(plan.num_workers, plan.num_envs_per_worker, plan.inference, plan.num_policy_workers,
                    plan.learner_threads)
    again = predict(costs, layout, Workload.of(c))
    assert again == plan.predicted
    p = plan.predicted
    assert p["trained_steps_per_s"] == min(p["production_steps_per_s"], p["consumption_steps_per_s"],
                                           p["cores_steps_per_s"])
    assert p["lag_max_learner_steps"] <= c.max_policy_lag
    # A plan survives its JSON round trip (what --plan PATH.json reads back).
    assert Plan.from_json(plan.to_json()) == plan


def test_explicit_options_are_kept():
    plan = choose(env_bound(32), cfg(num_workers=3, inference="policy_worker"),
                  explicit={"num_workers", "inference"})
    assert (plan.num_workers, plan.inference) == (3, "policy_worker")


@pytest.mark.parametrize("asked", [{"num_policy_workers": 1}, {"inference_batch_wait_ms": 2.0}])
def test_setting_the_policy_workers_asks_for_them(asked):
    # Where local inference predicts faster (the env-bound costs' cheap model), setting
    # the policy workers' count or their wait still gets policy workers.
    assert choose(env_bound(32), cfg(), explicit=set()).inference == "local"
    plan = choose(env_bound(32), cfg(**asked), explicit=set(asked))
    assert plan.inference == "policy_worker"
    if "num_policy_workers" in asked:
        assert plan.num_policy_workers == 1


def test_lag_bound_limits_the_layout():
    loose = choose(env_bound(32), cfg(max_policy_lag=1000), explicit=set())
    tight = choose(env_bound(32), cfg(max_policy_lag=3), explicit=set())
    assert tight.predicted["lag_max_learner_steps"] <= 3 < loose.predicted["lag_max_learner_steps"]
    with pytest.raises(ValueError, match="max_policy_lag"):
        choose(env_bound(32), dataclasses.replace(cfg(), max_policy_lag=1), explicit=set())


def test_adapter_moves_a_core_to_a_busy_learner_and_back():
    from fastrl.plumbing.stats_board import StatsBoard
    from fastrl.tuning.adapt import ThreadAdapter

    board = StatsBoard(["learner", "rollout_0", "rollout_1"])
    adapter = ThreadAdapter(board, num_workers=2, cores=2, start_threads=1)
    learner, workers = board.row("learner"), [board.row("rollout_0"), board.row("rollout_1")]

    def window(t, worker_wait, learner_busy, learner_wait):
        for w in workers:
            w.add("wait_s", worker_wait * 10)
        learner.add("busy_s", learner_busy * 10)
        learner.add("wait_s", learner_wait * 10)
        return adapter.update(t)

    assert window(0, 0, 0, 0) is None  # the first call only starts the window
    change = window(10, worker_wait=0.6, learner_busy=0.97, learner_wait=0.0)
    assert change and "learner threads 1 -> 2" in change and adapter.threads == 2
    assert window(20, 0.6, 0.97, 0.0) is None and window(30, 0.6, 0.97, 0.0) is None  # settling; never past the cores
    assert window(40, 0.6, 0.97, 0.0) is None and adapter.threads == 2
    change = window(50, worker_wait=0.0, learner_busy=0.4, learner_wait=0.6)
    assert change and "learner threads 2 -> 1" in change and adapter.threads == 1


def test_cached_profile_is_reused_until_the_code_or_the_precision_changes(tmp_path, monkeypatch):
    from fastrl.algo.model import Precision
    from fastrl.tuning import profiling

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    profiled = []

    def fake_profile(cfg_, env, obs_space, action_space, seconds, precision, cap_s, one_thread):
        profiled.append(precision)
        return learner_bound(2), False

    monkeypatch.setattr(profiling, "profile_costs", fake_profile)
    env = type("Env", (), {"observation_space": None, "action_space": None})()
    fp32 = Precision("fp32", "fp32", "test")
    first, cached, capped = profiling.cached_costs(cfg(), env, 1.0, fp32, 6.0)
    assert not cached and not capped and first == learner_bound(2)
    again, cached, _ = profiling.cached_costs(cfg(), env, 1.0, fp32, 6.0)
    assert cached and again == first and len(profiled) == 1
    # The model's costs in another arithmetic are another profile.
    bf16_acting = Precision("bf16", "fp32", "test")
    _, cached, _ = profiling.cached_costs(cfg(), env, 1.0, bf16_acting, 6.0)
    assert not cached and profiled[-1] == bf16_acting
    monkeypatch.setattr(profiling, "_source_digest", lambda: "edited sources")
    _, cached, _ = profiling.cached_costs(cfg(), env, 1.0, fp32, 6.0)
    assert not cached and len(profiled) == 3
    # Another CPU, even one a VM names alike, is another profile (one unlike the machine's running this).
    here = profiling.cpu_model()
    other = next(name for name in ("AMD EPYC (family 25 model 17, avx512_bf16)", "AMD EPYC (family 25 model 1)")
                 if name != here)
    monkeypatch.setattr(profiling, "cpu_model", lambda: other)
    _, cached, _ = profiling.cached_costs(cfg(), env, 1.0, fp32, 6.0)
    assert not cached and len(profiled) == 4


ZEN3_VM = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse2 avx avx2 fma

processor\t: 1
model name\t: not the first block
"""
ARM_BOARD = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd

Hardware\t: BCM2835
Model\t\t: Raspberry Pi 4 Model B Rev 1.4
"""


@pytest.mark.parametrize("text, name", [
    (ZEN3_VM, "AMD EPYC (family 25 model 1, avx2)"),
    (ZEN3_VM.replace("fma", "fma avx512f avx512_bf16"), "AMD EPYC (family 25 model 1, avx512_bf16)"),
    (ARM_BOARD, "BCM2835"),
], ids=["x86 VM", "x86 with bf16", "ARM"])
def test_the_cpu_is_named_by_its_generation_where_a_vm_names_it_vaguely(tmp_path, text, name):
    from fastrl.tuning.profiling import cpu_model

    path = tmp_path / "cpuinfo"
    path.write_text(text)
    assert cpu_model(str(path)) == name


def _cartpole():
    from fastrl.envs.registry import get_spec

    return get_spec("CartPole-v1").make(seed=0)


def test_a_profile_past_its_cap_times_each_call_once_and_is_neither_cached_nor_silent(tmp_path, monkeypatch, capsys):
    # A cap of 0 s stands for a machine so busy that every call overruns it: the
    # profile still gets a number for every cost it needs, from one call each, no
    # warm-up and no second round, and the runner says so and caches nothing.
    from fastrl.algo.model import Precision
    from fastrl.runtime import runner
    from fastrl.tuning import profiling

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(runner, "PROFILE_CAP_S", 0.0)
    timed = count_timed_calls(monkeypatch, profiling)
    env = _cartpole()
    try:
        plan = runner.make_plan(cfg(hidden_sizes="16", rollout=8, batch_size=64), set(), env, resuming=False,
                                precision=Precision("fp32", "fp32", "test"))
    finally:
        env.close()
    (counts,) = timed
    assert plan is not None and set(counts.values()) == {1}
    assert {key[0] for key in counts} == {"forward", "train"}
    assert ("the planner's profile was taken on a busy machine (other programs took the cores, or it hit its 0-s "
            "cap)") in capsys.readouterr().out
    assert not (tmp_path / "fastrl" / "profiles").exists()  # (the learner's allocator is built there too)


def test_the_profile_takes_the_models_one_thread_costs_and_only_the_learners_thread_speed_up(tmp_path,
                                                                                            monkeypatch):
    from fastrl.algo.model import Precision
    from fastrl.plumbing.proc import usable_cores
    from fastrl.tuning import profiling

    timed = count_timed_calls(monkeypatch, profiling)
    real_measure, models = profiling.measure_model, []
    monkeypatch.setattr(profiling, "measure_model", lambda *a, **k: models.append(real_measure(*a, **k)) or models[-1])
    given = profiling.OneThreadCosts(forward_s={b: 1e-5 * b for b in profiling.FORWARD_BATCHES}, train_s=3e-4,
                                     capped=False)
    env = _cartpole()
    try:
        costs, capped = profiling.profile_costs(cfg(hidden_sizes="16", rollout=8), env, env.observation_space,
                                                env.action_space, 0.3, Precision("fp32", "fp32", "test"), math.inf,
                                                given)
    finally:
        env.close()
    assert costs.forward_s == given.forward_s and costs.train_s[1] == given.train_s and not capped
    if usable_cores() >= 2:
        # Both thread counts timed in the same rounds; the two-thread cost is the given
        # one-thread cost at the speed-up they measured, not the time itself.
        (counts,) = timed
        assert set(counts) == {("train", 1, None), ("train", 2, None)} and set(costs.train_s) == {1, 2}
        (measured,) = [m.train_s_per_sample for m in models]
        assert costs.train_s[2] == pytest.approx(given.train_s * measured[2] / measured[1])
    else:
        assert not timed and set(costs.train_s) == {1}
    # One-thread costs timed on a busy machine make the profile one taken under load.
    env = _cartpole()
    try:
        _, capped = profiling.profile_costs(cfg(hidden_sizes="16", rollout=8), env, env.observation_space,
                                            env.action_space, 0.3, Precision("fp32", "fp32", "test"), math.inf,
                                            dataclasses.replace(given, capped=True))
    finally:
        env.close()
    assert capped


def test_on_a_gpu_run_the_profile_times_the_learner_and_policy_worker_forwards_on_the_gpu(monkeypatch):
    # Without a GPU here, the GPU's timing is recorded rather than run: the call the
    # profile makes for it, and that its numbers (not the CPU's) become the costs.
    from fastrl.algo.model import Precision
    from fastrl.tuning import profiling

    real = profiling.measure_model
    gpu_calls = []

    def measure(cfg_, obs_space, action_space, batch_sizes, threads, budget, device="cpu", **kw):
        if device == "cpu":
            return real(cfg_, obs_space, action_space, batch_sizes, threads, budget, device, **kw)
        gpu_calls.append((cfg_.batch_size, tuple(batch_sizes), tuple(threads)))
        return profiling.ModelProfile(device="cuda:0", threads=[1], forward_batch_sizes=list(batch_sizes),
                                      forward_s_per_sample={1: {b: 1e-3 / b for b in batch_sizes}},
                                      train_minibatch=cfg_.batch_size, ppo_epochs=1, train_s_per_sample={1: 2e-6},
                                      capped=False)

    monkeypatch.setattr(profiling, "measure_model", measure)
    monkeypatch.setattr(profiling, "resolve_device", lambda cfg_: "cuda")
    env = _cartpole()
    try:
        costs, _ = profiling.profile_costs(cfg(hidden_sizes="16", rollout=8, batch_size=512), env,
                                           env.observation_space, env.action_space, 0.3,
                                           Precision("fp32", "fp32", "test"), math.inf)
    finally:
        env.close()
    # The run's own minibatch (not the CPU profile's 8 trajectories), at a GPU policy
    # worker's batch sizes; the CPU forwards still timed for local actors.
    assert gpu_calls == [(512, profiling.DEVICE_FORWARD_BATCHES, (1,))]
    assert costs.gpu and costs.train_s == {1: 2e-6}
    assert costs.device_forward_s == {b: 1e-3 / b for b in profiling.DEVICE_FORWARD_BATCHES}
    assert set(costs.forward_s) == set(profiling.FORWARD_BATCHES) and costs.forward_s[4] > 0


@pytest.mark.parametrize("batch_size, minibatches, timed_samples", [
    (1024, 4, 256),  # eight trajectories of 32: the most a CPU profile times
    (1024, 16, 64),  # a small minibatch's fixed cost per step counts at its own size
    (8192, 1, 256),  # a whole Doom-sized batch would take seconds to time
    (256, 16, 32),  # under a trajectory: one trajectory
])
def test_the_cpu_profile_times_the_learner_on_the_runs_minibatch_up_to_a_bound(monkeypatch, batch_size, minibatches,
                                                                               timed_samples):
    from fastrl.algo.model import Precision
    from fastrl.tuning import profiling

    real_measure, models = profiling.measure_model, []
    monkeypatch.setattr(profiling, "measure_model", lambda *a, **k: models.append(real_measure(*a, **k)) or models[-1])
    run = cfg(hidden_sizes="16", rollout=32, batch_size=batch_size, num_minibatches=minibatches)
    env = _cartpole()
    try:
        costs, _ = profiling.profile_costs(run, env, env.observation_space, env.action_space, 0.3,
                                           Precision("fp32", "fp32", "test"), math.inf)
    finally:
        env.close()
    assert [m.train_minibatch for m in models] == [timed_samples] and costs.train_s[1] > 0


def test_runs_whose_learner_steps_are_timed_alike_share_a_profile(tmp_path, monkeypatch):
    from fastrl.algo.model import Precision
    from fastrl.tuning import profiling

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    fp32 = Precision("fp32", "fp32", "test")

    def path(**kw):
        return profiling.setup_cache_path("costs", cfg(rollout=32, **kw), fp32)

    # Both time eight trajectories; a minibatch of two is another step, so another profile.
    assert path(batch_size=1024, num_minibatches=4) == path(batch_size=4096, num_minibatches=4)
    assert path(batch_size=1024, num_minibatches=4) != path(batch_size=1024, num_minibatches=16)


def _learner_share(costs, workers: int, learner_threads: int, nice: int) -> float:
    """The learner's part of the cores under Linux's weighted fair share, every
    process wanting to run (the model worker_nice plans with)."""
    others = workers * NICE_STEP ** -nice
    return costs.cores * learner_threads / (learner_threads + others)


DOOM_LIKE = Costs(cores=2, env_s=0.55e-3, forward_s={16: 0.30e-3, 32: 0.28e-3}, train_s={1: 0.64e-3, 2: 0.52e-3})


@pytest.mark.parametrize("costs, c", [
    # doom_battle on 2 cores: two workers and the learner want 3 cores. At equal
    # weights the learner would get 2/3 of a core where its cost needs ~0.86.
    (DOOM_LIKE, cfg(rollout=32, batch_size=1024, ppo_epochs=1)),
    # LunarLander: the learner needs 0.63 of a core and would get 0.67 at equal
    # weights, busy nearly all the time, so batches queue for it.
    (LUNAR_LIKE, cfg(rollout=32, batch_size=1024, ppo_epochs=2)),
], ids=["doom_battle", "LunarLander"])
def test_workers_give_way_until_the_learner_gets_its_share_of_the_cores_and_some_room(costs, c):
    plan = choose(costs, c, explicit=set())
    assert plan.num_workers == 2 and plan.inference == "local" and plan.learner_threads == 1
    learn = c.ppo_epochs * costs.train(1)
    need = 2 * learn / (costs.env_s + costs.forward(plan.num_envs_per_worker) + learn)
    wanted = need / LEARNER_LOAD if need / LEARNER_LOAD <= 1 else need  # room only where it can be had
    assert plan.worker_nice > 0
    assert _learner_share(costs, plan.num_workers, plan.learner_threads, plan.worker_nice) >= wanted
    # the least niceness that does it
    assert _learner_share(costs, plan.num_workers, plan.learner_threads, plan.worker_nice - 1) < wanted


def test_a_costly_learner_gets_what_it_needs_and_no_room():
    # doom_health_gathering_supreme-like: a 2-thread learner whose step costs more
    # core time than the actors' part of a sample is busy whatever its share; room
    # for it would only slow the workers.
    hgs_like = Costs(cores=2, env_s=0.44e-3, forward_s={32: 0.5e-3}, train_s={1: 2e-3, 2: 1.17e-3})
    nice = worker_nice(hgs_like, Layout(2, 32, "local", 1, 2), Workload(1))
    need = 2 * (2 * 1.17e-3) / (0.44e-3 + 0.5e-3 + 2 * 1.17e-3)  # local: no round trip
    assert _learner_share(hgs_like, 2, 2, nice) >= need > _learner_share(hgs_like, 2, 2, nice - 1)


def test_a_learner_that_costs_more_gets_more_of_the_cores():
    costly = dataclasses.replace(LUNAR_LIKE, train_s={1: 60e-6})
    two_by_32 = Layout(2, 32, "local", 1, 1)
    assert worker_nice(costly, two_by_32, Workload(2)) > worker_nice(LUNAR_LIKE, two_by_32, Workload(2))


def test_workers_keep_their_weight_when_every_process_has_a_core_or_sampling_and_learning_take_turns():
    assert worker_nice(DOOM_LIKE, Layout(1, 32, "local", 1, 1), Workload(1)) == 0  # 2 processes, 2 cores
    assert worker_nice(DOOM_LIKE, Layout(2, 16, "local", 1, 1), Workload(1)) > 0
    # Turns: the workers wait while the learner trains.
    assert worker_nice(DOOM_LIKE, Layout(2, 16, "local", 1, 1), Workload(1, ahead=0)) == 0
    on_policy = cfg(rollout=32, batch_size=1024, ppo_epochs=1, max_batches_ahead=0)
    assert choose(DOOM_LIKE, on_policy, explicit=set()).worker_nice == 0
    plan = choose(env_bound(32), cfg(), explicit=set())
    assert plan.num_workers + plan.learner_threads <= 32 and plan.worker_nice == 0


def test_an_explicit_worker_nice_is_kept_and_an_old_plan_reads_as_zero():
    c = cfg(rollout=32, batch_size=1024, ppo_epochs=1, worker_nice=0)
    assert choose(DOOM_LIKE, c, explicit={"worker_nice"}).worker_nice == 0
    old = {k: v for k, v in json.loads(choose(DOOM_LIKE, c, explicit=set()).to_json()).items() if k != "worker_nice"}
    assert Plan.from_json(json.dumps(old)).worker_nice == 0


class _TimedEnv:
    """A stand-in env whose steps move a fake clock on by `cost(step)` seconds."""

    def __init__(self, cost, fail_at=None):
        import gymnasium as gym

        self.action_space = gym.spaces.Discrete(2)
        self.now, self.steps, self.cost, self.fail_at = 0.0, 0, cost, fail_at

    def reset(self):
        return None, {}

    def step(self, action):
        self.steps += 1
        if self.steps == self.fail_at:
            raise RuntimeError("the engine died")
        self.now += self.cost(self.steps)
        return None, 0.0, False, self.steps % 50 == 0, {}


def test_env_profile_skips_the_settling_slice_and_takes_the_median():
    from fastrl.tuning.profiling import time_env_steps

    # Slices of 0.1 s: 1 ms a step, but 5 ms while the game settles (the first
    # slice) and 3 ms through one disturbed slice later on: neither moves the answer.
    env = _TimedEnv(lambda i: 5e-3 if i <= 20 else 3e-3 if 220 < i <= 253 else 1e-3)
    assert time_env_steps(env, seconds=0.5, chunks=4, clock=lambda: env.now) == pytest.approx(1e-3, rel=0.05)
    # An env that dies is timed on the steps it took, not raised here.
    broken = _TimedEnv(lambda i: 2e-3, fail_at=7)
    assert time_env_steps(broken, seconds=0.5, chunks=4, clock=lambda: broken.now) == pytest.approx(2e-3)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")
def test_the_env_is_timed_on_one_core_only_when_workers_are_pinned():
    # --pin_workers: the planner times the env where a pinned worker would step it,
    # then gives the process back every core it had.
    before = os.sched_getaffinity(0)
    with on_one_core(True):
        inside = os.sched_getaffinity(0)
    assert inside == {min(before)} and os.sched_getaffinity(0) == before
    with on_one_core(False):
        assert os.sched_getaffinity(0) == before


def test_the_plan_takes_the_learners_compiled_cost_once_a_run_of_the_setup_measured_it(tmp_path, monkeypatch, capsys):
    # A profile times the learner eagerly; a run whose learner then compiled
    # remembers the ratio it measured, and the next plan of that setup (same
    # machine, model, precision) takes it, so it sizes production for that learner.
    import gymnasium

    from fastrl.algo.model import Precision
    from fastrl.runtime import runner
    from fastrl.tuning import compiled_costs, profiling

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    eager = Costs(cores=2, env_s=20e-6, forward_s=CHEAP_MODEL, train_s={1: 1e-3})
    monkeypatch.setattr(profiling, "cached_costs", lambda *args, **kwargs: (eager, True, False))
    images = type("Env", (), {"observation_space": gymnasium.spaces.Box(0, 255, (3, 36, 64), "uint8")})()
    setup = cfg(use_rnn=True, device="cpu")
    fp32 = Precision("fp32", "fp32", "test")

    def consumption(c=setup, precision=fp32):
        return runner.make_plan(c, set(), images, resuming=False, precision=precision).predicted[
            "consumption_steps_per_s"]

    before = consumption()
    compiled_costs.remember(setup, "fp32", {"chosen": "compiled", "why": "faster", "eager_step_s": 1.0,
                                            "compiled_step_s": 0.5, "ratio": 0.5})
    assert consumption() == pytest.approx(2 * before)
    assert "planning for the learner's step at 0.50x of its eager cost" in capsys.readouterr().out
    # Not for another arithmetic, nor for a learner that will not compile.
    assert consumption(precision=Precision("bf16", "bf16", "test")) == pytest.approx(before)
    assert consumption(dataclasses.replace(setup, compile_learner="off")) == pytest.approx(before)
    # Nor for a GPU run on the same machine (`auto` does not compile there; `on` keys its ratio by device).
    assert compiled_costs.remembered_ratio(setup, "fp32", images=True) == 0.5
    assert compiled_costs.remembered_ratio(dataclasses.replace(setup, device="cuda"), "fp32", images=True) is None
    # A run whose compile was slower, or failed, stayed eager: so will the next.
    compiled_costs.remember(setup, "fp32", {"chosen": "eager", "why": "not faster", "eager_step_s": 1.0,
                                            "compiled_step_s": 0.98, "ratio": 0.98})
    assert consumption() == pytest.approx(before)
    compiled_costs.remember(setup, "fp32", {"chosen": "compiled", "ratio": 0.5, "compiled_step_s": 0.5})
    compiled_costs.remember(setup, "fp32", {"chosen": "eager", "why": "compiling failed", "eager_step_s": None,
                                            "compiled_step_s": None, "ratio": None})
    assert consumption() == pytest.approx(before)


def test_the_ratios_runs_measured_are_kept_for_the_next_runs_choice(tmp_path, monkeypatch):
    # Whichever step a run kept, its own timing is kept (the last PRIOR_RUNS), for the
    # next run's learner to judge its timing with; the plan takes the judged ratio.
    from fastrl.learning.compiled import PRIOR_RUNS
    from fastrl.tuning import compiled_costs

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    setup = cfg(use_rnn=True, device="cpu")
    assert compiled_costs.memory(setup, "fp32").prior == ()
    reports = [("compiled", 0.85, 0.85), ("eager", 1.03, 1.03), ("compiled", 0.8, 0.825),
               ("compiled", 0.9, 0.85), ("compiled", 1.02, 0.875)]
    for chosen, ratio, judged in reports:
        compiled_costs.remember(setup, "fp32", {"chosen": chosen, "ratio": ratio, "judged_ratio": judged,
                                                "compiled_step_s": ratio, "eager_step_s": 1.0})
    assert list(compiled_costs.memory(setup, "fp32").prior) == [r for _, r, _ in reports][-PRIOR_RUNS:]
    assert compiled_costs.remembered_ratio(setup, "fp32", images=True) == 0.875
    assert compiled_costs.memory(setup, "bf16").prior == ()  # another arithmetic: its own
    # Each setup and arithmetic names its own marks of what inductor's cache holds.
    assert len({compiled_costs.memory(setup, "fp32").setup_key, compiled_costs.memory(setup, "bf16").setup_key,
                compiled_costs.memory(cfg(use_rnn=True, device="cpu", batch_size=512), "fp32").setup_key}) == 3
    # `on` times no eager step: nothing to keep. A failed compile: the plan goes eager, the timings stay.
    compiled_costs.remember(setup, "fp32", {"chosen": "compiled", "ratio": None, "compiled_step_s": 0.5})
    compiled_costs.remember(setup, "fp32", {"chosen": "eager", "why": "compiling failed", "eager_step_s": None,
                                            "compiled_step_s": None, "ratio": None})
    assert compiled_costs.remembered_ratio(setup, "fp32", images=True) == 1.0
    assert len(compiled_costs.memory(setup, "fp32").prior) == PRIOR_RUNS


def test_several_policies_are_planned_as_several_learners_sharing_the_cores():
    costs = learner_bound(2)
    one = choose(costs, cfg(), explicit=set())
    four = choose(costs, cfg(num_policies=4), explicit=set())
    c4 = cfg(num_policies=4, **four.options())
    # Each worker's envs split evenly into one group per policy, and the pool holds
    # a batch per policy beyond the splits' own and one more.
    assert c4.num_splits == 4 and c4.num_envs_per_worker % 4 == 0
    assert four.num_buffers == c4.num_workers * 4 + 5 * c4.buffers_per_batch
    # Four learners consume four times one learner's rate, but they are four more
    # busy processes: on 2 cores the total is bounded by the cores, not multiplied.
    p1 = predict(costs, Layout(1, 32, "local", 1, 1), Workload(2, 32, 1024))
    p4 = predict(costs, Layout(1, 32, "local", 1, 1), Workload(2, 32, 1024, policies=4))
    assert p4["consumption_steps_per_s"] == pytest.approx(4 * p1["consumption_steps_per_s"])
    assert p4["processes"] == p1["processes"] + 3
    assert p4["lag_max_learner_steps"] - 1 == pytest.approx((p1["lag_max_learner_steps"] - 1) / 4)
    assert four.predicted["trained_steps_per_s"] == pytest.approx(min(
        four.predicted["production_steps_per_s"], four.predicted["consumption_steps_per_s"],
        four.predicted["cores_steps_per_s"]))
    # Each forward acts for one policy's split: a quarter of the envs, at a batch's cost per sample.
    env_bound_4 = predict(env_bound(2), Layout(1, 32, "local", 1, 1), Workload(2, 32, 1024, policies=4))
    env_bound_1 = predict(env_bound(2), Layout(1, 32, "local", 1, 1), Workload(2, 32, 1024))
    assert env_bound_4["production_steps_per_s"] == pytest.approx(1 / (1e-3 + CHEAP_MODEL[8]))
    assert env_bound_1["production_steps_per_s"] == pytest.approx(1 / (1e-3 + CHEAP_MODEL[32]))
    assert "4 policies, each trained at ~" in describe(four, 1)
    assert "policies" not in describe(one, 1)


def test_on_policy_turns_add_the_sampling_and_learning_times_and_bound_the_lag():
    costs = Costs(cores=2, env_s=1e-3, forward_s={1: 2e-4, 64: 1e-4}, train_s={1: 4e-3, 2: 2.2e-3})
    # One learner thread: the other core idles while it learns (with two, turns cost
    # what the cores' bound already charges an asynchronous run).
    free = predict(costs, Layout(2, 16, "local", 1, 1), Workload(1, 32, 1024))
    turns = predict(costs, Layout(2, 16, "local", 1, 1), Workload(1, 32, 1024, ahead=0))
    sampling = min(free["production_steps_per_s"], 2 / (1e-3 + costs.forward(16)))
    assert turns["trained_steps_per_s"] == pytest.approx(1 / (1 / sampling + 1 / free["consumption_steps_per_s"]))
    assert turns["trained_steps_per_s"] < free["trained_steps_per_s"]
    assert (turns["lag_max_learner_steps"], free["lag_max_learner_steps"]) == (0, 2)
    assert turns["bottleneck"] == "learner"
    # A worker's second env half keeps a buffer of its own beyond the bound.
    halves = predict(costs, Layout(8, 64, "policy_worker", 1, 2), Workload(1, 32, 1024, ahead=1))
    assert halves["lag_max_learner_steps"] == pytest.approx(1 + 1 + 8 * 32 * 32 / 1024)  # below the 17 unbounded


def test_an_on_policy_plan_gives_every_worker_a_buffer_to_fill():
    # Batch 1024 of 32-step rollouts: 2 workers x 32 envs would share one buffer under
    # --max_batches_ahead 0, one worker sampling while the other waits.
    costs = Costs(cores=2, env_s=1e-3, forward_s={1: 2e-4, 64: 1e-4}, train_s={1: 4e-3, 2: 2.2e-3})
    cfg = Config(env="CartPole-v1", rollout=32, batch_size=1024, max_batches_ahead=0)
    plan = choose(costs, cfg, set())
    chosen = dataclasses.replace(cfg, num_workers=plan.num_workers, num_envs_per_worker=plan.num_envs_per_worker,
                                 inference=plan.inference)
    assert plan.num_workers * chosen.num_splits <= chosen.total_buffers == plan.num_buffers


def test_the_runner_hands_its_learner_what_earlier_runs_of_the_setup_measured(tmp_path, monkeypatch):
    # The learner's process never reads the cache itself (the profile module imports
    # the learner): the runner reads it and passes it on with the learner's arguments.
    from fastrl.config import parse_args
    from fastrl.learning.learner import learner_main
    from fastrl.runtime import runner
    from fastrl.tuning import compiled_costs

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(runner, "start_process_server", lambda: None)  # no child is started here
    config, _ = parse_args(["--env", "CartPole-v1", "--plan", "off", "--device", "cpu",
                            "--train_dir", str(tmp_path / "train")])
    run = runner.Runner(config)
    for ratio in (0.8, 1.02):
        compiled_costs.remember(run.cfg, run.precision.learning, {"chosen": "compiled", "ratio": ratio,
                                                                  "compiled_step_s": ratio, "eager_step_s": 1.0})
    spawned = []
    monkeypatch.setattr(run, "_spawn", lambda name, target, *args, **kwargs: spawned.append((target, args)))
    run.start()
    (learner_args,) = [args for target, args in spawned if target is learner_main]
    memory = learner_args[3].compile_memory  # (cfg, ctx, device, LearnerStart, device params)
    assert memory == compiled_costs.memory(run.cfg, run.precision.learning)
    assert memory.prior == (0.8, 1.02) and memory.setup_key
