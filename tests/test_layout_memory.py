"""Earlier runs' trained rates against their predictions move the next plan: per
inference mode, per machine and setup, and only from runs long enough to say."""
import dataclasses
import os

import pytest

from fastrl.algo.model import Precision
from fastrl.config import Config
from fastrl.tuning import layout_memory
from fastrl.tuning.planner import UNTRIED_MARGIN, Costs, choose, describe

FP32 = Precision("fp32", "fp32", "test")
LONG = layout_memory.MIN_TRAINING_S

# doom_battle's profile on the Intel Xeon (family 6 model 207) of the thirty-eighth
# session, its learner at the compiled 0.9x: the model puts 2 x 64 envs with a
# policy worker 3% ahead of 2 x 32 local, which trained 1.24-1.31x faster.
BATTLE = Costs(cores=2, env_s=731e-6,
               forward_s={4: 1378e-6, 8: 882e-6, 16: 575e-6, 32: 455e-6, 64: 337e-6, 128: 297e-6},
               train_s={1: 0.9 * 950e-6, 2: 0.9 * 492e-6})


def battle():
    return Config(env="doom_battle", ppo_epochs=1)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def test_a_mode_that_trained_below_the_model_loses_the_near_tie_it_won():
    plan = choose(BATTLE, battle(), explicit=set())
    assert (plan.inference, plan.num_workers, plan.num_envs_per_worker) == ("policy_worker", 2, 64)
    model_rate = plan.predicted["trained_steps_per_s"]

    both = choose(BATTLE, battle(), explicit=set(), scales={"policy_worker": 0.94, "local": 1.2})
    p = both.predicted
    assert (both.inference, both.num_workers, both.num_envs_per_worker) == ("local", 2, 32)
    assert p["trained_steps_per_s"] == pytest.approx(1.2 * p["model_trained_steps_per_s"])
    assert not p.get("untried")
    line = describe(both, 4)
    assert (f"predicted {p['trained_steps_per_s'] * 4:,.0f} env frames/s trained: the model's "
            f"{p['model_trained_steps_per_s'] * 4:,.0f} (production") in line
    assert "at 1.20x, as earlier runs with local inference trained here; policy lag <=" in line
    assert model_rate == pytest.approx(plan.predicted["trained_steps_per_s"])


@pytest.mark.parametrize("measured", [0.94, 1.19])
def test_the_mode_no_run_measured_is_tried_once_it_comes_near(measured):
    # Whether the policy worker trained below its prediction or above it (the profile
    # taken beside starting engines read every cost high), local inference, which
    # the model puts 3% behind, takes the same scale and is run to be measured.
    after = choose(BATTLE, battle(), explicit=set(), scales={"policy_worker": measured})
    p = after.predicted
    assert (after.inference, after.num_workers, after.num_envs_per_worker) == ("local", 2, 32)
    assert p["untried"] and p["measured_scale"] == pytest.approx(measured)
    assert p["trained_steps_per_s"] == pytest.approx(measured * p["model_trained_steps_per_s"])
    assert (f"at {measured:.2f}x, as earlier runs of the other inference mode trained here (none here has "
            "measured local inference yet); policy lag <=") in describe(after, 4)
    # Once local has a run of its own, the two modes' measurements decide.
    slow_local = choose(BATTLE, battle(), explicit=set(), scales={"policy_worker": measured, "local": 0.7})
    assert slow_local.inference == "policy_worker" and not slow_local.predicted.get("untried")


def test_a_mode_the_model_puts_far_behind_is_not_tried():
    # A cheap env step and a forward at 32 four times dearer a sample than at 64: 2 x
    # 32 local predicted ~22% behind policy workers, which batch 64. One run of policy
    # workers does not make local worth a try.
    costs = dataclasses.replace(BATTLE, env_s=150e-6, forward_s={4: 2e-3, 16: 1.5e-3, 32: 1.2e-3, 64: 3e-4, 128: 2e-4})
    first = choose(costs, battle(), explicit=set())
    local = choose(costs, dataclasses.replace(battle(), inference="local"), explicit={"inference"})
    assert first.inference == "policy_worker"
    assert local.predicted["trained_steps_per_s"] < (1 - UNTRIED_MARGIN) * first.predicted["trained_steps_per_s"]
    again = choose(costs, battle(), explicit=set(), scales={"policy_worker": 1.0})
    assert again.inference == "policy_worker" and not again.predicted.get("untried")


