"""The bench CLI as a user runs it, and its bottleneck sentence: on hand-made
fractions, and on deliberately learner-bound and env-bound runs."""
import dataclasses
import json
import math
import types

import pytest
from helpers import TEST_ENVS_ON_PATH, TrainRun

from fastrl import bench
from fastrl.bench import forward_batch_sizes
from fastrl.config import Config
from fastrl.tuning.bottleneck import diagnose
from fastrl.tuning.profiling import EnvProfile, ModelProfile, compute_bound_limit, mean_env_profile, mean_model_profile

QUICK = ["--seconds", "2", "--warmup", "1"]
BOTTLENECK = ["--seconds", "3", "--warmup", "1"]  # a few learner batches even when each takes ~0.5 s
# The bottleneck tests measure the layout they ask for, not one the planner picks.
AS_GIVEN = ["--plan", "off", "--num_workers", "1", *BOTTLENECK]
# Zero is a real measurement here: the freshest sample of a batch has lag 0, no
# sample may have been too stale to train on, no other program may have run, and
# the plan leaves the workers' niceness at 0 when every process has a core.
# Every other number must be positive.
MAY_BE_ZERO = {("lag", "min"), ("staleness", "dropped_fraction"), ("cpu_cores_used", "by_other_programs"),
               ("plan", "worker_nice")}


def _leaves(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, path + (i,))
    else:
        yield path, node


def _bench(tmp_path, args: list, env: dict | None = None) -> tuple:
    out = tmp_path / "bench.json"
    run = TrainRun([*args, "--json", str(out)], module="fastrl.bench", env=env)
    assert run.wait(timeout=120) == 0, run.output()
    with open(out) as fh:
        return json.load(fh), run


def _own_shm_entries(run) -> set:
    """New /dev/shm entries this run left. Other runs share the machine's /dev/shm:
    their torch segments name their creator (torch_<pid>_...), and CartPole makes
    no ViZDoom ones."""
    ours = {str(pid) for pid in run.descendants | {run.proc.pid}}
    return {e for e in run.new_shm_entries()
            if not e.startswith("ViZDoom") and (not e.startswith("torch_") or e.split("_")[1] in ours)}


# --------------------------------------------------------------------------------------
# The CLI

def test_all_modes_write_a_complete_report_and_leave_nothing_behind(tmp_path):
    report, run = _bench(tmp_path, ["--env", "CartPole-v1", "--mode", "all", *QUICK])
    assert set(report["results"]) == {"env", "infer", "sample", "train"}
    ratios = report["ratios"]
    assert set(ratios) == {"train_over_env_limit", "train_over_compute_bound", "sample_over_env_limit",
                           "train_cores_busy_fraction", "limit_over_train_core_s_per_step"}
    # The ratio to the limit splits exactly into the cores kept busy and the core time a step took.
    assert ratios["train_cores_busy_fraction"] * ratios["limit_over_train_core_s_per_step"] == pytest.approx(
        ratios["train_over_compute_bound"], rel=1e-9)
    # CartPole runs inside its workers: no env processes to count.
    assert set(report["results"]["train"]["core_s_per_step"]) == {"learner", "rollout workers", "runner"}
    assert report["config"]["plan"] == "off" and report["plan"]["description"].startswith("plan: ")  # planned once
    assert report["bottleneck"] == report["results"]["train"]["bottleneck"]
    assert {"cpu", "usable_cores", "gpu", "torch", "python"} <= set(report["machine"])
    assert report["precision"] == {"acting": "fp32", "learning": "fp32", "why": "no image encoder"}
    checked = 0
    for path, value in _leaves({k: v for k, v in report.items() if k != "config"}):  # config: the user's inputs
        if value is None:
            assert path == ("machine", "gpu"), f"{path} is empty"
        elif isinstance(value, str):
            assert value, f"{path} is an empty string"
        else:
            assert not isinstance(value, bool), f"{path} is a flag, not a measurement"
            assert math.isfinite(value) and (value > 0 or path[-2:] in MAY_BE_ZERO), f"{path} = {value}"
            checked += 1
    assert checked > 40
    # The limits were measured on both sides of the runs, and the report says so.
    assert len(report["results"]["infer"]["compute_bound"]["before_and_after_steps_per_s"]) == 2
    text = run.output()
    for line in ("env-limit", "compute-bound limit", "x env-limit", "where the time goes (train",
                 "policy lag", "bottleneck: ", "half a window before the runs", "cores kept busy",
                 "core time per agent step: learner", "precision: fp32 (no image encoder)"):
        assert line in text, text
    assert run.leftover_processes() == []
    assert _own_shm_entries(run) == set()


