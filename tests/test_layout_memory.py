"""Earlier runs' trained rates against their predictions move the next plan: per
inference mode, per machine and setup, and only from runs that measured their layout."""
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from helpers import TEST_ENVS_ON_PATH, TrainRun

from fastrl.algo.model import Precision
from fastrl.config import Config
from fastrl.tuning import layout_memory
from fastrl.tuning.planner import DOUBT_BELOW, UNTRIED_MARGIN, Costs, Recall, choose, describe

FP32 = Precision("fp32", "fp32", "test")

# A doom_battle profile on a 2-core machine, its learner at the compiled 0.9x: the
# model puts 2 x 64 envs with a policy worker 3% ahead of 2 x 32 local.
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

    both = choose(BATTLE, battle(), explicit=set(), memory=Recall({"policy_worker": 0.94, "local": 1.2}))
    p = both.predicted
    assert (both.inference, both.num_workers, both.num_envs_per_worker) == ("local", 2, 32)
    assert p["trained_steps_per_s"] == pytest.approx(1.2 * p["model_trained_steps_per_s"])
    assert not p.get("untried")
    line = describe(both, 4)
    assert (f"predicted {p['trained_steps_per_s'] * 4:,.0f} env frames/s trained: the model's "
            f"{p['model_trained_steps_per_s'] * 4:,.0f} (production") in line
    assert "at 1.20x, as earlier runs with local inference trained here;" in line
    # The plan line says the memory overrode the model, and what the model would run.
    assert (f"the model alone would run 2 rollout worker(s) x 64 envs, inference policy_worker (1 policy "
            f"worker(s)) at {model_rate * 4:,.0f}; policy lag <=") in line
    assert model_rate == pytest.approx(plan.predicted["trained_steps_per_s"])
    # Where the memory agrees with the model, the line says nothing of an override.
    agree = choose(BATTLE, battle(), explicit=set(), memory=Recall({"policy_worker": 1.0, "local": 0.9}))
    assert agree.inference == "policy_worker" and "model alone" not in describe(agree, 4)


@pytest.mark.parametrize("measured, kept_runs", [(0.75, 1), (1.19, 10)])
def test_the_mode_no_run_measured_is_tried_once_it_comes_near(measured, kept_runs):
    # The policy worker trained far below its prediction, or ten runs were kept: local
    # inference, which the model puts 3% behind, takes the same scale and is run to
    # be measured.
    memory = Recall({"policy_worker": measured}, untried_due=kept_runs >= layout_memory.RETRY_AFTER)
    after = choose(BATTLE, battle(), explicit=set(), memory=memory)
    p = after.predicted
    assert (after.inference, after.num_workers, after.num_envs_per_worker) == ("local", 2, 32)
    assert p["untried"] and p["measured_scale"] == pytest.approx(measured)
    assert p["trained_steps_per_s"] == pytest.approx(measured * p["model_trained_steps_per_s"])
    assert (f"at {measured:.2f}x, as earlier runs of the other inference mode trained here (none here has "
            "measured local inference yet);") in describe(after, 4)
    # Once local has a run of its own, the two modes' measurements decide.
    slow_local = choose(BATTLE, battle(), explicit=set(), memory=Recall({"policy_worker": measured, "local": 0.7}))
    assert slow_local.inference == "policy_worker" and not slow_local.predicted.get("untried")


@pytest.mark.parametrize("measured", [1.06, 0.9, DOUBT_BELOW + 0.01])
def test_a_mode_that_measured_near_its_model_is_not_doubted_at_once(measured):
    # The policy worker trained above its prediction, or short of it by no more than quiet
    # runs differ: the model's 3% in its favour is no reason to spend a run on local
    # inference, until enough runs were kept.
    near = choose(BATTLE, battle(), explicit=set(), memory=Recall({"policy_worker": measured}))
    assert near.inference == "policy_worker" and not near.predicted.get("untried")
    later = choose(BATTLE, battle(), explicit=set(), memory=Recall({"policy_worker": 1.06}, untried_due=True))
    assert later.inference == "local" and later.predicted["untried"]


def test_a_mode_the_model_puts_far_behind_is_not_tried():
    # A cheap env step and a forward at 32 four times dearer a sample than at 64: 2 x
    # 32 local predicted ~22% behind policy workers, which batch 64. One run of policy
    # workers does not make local worth a try.
    costs = dataclasses.replace(BATTLE, env_s=150e-6, forward_s={4: 2e-3, 16: 1.5e-3, 32: 1.2e-3, 64: 3e-4, 128: 2e-4})
    first = choose(costs, battle(), explicit=set())
    local = choose(costs, dataclasses.replace(battle(), inference="local"), explicit={"inference"})
    assert first.inference == "policy_worker"
    assert local.predicted["trained_steps_per_s"] < (1 - UNTRIED_MARGIN) * first.predicted["trained_steps_per_s"]
    again = choose(costs, battle(), explicit=set(), memory=Recall({"policy_worker": 1.0}))
    assert again.inference == "policy_worker" and not again.predicted.get("untried")