def test_a_mode_the_model_puts_far_ahead_survives_a_bad_run():
    # 8 cores and a forward that only batching across workers makes cheap: policy
    # workers predicted ~2x local; the lowest scale a run can give them keeps them.
    costs = Costs(cores=8, env_s=1e-3, forward_s={4: 4e-3, 16: 2e-3, 64: 2e-4, 512: 1e-5}, train_s={1: 5e-6})
    setup = Config(env="CartPole-v1", max_policy_lag=100)
    low = layout_memory.SCALE_BOUNDS[0]
    assert choose(costs, setup, explicit=set()).inference == "policy_worker"
    assert choose(costs, setup, explicit=set(), scales={"policy_worker": low}).inference == "policy_worker"


def test_runs_are_remembered_per_mode_from_the_last_few_long_ones(cache):
    setup = battle()
    assert layout_memory.scales(setup, FP32) == {}
    assert not layout_memory.remember(setup, FP32, "policy_worker", 1000.0, 500.0, training_s=LONG - 1)
    assert layout_memory.scales(setup, FP32) == {}
    for trained in (940.0, 1000.0, 900.0):
        assert layout_memory.remember(setup, FP32, "policy_worker", 1000.0, trained, training_s=LONG)
    assert layout_memory.scales(setup, FP32) == {"policy_worker": pytest.approx(0.94)}
    layout_memory.remember(setup, FP32, "local", 1000.0, 1160.0, training_s=LONG)
    assert layout_memory.scales(setup, FP32) == {"policy_worker": pytest.approx(0.94), "local": pytest.approx(1.16)}
    # The median of the last KEPT_RUNS: older runs drop out as the machine changes.
    for _ in range(layout_memory.KEPT_RUNS):
        layout_memory.remember(setup, FP32, "policy_worker", 1000.0, 1050.0, training_s=LONG)
    assert layout_memory.scales(setup, FP32)["policy_worker"] == pytest.approx(1.05)
    # Bounded: however low its runs read, a mode keeps the lowest scale of its prediction.
    for trained in (10.0, 10.0, 10.0, 10.0, 10.0):
        layout_memory.remember(setup, FP32, "local", 1000.0, trained, training_s=LONG)
    assert layout_memory.scales(setup, FP32)["local"] == layout_memory.SCALE_BOUNDS[0]


@pytest.mark.parametrize("other", [
    {"cfg": {"batch_size": 2048}}, {"cfg": {"env": "doom_defend_the_center"}}, {"cfg": {"device": "cuda"}},
    {"precision": Precision("bf16", "fp32", "test")},
])
def test_another_setup_precision_or_device_has_a_memory_of_its_own(cache, other):
    setup = battle()
    layout_memory.remember(setup, FP32, "local", 1000.0, 1200.0, training_s=LONG)
    elsewhere = dataclasses.replace(setup, **other.get("cfg", {}))
    assert layout_memory.scales(elsewhere, other.get("precision", FP32)) == {}
    assert layout_memory.scales(setup, FP32) == {"local": pytest.approx(1.2)}


def test_an_unreadable_memory_is_no_memory(cache):
    setup = battle()
    layout_memory.remember(setup, FP32, "local", 1000.0, 1200.0, training_s=LONG)
    path = layout_memory._path(setup, FP32)
    for text, scales in (("{not json", {}), ("[1, 2]", {}),
                         ('{"local": "fast", "policy_worker": [0.9, -1, "x"]}', {"policy_worker": 0.9})):
        with open(path, "w") as fh:
            fh.write(text)
        assert layout_memory.scales(setup, FP32) == pytest.approx(scales)