def test_doom_engines_count_as_env_processes_in_a_steps_core_time(tmp_path):
    pytest.importorskip("vizdoom")
    report, run = _bench(tmp_path, [*AS_GIVEN, "--env", "doom_basic", "--mode", "sample", "--num_envs_per_worker", "4"])
    per_step = report["results"]["sample"]["core_s_per_step"]
    assert set(per_step) == {"sink", "rollout workers", "env processes", "runner"}, per_step
    # The engine renders and runs the game: it takes a real part of every step.
    assert per_step["env processes"] > 0.1 * sum(per_step.values()), per_step
    assert run.leftover_processes() == []


EDGE_GAP = bench.EDGE_SNAPSHOT_S + 0.05  # a batch right after a reading may wait for the next


class _Board:
    """The runner's stats board as _Window reads it: a consumer taking a batch every
    `batch_every_s`, after every process has started."""

    def __init__(self, batch_every_s: float):
        self.batch_every_s, self.now = batch_every_s, 0.0
        self.row_names = ["runner", "learner", "rollout_0"]

    def get(self, row: str, field: str) -> float:
        batches = int(self.now / self.batch_every_s) + 1
        if field in ("samples_received", "learner_steps"):
            return float(batches)
        return 1.0 if field in ("heartbeat", "env_steps") else 0.0


def test_the_window_reads_the_runs_cpu_at_batches_and_seldom_between(monkeypatch):
    # Reading every process's CPU at each 50-ms poll took a tenth of the cores from
    # the run being measured; the window needs a reading only at its edges.
    reads = []

    def read_cpu(runner):
        reads.append(runner.ctx.board.now)
        return {}, 0.0

    monkeypatch.setattr(bench, "_cpu_seconds", read_cpu)
    for batch_every_s in (1.3, 0.15):  # a learner, and a sink that frees buffers every few polls
        reads.clear()
        board = _Board(batch_every_s)
        runner = types.SimpleNamespace(ctx=types.SimpleNamespace(board=board), cfg=types.SimpleNamespace())
        window = bench._Window(warmup=1.0, seconds=10.0, progress=types.SimpleNamespace(at=lambda e: None))
        poll = 0
        while poll == 0 or board.now < runner.cfg.train_for_seconds:  # the window sets when the run stops
            board.now = poll * 0.05
            window(runner, board.now)
            poll += 1
        assert len(reads) <= 2 * 10 + 1, reads  # not one at each of the window's 200 polls
        (t0, *_), (t1, *_) = window.edges()
        # Both edges fall on polls where a batch was just taken, one batch apart at most
        # from the window's ends.
        for t in (t0, t1):
            assert min(t % batch_every_s, batch_every_s - t % batch_every_s) < 0.05 + 1e-9, (t, batch_every_s)
        assert t0 <= 1.0 + batch_every_s + 0.05 and t1 >= 11.0 - batch_every_s - EDGE_GAP, (t0, t1)


def _poll_until_stopped(window, runner, board, report_at=None, report=None):
    poll = 0
    while poll == 0 or board.now < runner.cfg.train_for_seconds:
        board.now = poll * 0.05
        if report_at is not None and board.now >= report_at:
            runner.metrics[bench.COMPILE_KEY] = report
        window(runner, board.now)
        poll += 1