def test_a_mode_the_model_puts_far_ahead_survives_a_bad_run():
    # 8 cores and a forward that only batching across workers makes cheap: policy
    # workers predicted ~2x local; the lowest scale a run can give them keeps them.
    costs = Costs(cores=8, env_s=1e-3, forward_s={4: 4e-3, 16: 2e-3, 64: 2e-4, 512: 1e-5}, train_s={1: 5e-6})
    setup = Config(env="CartPole-v1", max_policy_lag=100)
    low = layout_memory.SCALE_BOUNDS[0]
    assert choose(costs, setup, explicit=set()).inference == "policy_worker"
    assert choose(costs, setup, explicit=set(), memory=Recall({"policy_worker": low})).inference == "policy_worker"


def remember_runs(setup, inference, ratios, now=None):
    for r in ratios:
        layout_memory.remember(setup, FP32, inference, 1000.0, 1000.0 * r, now=now)


def test_a_trial_that_trained_slower_is_dropped_and_retried_only_after_many_runs(cache):
    # The run the model ranks first (a policy worker) measured at 0.75x of it; local,
    # tried once at the borrowed scale, measured 0.7x of its model: the next plan goes
    # back to the policy worker, and local is tried again only after RETRY_AFTER runs.
    setup = battle()
    remember_runs(setup, "policy_worker", [0.75])
    trial = choose(BATTLE, setup, explicit=set(), memory=layout_memory.recall(setup, FP32))
    assert trial.inference == "local" and trial.predicted["untried"]
    remember_runs(setup, "local", [0.7])
    plans = []
    for _ in range(layout_memory.RETRY_AFTER):
        plan = choose(BATTLE, setup, explicit=set(), memory=layout_memory.recall(setup, FP32))
        plans.append(plan.inference)
        remember_runs(setup, plan.inference, [1.06])
    assert plans == ["policy_worker"] * layout_memory.RETRY_AFTER
    retry = choose(BATTLE, setup, explicit=set(), memory=layout_memory.recall(setup, FP32))
    assert retry.inference == "local" and retry.predicted["retry"]
    assert "(local inference is tried again: its runs here are old);" in describe(retry, 4)
    # Confirmed slower: with two runs of its own it waits twice as long for the next try.
    remember_runs(setup, "local", [0.77])
    waits = 0
    while not choose(BATTLE, setup, explicit=set(), memory=layout_memory.recall(setup, FP32)).predicted.get("retry"):
        remember_runs(setup, "policy_worker", [1.06])
        waits += 1
    assert waits == 2 * layout_memory.RETRY_AFTER
    # Measured fast this time: its upper quartile now puts it ahead, and it stays.
    remember_runs(setup, "local", [1.3, 1.3])
    assert choose(BATTLE, setup, explicit=set(), memory=layout_memory.recall(setup, FP32)).inference == "local"


def test_a_scale_is_the_upper_quartile_of_the_last_runs_within_a_month(cache):
    setup = battle()
    assert layout_memory.recall(setup, FP32).scales == {}
    remember_runs(setup, "policy_worker", [0.94, 1.0, 0.9])
    assert layout_memory.recall(setup, FP32).scales == {"policy_worker": pytest.approx(0.97)}
    # One run slowed by something the gate did not see barely moves it.
    remember_runs(setup, "policy_worker", [0.46])
    assert layout_memory.recall(setup, FP32).scales["policy_worker"] == pytest.approx(0.955)
    # The last KEPT_RUNS of a mode: older runs drop out as the machine changes.
    remember_runs(setup, "policy_worker", [1.05] * layout_memory.KEPT_RUNS)
    assert layout_memory.recall(setup, FP32).scales["policy_worker"] == pytest.approx(1.05)
    # Bounded: however low its runs read, a mode keeps the lowest scale of its prediction.
    remember_runs(setup, "local", [0.1] * 3)
    assert layout_memory.recall(setup, FP32).scales["local"] == layout_memory.SCALE_BOUNDS[0]
    # A month on, nothing is left.
    later = layout_memory.time.time() + layout_memory.MAX_AGE_S + 1
    assert layout_memory.recall(setup, FP32, now=later).scales == {}
    layout_memory.forget(setup, FP32)
    assert layout_memory.recall(setup, FP32) == Recall()