def test_the_plan_takes_what_runs_measured_and_a_run_remembers_what_it_trained(cache, monkeypatch):
    # The runner's side: make_plan scales by the memory, and a finished run that trained
    # long enough adds its own rate against the model's prediction (not the scaled one).
    import gymnasium

    from fastrl.runtime import runner
    from fastrl.tuning import profiling

    monkeypatch.setattr(profiling, "cached_costs", lambda *args: (BATTLE, True, False))
    screen = type("Env", (), {"observation_space": gymnasium.spaces.Box(0, 255, (3, 72, 128), "uint8")})()
    setup = dataclasses.replace(battle(), compile_learner="off", device="cpu")
    assert runner.make_plan(setup, set(), screen, resuming=False, precision=FP32).inference == "policy_worker"
    layout_memory.remember(setup, FP32, "policy_worker", 1000.0, 940.0, training_s=LONG)
    plan = runner.make_plan(setup, set(), screen, resuming=False, precision=FP32)
    assert plan.inference == "local" and plan.predicted["untried"]

    class Finished:  # what _finish reads of a Runner that trained `seconds` at `rate`
        def __init__(self, seconds, rate, made_here=True):
            self.rank, self.cfg, self.plan, self.precision = runner.SOLO, setup, plan, FP32
            self.plan_made_here = made_here
            self.spec = type("Spec", (), {"frameskip": 4})()
            self.training_since = runner.time.time() - seconds
            self.metrics, self.rate, self.frames_offset = {}, rate, 0

        def steady_trained_steps_per_s(self):
            return self.rate

        def __getattr__(self, name):  # the summary and the closing line: not what this test checks
            return lambda *args, **kwargs: 0.0 if name in ("env_frames", "mean_return") else None

    model = plan.predicted["model_trained_steps_per_s"]  # what local's runs are measured against
    runner.Runner._finish(Finished(LONG + 1, 1.2 * model), 100.0, "done", [], failed=False)
    runner.Runner._finish(Finished(LONG + 1, 0.5 * model), 100.0, "done", [], failed=True)  # a failure: not kept
    runner.Runner._finish(Finished(5, 0.5 * model), 100.0, "done", [], failed=False)  # too short: not kept
    # A plan read from a file (--plan PATH, a resume) may come from another machine: not kept.
    runner.Runner._finish(Finished(LONG + 1, 0.5 * model, made_here=False), 100.0, "done", [], failed=False)
    assert layout_memory.scales(setup, FP32) == {"policy_worker": pytest.approx(0.94), "local": pytest.approx(1.2)}
    again = runner.make_plan(setup, set(), screen, resuming=False, precision=FP32)
    assert again.predicted["measured_scale"] == pytest.approx(1.2)


def test_a_run_plans_afresh_unless_given_a_plan_or_resuming_with_its_own(tmp_path):
    from fastrl.runtime.runner import plan_file

    setup = dataclasses.replace(battle(), train_dir=str(tmp_path))
    assert plan_file(setup, resuming=False) is None
    assert plan_file(setup, resuming=True) is None  # no plan.json saved: it plans
    os.makedirs(setup.experiment_dir)
    saved = os.path.join(setup.experiment_dir, "plan.json")
    with open(saved, "w") as fh:
        fh.write("{}")
    assert plan_file(setup, resuming=True) == saved
    assert plan_file(setup, resuming=False) is None
    given = str(tmp_path / "mine.json")
    assert plan_file(dataclasses.replace(setup, plan=given), resuming=False) == given


def test_the_rate_a_run_remembers_is_its_second_halfs():
    # 100 s of training: 20 samples/s until the half way point (a compile beside the
    # first steps), 100/s after it. The rate is the second half's, from the last
    # report before the half way point; with no report before it, the whole run's.
    from fastrl.runtime import runner

    now = runner.time.time()
    board = type("Board", (), {"total": lambda self, key, row: 6000.0})()

    class Trained:
        training_since = now - 100.0
        ctx = type("Ctx", (), {"board": board})()

    run = Trained()
    run._trained_marks = [(now - 100.0 + t, 20.0 * min(t, 50.0) + 100.0 * max(t - 50.0, 0.0))
                          for t in range(10, 100, 10)]
    assert runner.Runner.steady_trained_steps_per_s(run) == pytest.approx(100.0, rel=0.01)
    run._trained_marks = []
    assert runner.Runner.steady_trained_steps_per_s(run) == pytest.approx(60.0, rel=0.01)