def test_a_compiling_learners_window_begins_once_it_chose_its_step(monkeypatch):
    # A window that opened while the learner compiled would time eager steps, the
    # switch and compiled ones together; the warm-up waits for the choice instead.
    monkeypatch.setattr(bench, "_cpu_seconds", lambda runner: ({}, 0.0))
    board = _Board(0.3)
    runner = types.SimpleNamespace(ctx=types.SimpleNamespace(board=board), cfg=types.SimpleNamespace(), metrics={})
    window = bench._Window(warmup=1.0, seconds=4.0, progress=types.SimpleNamespace(at=lambda e: None),
                           awaits_compile=True)
    _poll_until_stopped(window, runner, board, report_at=7.0, report={"chosen": "compiled"})
    (t0, *_), (t1, *_) = window.edges()
    assert 7.0 <= t0 <= 7.0 + 0.3 + 0.05 and t1 >= 11.0 - 0.3 - EDGE_GAP, (t0, t1)
    assert window.compile_waited_s == pytest.approx(6.0, abs=0.06)
    assert runner.cfg.train_for_seconds == pytest.approx(11.0, abs=0.06)  # the window's end, not the wait's cap


def test_the_window_waits_for_the_rollout_workers_compile_too(monkeypatch):
    # The learner chose at 2 s, the workers at 6 s: the window times the forward they keep.
    monkeypatch.setattr(bench, "_cpu_seconds", lambda runner: ({}, 0.0))
    board = _Board(0.3)
    runner = types.SimpleNamespace(ctx=types.SimpleNamespace(board=board), cfg=types.SimpleNamespace(), metrics={},
                                   actor_compiles_said=False)
    window = bench._Window(warmup=1.0, seconds=4.0, progress=types.SimpleNamespace(at=lambda e: None),
                           awaits_compile=True, awaits_actors=True)
    poll = 0
    while poll == 0 or board.now < runner.cfg.train_for_seconds:
        board.now = poll * 0.05
        if board.now >= 2.0:
            runner.metrics[bench.COMPILE_KEY] = {"chosen": "compiled"}
        runner.actor_compiles_said = board.now >= 6.0
        window(runner, board.now)
        poll += 1
    (t0, *_), _ = window.edges()
    assert 6.0 <= t0 <= 6.0 + 0.3 + 0.05, t0
    assert window.compile_waited_s == pytest.approx(5.0, abs=0.06)


def test_a_compile_that_never_settles_opens_the_window_at_the_cap(monkeypatch):
    monkeypatch.setattr(bench, "_cpu_seconds", lambda runner: ({}, 0.0))
    monkeypatch.setattr(bench, "COMPILE_WAIT_S", 3.0)
    board = _Board(0.3)
    runner = types.SimpleNamespace(ctx=types.SimpleNamespace(board=board), cfg=types.SimpleNamespace(), metrics={})
    window = bench._Window(warmup=1.0, seconds=2.0, progress=types.SimpleNamespace(at=lambda e: None),
                           awaits_compile=True)
    _poll_until_stopped(window, runner, board)
    (t0, *_), _ = window.edges()
    assert 3.0 <= t0 <= 3.0 + 0.3 + 0.05 and window.compile_waited_s == pytest.approx(2.0, abs=0.06)