WINDOW = layout_memory.RunWindow(seconds=120.0, foreign_cores=0.02, cores=2, longest_stall_s=0.0, step_s=0.5,
                                 restarts=0, policies=1, compiling=False)


@pytest.mark.parametrize("change, words", [
    ({}, ""),
    ({"policies": 2}, "a run of 2 policies"),
    ({"seconds": 10.0}, "its steady window was 10 s, under 30 s"),
    ({"foreign_cores": 0.9}, "other programs took 0.90 of its 2 cores"),
    ({"foreign_cores": None}, ""),  # not Linux: nothing to say it was disturbed
    ({"restarts": 1}, "1 restart(s) during the run"),
    ({"longest_stall_s": 12.0}, "the learner trained nothing for 12 s"),
    ({"longest_stall_s": 12.0, "step_s": 4.0}, ""),  # a slow learner's step, not a stall
    ({"compiling": True}, "a compile ended inside the window"),
])
def test_only_a_run_that_measured_its_layout_is_evidence(change, words):
    assert layout_memory.why_not_a_measure(WINDOW._replace(**change)) == words


@pytest.mark.parametrize("other", [
    {"cfg": {"batch_size": 2048}}, {"cfg": {"env": "doom_defend_the_center"}}, {"cfg": {"device": "cuda"}},
    {"precision": Precision("bf16", "fp32", "test")},
])
def test_another_setup_precision_or_device_has_a_memory_of_its_own(cache, other):
    setup = battle()
    remember_runs(setup, "local", [1.2])
    elsewhere = dataclasses.replace(setup, **other.get("cfg", {}))
    assert layout_memory.recall(elsewhere, other.get("precision", FP32)).scales == {}
    assert layout_memory.recall(setup, FP32).scales == {"local": pytest.approx(1.2)}


def test_an_unreadable_memory_is_no_memory(cache):
    setup = battle()
    remember_runs(setup, "local", [1.2])
    path = layout_memory._path(setup, FP32)
    now = layout_memory.time.time()
    good = {"inference": "policy_worker", "ratio": 0.9, "at": now, "n": 1}
    for text, scales in (("{not json", {}), ("[1, 2]", {}), ('{"runs": "many"}', {}),
                         (json.dumps({"runs": [{"inference": "local", "ratio": "fast", "at": now, "n": 2},
                                               {"inference": "local", "ratio": -1, "at": now, "n": 3}, good],
                                      "count": "x"}), {"policy_worker": 0.9})):
        with open(path, "w") as fh:
            fh.write(text)
        assert layout_memory.recall(setup, FP32).scales == pytest.approx(scales)
    remember_runs(setup, "local", [1.1])  # a damaged count starts again from the runs
    assert layout_memory.recall(setup, FP32).scales == pytest.approx({"policy_worker": 0.9, "local": 1.1})


def test_the_plan_takes_what_runs_measured_and_fresh_forgets_it(cache, monkeypatch, capsys):
    import gymnasium

    from fastrl.runtime import runner
    from fastrl.tuning import profiling

    profiled = []
    monkeypatch.setattr(profiling, "cached_costs",
                        lambda *args, fresh=False, **kwargs: profiled.append(fresh) or (BATTLE, not fresh, False))
    screen = type("Env", (), {"observation_space": gymnasium.spaces.Box(0, 255, (3, 72, 128), "uint8")})()
    setup = dataclasses.replace(battle(), compile_learner="off", device="cpu")
    assert runner.make_plan(setup, set(), screen, resuming=False, precision=FP32).inference == "policy_worker"
    remember_runs(setup, "policy_worker", [0.75])
    plan = runner.make_plan(setup, set(), screen, resuming=False, precision=FP32)
    assert plan.inference == "local" and plan.predicted["untried"]
    fresh = runner.make_plan(dataclasses.replace(setup, plan="fresh"), set(), screen, resuming=False, precision=FP32)
    assert fresh.inference == "policy_worker" and "measured_scale" not in fresh.predicted
    assert profiled == [False, False, True]
    assert "--plan fresh: this setup's profile and earlier runs here are forgotten" in capsys.readouterr().out
    assert layout_memory.recall(setup, FP32) == Recall()


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
    assert plan_file(dataclasses.replace(setup, plan="fresh"), resuming=True) is None  # fresh always plans
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
        _stopped_at = None
        _mark_now = runner.Runner._mark_now
        steady_window = runner.Runner.steady_window

    run = Trained()
    run._trained_marks = [runner.TrainedMark(now - 100.0 + t, 20.0 * min(t, 50.0) + 100.0 * max(t - 50.0, 0.0), None)
                          for t in range(10, 100, 10)]
    assert runner.Runner.steady_trained_steps_per_s(run) == pytest.approx(100.0, rel=0.01)
    # The window closes where the loop stopped, not 30 s later, after the shutdown.
    run.training_since -= 30.0
    run._trained_marks = [m._replace(at=m.at - 30.0) for m in run._trained_marks]
    assert runner.Runner.steady_trained_steps_per_s(run) < 70.0
    run._stopped_at = runner.TrainedMark(now - 30.0, 6000.0, None)
    assert runner.Runner.steady_trained_steps_per_s(run) == pytest.approx(100.0, rel=0.01)
    run.training_since, run._trained_marks, run._stopped_at = now - 100.0, [], None
    assert runner.Runner.steady_trained_steps_per_s(run) == pytest.approx(60.0, rel=0.01)