@pytest.mark.parametrize("report, ratio", [
    ({"chosen": "compiled", "ratio": 0.5}, 0.5),
    ({"chosen": "eager", "ratio": 0.97}, None),  # timed, not faster: the run trained eagerly
    ({"chosen": "compiled", "ratio": None}, None),  # --compile_learner on: never timed against eager
    (None, None),  # a learner that does not compile
])
def test_the_limit_is_that_of_the_learner_step_the_train_run_kept(report, ratio):
    env = EnvProfile(env="x", num_procs=2, envs_per_proc=8, frameskip=4, window_s=1.0, steps_per_s=2e5,
                     frames_per_s=8e5, seconds_per_step=10e-6, seconds_per_frame=2.5e-6)
    model = ModelProfile(device="cpu", threads=[1], forward_batch_sizes=[8], forward_s_per_sample={1: {8: 6e-6}},
                         train_minibatch=256, ppo_epochs=1, train_s_per_sample={1: 20e-6})
    results = {"train": {} if report is None else {"learner_compile": report}}
    bench._report_limits(results, [(env, model), (env, model)], Config(env="x", num_envs_per_worker=8))
    bound = results["infer"]["compute_bound"]
    learn = 20e-6 * (ratio or 1.0)
    assert bound["core_s_per_step"]["learn"] == pytest.approx(learn)
    assert bound["before_and_after_steps_per_s"] == pytest.approx([2 / (16e-6 + learn)] * 2)
    assert bound.get("learn_compiled_ratio") == ratio
    assert results["infer"]["learner_core_s_per_sample"] == pytest.approx(20e-6)  # the eager measurement itself


@pytest.mark.parametrize("reports, ratio", [
    ([{"chosen": "compiled", "ratio": 0.8}, {"chosen": "compiled", "ratio": 0.6}], 0.7),
    ([{"chosen": "compiled", "ratio": 0.8}, {"chosen": "eager", "ratio": 0.97}], 0.9),  # one worker acted eagerly
    ([{"chosen": "eager", "ratio": 0.97}] * 2, None),
    ([{"chosen": "compiled", "ratio": None}] * 2, None),  # --compile_actors on: never timed against eager
    (None, None),  # workers that do not compile, or a run that never settled
])
def test_the_limit_is_that_of_the_forward_the_train_runs_workers_kept(reports, ratio):
    env = EnvProfile(env="x", num_procs=2, envs_per_proc=8, frameskip=4, window_s=1.0, steps_per_s=2e5,
                     frames_per_s=8e5, seconds_per_step=10e-6, seconds_per_frame=2.5e-6)
    model = ModelProfile(device="cpu", threads=[1], forward_batch_sizes=[8], forward_s_per_sample={1: {8: 6e-6}},
                         train_minibatch=256, ppo_epochs=1, train_s_per_sample={1: 20e-6})
    results = {"train": {} if reports is None else {bench.ACT_COMPILE_KEY: reports}}
    bench._report_limits(results, [(env, model)], Config(env="x", num_envs_per_worker=8))
    bound = results["infer"]["compute_bound"]
    assert bound["core_s_per_step"]["forward"] == pytest.approx(6e-6 * (ratio or 1.0))
    assert bound.get("forward_compiled_ratio") == (None if ratio is None else pytest.approx(ratio))
    assert results["infer"]["forward"]  # the eager measurement itself is reported as timed


def test_unknown_env_is_one_sentence_and_exit_2(tmp_path):
    run = TrainRun(["--env", "NoSuchEnv-v9", "--mode", "env"], module="fastrl.bench")
    assert run.wait(timeout=60) == 2, run.output()
    errors = [line for line in run.lines if line.startswith("fastrl.bench: error:")]
    assert len(errors) == 1 and "NoSuchEnv-v9" in errors[0], run.output()


# --------------------------------------------------------------------------------------
# The bottleneck, measured

def test_huge_batches_on_a_tiny_env_are_learner_bound(tmp_path):
    report, run = _bench(tmp_path, [*AS_GIVEN, "--env", "CartPole-v1", "--mode", "train", "--batch_size", "1024",
                                    "--ppo_epochs", "4", "--hidden_sizes", "512,512"])
    train = report["results"]["train"]
    parts = train["fractions"]
    assert train["bottleneck"].startswith("learner-bound"), run.output()
    assert parts["learner"]["busy"] > 0.8 and parts["rollout"]["wait"] > parts["learner"]["wait"], parts


def test_a_slow_env_with_a_tiny_model_is_env_bound(tmp_path):
    report, run = _bench(tmp_path, [*AS_GIVEN, "--env", "slow_env:SlowEnv-v0", "--mode", "train",
                                    "--num_envs_per_worker", "8", "--rollout", "16", "--batch_size", "128",
                                    "--num_minibatches", "1", "--ppo_epochs", "1", "--hidden_sizes", "8"],
                         env=TEST_ENVS_ON_PATH)
    train = report["results"]["train"]
    parts = train["fractions"]
    assert train["bottleneck"].startswith("env-bound"), run.output()
    assert parts["rollout"]["busy"] > 0.8 and parts["learner"]["wait"] > 0.5, parts


# --------------------------------------------------------------------------------------
# The bottleneck sentence on hand-made fractions

def test_learner_busy_and_workers_waiting_is_learner_bound():
    sentence = diagnose({"rollout": {"busy": 0.35, "wait": 0.6, "comm": 0.05, "count": 4},
                         "learner": {"busy": 0.97, "wait": 0.02, "comm": 0.01}})
    assert sentence == "learner-bound: the learner is busy 97% training, rollout workers wait 60%."


def test_workers_busy_and_learner_waiting_is_env_bound():
    fractions = {"rollout": {"busy": 0.95, "wait": 0.02, "comm": 0.03},
                 "learner": {"busy": 0.25, "wait": 0.7, "comm": 0.05}}
    assert diagnose(fractions) == ("env-bound: rollout workers are busy 95% stepping envs and computing their "
                                   "actions, the learner waits 70%.")
    fractions["policy"] = {"busy": 0.4, "wait": 0.55, "comm": 0.05}
    assert diagnose(fractions) == "env-bound: rollout workers are busy 95% stepping envs, the learner waits 70%."


def test_policy_workers_busy_is_inference_bound_and_oversubscription_is_named():
    fractions = {"rollout": {"busy": 0.3, "wait": 0.55, "comm": 0.15, "count": 4},
                 "policy": {"busy": 0.93, "wait": 0.02, "comm": 0.05},
                 "learner": {"busy": 0.3, "wait": 0.7, "comm": 0.0}}
    assert diagnose(fractions, cores=8) == ("inference-bound: policy workers are busy 93% computing actions, "
                                            "rollout workers wait 55%.")
    # 4 x 0.45 + 0.98 + 0.3 = 3.1 cores' worth of activity on 2 cores
    assert diagnose(fractions, cores=2).endswith("; together the processes are active 3.1 cores' worth on 2 cores, "
                                                 "so they also wait for CPU.")


def test_heavy_communication_is_named_and_nobody_saturated_is_latency_bound():
    copying = diagnose({"rollout": {"busy": 0.2, "wait": 0.75, "comm": 0.05},
                        "learner": {"busy": 0.55, "wait": 0.1, "comm": 0.35}})
    assert copying == "learner-bound: the learner is busy 55% training and 35% moving data, rollout workers wait 75%."
    idle = diagnose({"rollout": {"busy": 0.3, "wait": 0.6, "comm": 0.1}, "sink": {"wait": 0.95, "comm": 0.05}})
    assert idle.startswith("latency-bound: no component is active half of its time (the busiest: rollout workers")


def test_two_saturated_components_that_never_wait_are_balanced():
    sentence = diagnose({"rollout": {"busy": 0.97, "wait": 0.03}, "learner": {"busy": 0.96, "wait": 0.03}})
    assert sentence == ("balanced: rollout workers (busy 97%) and the learner (busy 96%) keep pace with each other, "
                        "neither waits more than 3%.")
    # Both busy, but the workers wait a tenth of their time for the learner: it sets the pace.
    assert diagnose({"rollout": {"busy": 0.9, "wait": 0.1}, "learner": {"busy": 0.98, "wait": 0.01}}).startswith(
        "learner-bound")