SHORT = ["--env", "CartPole-v1", "--status_every_seconds", "1", "--hidden_sizes", "16"]


def memory_files(cache_home) -> list:
    folder = os.path.join(cache_home, "fastrl", "profiles")
    files = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        with open(os.path.join(folder, name)) as fh:
            if "runs" in json.load(fh):
                files.append(os.path.join(folder, name))
    return files


def kept_runs(cache_home) -> int:
    files = memory_files(cache_home)
    if not files:
        return 0
    (path,) = files
    with open(path) as fh:
        return len(json.load(fh)["runs"])


def short_run(tmp_path, cache_home, *args, during=None, seconds=14):
    """A CartPole run judged by the layout memory on a 3-s window; `during(run,
    first_batch_s, seconds)` is called once it trains. Returns its output."""
    run = TrainRun([*SHORT, "--train_dir", str(tmp_path), "--train_for_seconds", str(seconds), *args],
                   module="short_window_train", env={**TEST_ENVS_ON_PATH, "XDG_CACHE_HOME": str(cache_home)})
    try:
        if during is not None:
            line = run.wait_for_line(lambda line: "first batch trained" in line, 60)
            during(run, float(re.search(r"trained ([0-9.]+) s after launch", line).group(1)), seconds)
        assert run.wait(90) == 0, run.output()
    finally:
        run.kill_all()
    assert not run.leftover_processes()
    return run.output()


def quiet_run(tmp_path, cache_home) -> str:
    """short_run's output on a quiet machine. Its window is 3 s, so a burst from outside
    the test (the kernel writing back an earlier test's files) can disturb it; the run
    rightly keeps nothing then, and one more run is the quiet one asked for."""
    out = short_run(tmp_path / "quiet", cache_home)
    if "this rate is not kept for the next plan: other programs took" in out:
        out = short_run(tmp_path / "quiet_again", cache_home)
    return out


def burn(cores: int, seconds: float) -> None:
    """Keep `cores` cores busy for `seconds` in other processes, as a second job would."""
    spin = "import time\nt = time.time()\nwhile time.time() - t < 60: pass"
    burners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(cores)]
    try:
        time.sleep(seconds)
    finally:
        for b in burners:
            b.kill()
            b.wait()


def stop_learner(run, first_batch_s: float, seconds: float) -> None:
    """SIGSTOP the run's learner for most of its training's second half, as a frozen
    machine or a debugger would."""
    training = seconds - first_batch_s
    time.sleep(max(0.0, first_batch_s + 0.55 * training - (time.time() - run.started)))
    run._note_descendants()
    (pid,) = [p for p, title in run.titles.items() if title.startswith("fastrl: learner")]
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(0.35 * training)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_stall_is_the_longest_run_of_reports_that_trained_nothing():
    from fastrl.runtime.runner import TrainedMark, longest_stall

    marks = [TrainedMark(t, trained, None) for t, trained in
             [(0, 0), (1, 10), (2, 10), (3, 10), (4, 10), (5, 20), (6, 20), (7, 30)]]
    assert longest_stall(marks) == 3.0
    assert longest_stall(marks[:2]) == 0.0


def test_a_quiet_run_is_remembered_and_a_disturbed_stopped_or_shared_one_is_not(tmp_path):
    cache_home = tmp_path / "cache"
    out = quiet_run(tmp_path, cache_home)
    assert "this rate is kept for the next plan of this setup" in out, out
    assert kept_runs(cache_home) == 1

    out = short_run(tmp_path / "burnt", cache_home, during=lambda run, *_: burn(2, 9))
    assert re.search(r"this rate is not kept for the next plan: other programs took [0-9.]+ of its \d+ cores", out), out
    out = short_run(tmp_path / "stopped", cache_home, during=stop_learner, seconds=24)
    assert re.search(r"this rate is not kept for the next plan: the learner trained nothing for \d+ s", out), out
    out = short_run(tmp_path / "two", cache_home, "--num_policies", "2")
    assert "this rate is not kept for the next plan: a run of 2 policies" in out, out
    assert kept_runs(cache_home) == 1