def test_cores_taken_by_other_programs_are_named():
    fractions = {"rollout": {"busy": 0.95, "wait": 0.02}, "learner": {"busy": 0.25, "wait": 0.7}}
    assert diagnose(fractions, cores=2, others_cores=1.43).endswith(
        "; other programs on this machine used 1.4 of its 2 cores meanwhile.")
    assert "other programs" not in diagnose(fractions, cores=2, others_cores=0.1)


def test_a_busy_gpu_is_the_bottleneck_and_an_idle_one_points_at_host_work():
    # On a GPU run the learner counts as busy while it waits for its kernels, so only
    # the GPU's own share tells the two apart.
    fractions = {"rollout": {"busy": 0.4, "wait": 0.55}, "policy": {"busy": 0.5, "wait": 0.4},
                 "learner": {"busy": 0.98, "wait": 0.01}}
    assert diagnose(fractions, gpu_busy=0.93) == ("gpu-bound: the GPU is busy 93% of the time, and the learner and "
                                                  "policy workers wait for its kernels.")
    assert diagnose(fractions, gpu_busy=0.4) == ("learner-bound: the learner is busy 98% training, rollout workers "
                                                 "wait 55%; the GPU is busy only 40%, so it is the learner's host "
                                                 "work that limits.")
    env_bound = {"rollout": {"busy": 0.97, "wait": 0.01}, "learner": {"busy": 0.3, "wait": 0.7}}
    assert "GPU" not in diagnose(env_bound, gpu_busy=0.2)


def test_a_full_gpu_does_not_hide_rollout_workers_that_hold_the_run_up():
    # An H200 run of doom_defend_the_center, 8 workers x 64 envs and one GPU policy
    # worker: the GPU's spans added to 110% of the window, yet the rollout workers
    # were busy 98% while the policy worker and the learner waited a quarter of theirs.
    fractions = {"rollout": {"busy": 0.98, "wait": 0.0, "comm": 0.01, "count": 8},
                 "policy": {"busy": 0.49, "wait": 0.24, "comm": 0.26},
                 "learner": {"busy": 0.56, "wait": 0.24, "comm": 0.19}}
    assert diagnose(fractions, gpu_busy=1.0) == ("env-bound: rollout workers are busy 98% stepping envs, "
                                                 "the learner waits 24%.")


def _deltas(table: dict):
    return (lambda row, field: table.get(row, {}).get(field, 0.0)), (lambda prefix: [r for r in table
                                                                                      if r.startswith(prefix)])


def test_the_gpu_report_splits_the_device_time_by_what_ran():
    delta, rows = _deltas({
        "learner": {"gpu_s": 6.0, "h2d_s": 1.0, "learner_steps": 100},
        "policy_0": {"gpu_s": 1.5, "d2h_s": 0.25, "inference_batches": 500},
        "policy_1": {"gpu_s": 1.5, "d2h_s": 0.25, "inference_batches": 500},
        "rollout_0": {"env_steps": 50_000}})
    gpu = bench._gpu_report(delta, rows, dt=20.0, steps=100_000)
    assert gpu["busy"] == pytest.approx(10.5 / 20)
    assert gpu["shares"] == pytest.approx({"learner": 0.3, "policy": 0.15, "h2d": 0.05, "d2h": 0.025})
    assert gpu["s_per_step"] == pytest.approx(10.5 / 100_000) and gpu["wall_s_per_step"] == pytest.approx(2e-4)
    assert gpu["h2d_s_per_batch"] == pytest.approx(0.01) and gpu["d2h_s_per_forward"] == pytest.approx(5e-4)
    lines = bench._gpu_lines(gpu)
    assert lines[0].startswith("  GPU: busy 52% of the window (learner's steps 30%, policy workers' forwards 15%, "
                               "batch uploads 5%, action copies 2%)")
    assert lines[1] == "  GPU copies: upload 10.00 ms a batch, actions back 0.500 ms a forward"
    # Overlapping spans of several processes can add up past the wall time.
    assert len(lines) == 2  # spans within the window need no word on overlap
    delta, rows = _deltas({"learner": {"gpu_s": 30.0, "learner_steps": 1}, "policy_0": {"gpu_s": 5.0}})
    gpu = bench._gpu_report(delta, rows, dt=20.0, steps=10)
    assert gpu["busy"] == 1.0 and gpu["spanned"] == pytest.approx(1.75)
    assert bench._gpu_lines(gpu)[1].startswith("  GPU: the spans add to 175% of the window: those of different "
                                               "processes overlap")


def test_a_run_without_gpu_time_has_no_gpu_report():
    delta, rows = _deltas({"learner": {"busy_s": 9.0, "learner_steps": 10}, "rollout_0": {"env_steps": 100}})
    assert bench._gpu_report(delta, rows, dt=10.0, steps=100) is None


def test_unknown_component_is_refused():
    with pytest.raises(ValueError, match="components among"):
        diagnose({"gpu": {"busy": 1.0}})


# --------------------------------------------------------------------------------------
# The compute-bound limit and the batch sizes it is taken at

def test_compute_bound_limit_divides_the_cores_by_the_core_time_of_one_step():
    env = EnvProfile(env="x", num_procs=2, envs_per_proc=8, frameskip=4, window_s=1.0, steps_per_s=2e5,
                     frames_per_s=8e5, seconds_per_step=10e-6, seconds_per_frame=2.5e-6)
    model = ModelProfile(device="cpu", threads=[1, 2], forward_batch_sizes=[32],
                         forward_s_per_sample={1: {32: 6e-6}, 2: {32: 4e-6}},  # 2 threads: 8 core-us, worse
                         train_minibatch=256, ppo_epochs=2,
                         train_s_per_sample={1: 12e-6, 2: 5e-6})  # 2 threads: 10 core-us, better
    limit = compute_bound_limit(env, model, forward_batch=32, cores=4)
    assert limit["core_s_per_step"] == pytest.approx({"env": 10e-6, "forward": 6e-6, "learn": 20e-6})
    assert limit["steps_per_s"] == pytest.approx(4 / 36e-6)
    assert limit["frames_per_s"] == pytest.approx(4 * 4 / 36e-6)


def test_limits_measured_before_and_after_the_runs_average_their_costs():
    before = EnvProfile(env="x", num_procs=2, envs_per_proc=8, frameskip=4, window_s=5.0, steps_per_s=2e5,
                        frames_per_s=8e5, seconds_per_step=10e-6, seconds_per_frame=2.5e-6)
    after = dataclasses.replace(before, steps_per_s=1e5, frames_per_s=4e5, seconds_per_step=20e-6,
                                seconds_per_frame=5e-6)  # the machine ran at half speed
    env = mean_env_profile([before, after])
    assert env.seconds_per_step == pytest.approx(15e-6) and env.seconds_per_frame == pytest.approx(3.75e-6)
    assert env.steps_per_s == pytest.approx(2 / 15e-6) and env.frames_per_s == pytest.approx(4 * 2 / 15e-6)
    assert env.window_s == 10.0 and env.num_procs == 2
    model = ModelProfile(device="cpu", threads=[1], forward_batch_sizes=[32], forward_s_per_sample={1: {32: 6e-6}},
                         train_minibatch=256, ppo_epochs=2, train_s_per_sample={1: 12e-6})
    slower = dataclasses.replace(model, forward_s_per_sample={1: {32: 8e-6}}, train_s_per_sample={1: 16e-6})
    mean = mean_model_profile([model, slower])
    assert mean.forward_s_per_sample[1] == pytest.approx({32: 7e-6})
    assert mean.train_s_per_sample == pytest.approx({1: 14e-6}) and mean.ppo_epochs == 2
    limit = compute_bound_limit(env, mean, forward_batch=32, cores=2)
    assert limit["steps_per_s"] == pytest.approx(2 / (15e-6 + 7e-6 + 2 * 14e-6))


def test_forward_batch_sizes_follow_the_inference_placement():
    assert forward_batch_sizes(Config(env="x", num_workers=4, num_envs_per_worker=16)) == [16]
    served = Config(env="x", num_workers=4, num_envs_per_worker=16, inference="policy_worker", num_policy_workers=2)
    assert forward_batch_sizes(served) == [8, 16]  # one split of 8 envs, or one split from each of the 2 workers served


def test_model_timings_interleave_rounds_and_take_the_median():
    # A fake clock that each call moves on by its own cost: one round of "b" is
    # disturbed (10x), as a busy second on the machine would do to a block of calls.
    import torch

    from fastrl.tuning import profiling

    now, calls, thread_counts = [0.0], [], []
    slow_call_of_b = profiling.WARMUP_CALLS + 3  # b's third timed call

    def call(name, cost):
        def fn():
            calls.append(name)
            thread_counts.append(torch.get_num_threads())
            disturbed = name == "b" and calls.count("b") == slow_call_of_b
            now[0] += cost * (10 if disturbed else 1)
        return fn

    previous = torch.get_num_threads()
    try:
        medians, capped = profiling.time_interleaved({"a": (1, call("a", 1e-3)), "b": (2, call("b", 2e-3)),
                                                      "c": (1, call("c", 3e-3))}, seconds=0.0, min_rounds=5,
                                                     clock=lambda: now[0])
    finally:
        torch.set_num_threads(previous)
    assert medians == pytest.approx({"a": 1e-3, "b": 2e-3, "c": 3e-3}) and not capped
    timed = calls[3 * profiling.WARMUP_CALLS:]
    assert timed == ["a", "b", "c"] * 5  # rounds, not blocks, and at least min_rounds of them
    assert thread_counts[3 * profiling.WARMUP_CALLS:] == [1, 2, 1] * 5  # each call on its own thread count


def test_model_timings_run_until_the_budget_is_spent():
    from fastrl.tuning import profiling

    now = [0.0]

    def fn():
        now[0] += 0.1

    timed = profiling.time_interleaved({"x": (1, fn)}, seconds=1.0, min_rounds=1, clock=lambda: now[0])
    assert timed.per_call["x"] == pytest.approx(0.1) and not timed.capped
    assert now[0] == pytest.approx(0.1 * (profiling.WARMUP_CALLS + 10))


@pytest.mark.parametrize("cap_s, order, past_cap", [
    # Past the cap in the warm-up: the warm-up calls left are skipped, and each key
    # is timed on one call, started past the cap.
    (2.5, "aab" "abc", "abc"),
    # Past the cap in the second round: the call in progress is the last.
    (9.5, "aabbcc" "abc" "a", ""),
])
def test_a_wall_clock_cap_ends_the_timing_however_slow_the_calls(monkeypatch, cap_s, order, past_cap):
    # Every call takes 1 s, as on a machine too busy to give these calls a core: the
    # budget (100 s) and the rounds it asks for (3) would take 15 s. The cap ends
    # the timing with a number for every key, and no call starts past it but a
    # key's first timed one.
    from fastrl.tuning import profiling

    monkeypatch.setattr(profiling, "WARMUP_CALLS", 2)
    now, started = [0.0], []

    def call(name):
        def fn():
            started.append((name, now[0]))
            now[0] += 1.0
        return fn

    timed = profiling.time_interleaved({k: (1, call(k)) for k in "abc"}, seconds=100.0, min_rounds=3,
                                       clock=lambda: now[0], cap_s=cap_s, wall=lambda: now[0])
    assert timed.capped and timed.per_call == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0})
    assert "".join(name for name, _ in started) == order
    assert "".join(name for name, t in started if t >= cap_s) == past_cap
