"""Reliability, tested by breaking things for real: processes killed or frozen
mid-run, envs that raise or return NaN, checkpoints cut short, input that can
never work. Each test runs the real command line (tests/helpers.py) and checks
what a user would see: the run goes on or stops with one clear sentence, and
nothing is left behind."""
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import gymnasium as gym
import psutil
import pytest
import torch
from helpers import GPU_MARKS, REPO, TEST_ENVS_ON_PATH, TrainRun, read_summary, shm_entries

from fastrl.algo.model import Precision, build_model, flat_state
from fastrl.config import Config
from fastrl.learning.checkpoint import load_checkpoint, load_latest_checkpoint
from fastrl.learning.learner import Learner, LearnerStart
from fastrl.plumbing.params import SharedParams
from fastrl.plumbing.stats_board import StatsBoard
from fastrl.runtime.runner import NORMALIZER_SEED_STEPS

# Small and quick: 8 envs, 16-step rollouts, one 128-sample buffer per batch, one
# gradient step per batch. Every layout option is given, so neither the planner nor
# the thread adapter changes the buffer arithmetic below or the speed mid-test.
SMALL = ["--status_every_seconds", "1", "--num_workers", "1", "--num_envs_per_worker", "8", "--rollout", "16",
         "--batch_size", "128", "--ppo_epochs", "1", "--num_minibatches", "1", "--learner_threads", "1",
         "--num_policy_workers", "1"]
CARTPOLE = ["--env", "CartPole-v1", *SMALL]
STATUS = re.compile(r"^\[\s*[\d.]+s\] frames ([\d,]+) ")


_started: list = []


def start(args: list, env: dict | None = None) -> TrainRun:
    run = TrainRun(args, env=env)
    _started.append(run)
    return run


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test():
    yield
    while _started:  # a failed assertion must not leave a (possibly stalled) run behind
        run = _started.pop()
        run._note_descendants()
        run.kill_all()


def status_frames(line: str):
    match = STATUS.match(line)
    return int(match.group(1).replace(",", "")) if match else None


def wait_for_new_line(run: TrainRun, predicate, timeout: float) -> str:
    """Like run.wait_for_line, but only lines printed from now on count."""
    start, index = len(run.lines), iter(range(10**9))
    # wait_for_line offers each line once, in order, so counting calls gives its index.
    return run.wait_for_line(lambda line: next(index) >= start and predicate(line), timeout)


def wait_for_frames(run: TrainRun, at_least: int, timeout: float) -> int:
    line = run.wait_for_line(lambda text: (status_frames(text) or 0) >= at_least, timeout)
    return status_frames(line)


def pid_titled(run: TrainRun, title: str, timeout: float = 30.0) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for child in psutil.Process(run.proc.pid).children(recursive=True):
            try:
                if " ".join(child.cmdline()).strip() == title:
                    return child.pid
            except psutil.Error:
                pass
        time.sleep(0.1)
    raise AssertionError(f"no process titled {title!r} within {timeout} s:\n{run.output()}")


def assert_nothing_left(run: TrainRun, grace: float = 5.0) -> None:
    """No process of the run alive `grace` seconds after it ended, and no new /dev/shm entry."""
    assert run.leftover_processes(grace) == [], run.output()
    # /dev/shm is shared with whatever else runs here: these runs start no Doom game,
    # so ViZDoom segments are others', and an entry gone a second later was another
    # process's shared tensor caught between its creation and its unlink.
    new = {e for e in run.new_shm_entries() if not e.startswith("ViZDoom")}
    if new:
        time.sleep(1.0)
        new &= shm_entries()
    assert new == set()


def checkpoints(ckpt_dir) -> list:
    return sorted(os.path.join(ckpt_dir, n) for n in os.listdir(ckpt_dir) if n.startswith("checkpoint_"))


def norm_counts(state: dict) -> list:
    """Sample counts of the observation normalisers (the encoders', not the returns')."""
    return [float(v) for k, v in state["model"].items() if "encoders" in k and "norm" in k and k.endswith("count")]


# -- process faults ---------------------------------------------------------------------

def restart_after(run: TrainRun, name: str, how, message: str, samples_per_buffer: int,
                  restarted_with: tuple = ()) -> None:
    """Break the process titled 'fastrl: <name>' with `how(pid)`, see a line with
    `message` say it was restarted, see it and the processes named in `restarted_with`
    under new pids, and see sampling go on well past what the buffer pool allows
    without the learner freeing buffers. The pids are read as soon as the line is
    out: a run with a frame budget may reach it, and end, soon after the restart."""
    names = (name, *restarted_with)
    old = [pid_titled(run, f"fastrl: {n}") for n in names]
    how(old[0])
    wait_for_new_line(run, lambda line: message in line and "restarted" in line, timeout=30)
    new = [pid_titled(run, f"fastrl: {n}") for n in names]
    assert all(a != b for a, b in zip(old, new)), (names, old, new)
    first = status_frames(wait_for_new_line(run, lambda line: STATUS.match(line) is not None, timeout=30))
    wait_for_frames(run, first + 10 * samples_per_buffer, timeout=30)


def stop_with_sigterm(run: TrainRun, timeout: float) -> None:
    """End a run whose frame budget is out of reach: a fast machine must not finish a
    fault test's run before the faults have been caused."""
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait(timeout) == 128 + signal.SIGTERM, run.output()


def test_a_killed_rollout_worker_is_restarted_and_no_buffer_is_lost(tmp_path):
    # One worker and the fewest buffers the config allows (one it holds, one for
    # the batch; local inference, which the plan would otherwise choose by this
    # machine's profile, so that the worker has one split): if a kill lost the
    # buffer the worker held, sampling would stall after the second kill instead
    # of going on for ten more buffers.
    run = start([*CARTPOLE, "--train_dir", str(tmp_path), "--num_buffers", "2", "--inference", "local",
                 "--train_for_env_frames", "100000000"])
    wait_for_frames(run, 1, timeout=60)
    for _ in range(2):
        restart_after(run, "rollout-worker 0", lambda pid: os.kill(pid, signal.SIGKILL),
                      "rollout-worker 0 was killed by signal 9; restarted it with fresh envs", samples_per_buffer=128)
    stop_with_sigterm(run, 60)
    summary = read_summary(tmp_path, "CartPole-v1")
    assert summary["worker_restarts"] == 2
    assert summary["trajectories_discarded"] <= 2
    assert_nothing_left(run)


def test_a_hung_rollout_worker_is_killed_and_restarted(tmp_path):
    # Policy-worker mode: the frozen worker holds both its splits' buffers, and
    # with the minimum pool (2 held + 1 for the batch) losing them would stall the run.
    run = start(["--env", "CartPole-v1", *SMALL, "--inference", "policy_worker", "--batch_size", "64",
                 "--num_buffers", "3", "--worker_timeout_seconds", "3", "--train_for_env_frames", "100000000",
                 "--train_dir", str(tmp_path)])
    wait_for_frames(run, 1, timeout=60)
    stopped_at = time.time()
    restart_after(run, "rollout-worker 0", lambda pid: os.kill(pid, signal.SIGSTOP),
                  "rollout-worker 0 sent no heartbeat for 3 s", samples_per_buffer=64)
    assert time.time() - stopped_at < 25
    stop_with_sigterm(run, 60)
    assert read_summary(tmp_path, "CartPole-v1")["worker_restarts"] == 1
    assert_nothing_left(run)


def test_an_env_raising_in_step_is_recreated_and_training_goes_on(tmp_path):
    run = start(["--env", "faulty_env:FlakyStep-v0", *SMALL, "--train_dir", str(tmp_path),
                 "--train_for_env_frames", "6000"], env=TEST_ENVS_ON_PATH)
    assert run.wait(60) == 0, run.output()
    summary = read_summary(tmp_path, "faulty_env:FlakyStep-v0")
    # Every env instance raises at its 40th step, its replacement 40 steps later.
    assert summary["env_restarts"] >= 6000 // 40 // 2
    assert summary["samples_trained"] > 0 and summary["episodes"] > 0
    assert_nothing_left(run)


def test_an_env_that_always_raises_stops_the_run_naming_it(tmp_path):
    run = start(["--env", "faulty_env:BrokenStep-v0", *SMALL, "--train_dir", str(tmp_path)], env=TEST_ENVS_ON_PATH)
    assert run.wait(60) == 1, run.output()
    out = run.output()
    assert "rollout-worker 0 failed" in out
    assert "(faulty_env:BrokenStep-v0) failed 3 times in a row" in out
    assert "EnvBroke: the faulty env broke at its step 1" in out  # the env's own traceback
    assert_nothing_left(run)


def test_a_worker_killed_holding_a_queue_lock_does_not_wedge_the_run(tmp_path):
    # The env SIGKILLs its rollout worker while the worker holds the episode queue's
    # lock, once in the run. The runner reads that queue at every poll: without the
    # lock watch it waited on the dead worker's lock for good, and so did the run.
    once = {"FAULTY_ENV_ONCE": str(tmp_path / "once")}
    run = start(["--env", "faulty_env:DiesHoldingALock-v0", *SMALL, "--train_dir", str(tmp_path),
                 "--train_for_env_frames", "20000"], env={**TEST_ENVS_ON_PATH, **once})
    assert run.wait(90) == 0, run.output()
    assert re.search(r"the episode queue's lock was held by thread \d+, which is gone; freed it\.", run.output())
    assert "rollout-worker 0 was killed by signal 9; restarted it with fresh envs" in run.output()
    summary = read_summary(tmp_path, "faulty_env:DiesHoldingALock-v0")
    assert summary["worker_restarts"] == 1 and summary["env_frames"] >= 20000
    assert_nothing_left(run)


def kill_and_see_the_run_stop_naming_it(run: TrainRun, name: str) -> None:
    """SIGKILL the process titled 'fastrl: <name>': the run must exit 1 within 15 s,
    naming the process and its cause."""
    os.kill(pid_titled(run, f"fastrl: {name}"), signal.SIGKILL)
    killed_at = time.time()
    assert run.wait(30) == 1, run.output()
    assert time.time() - killed_at < 15
    assert re.search(rf"{re.escape(name)} \(pid \d+\) was killed by SIGKILL", run.output()), run.output()


# Policy-worker runs for the restart tests: one rollout worker, whose two splits of
# 4 envs fill 64-sample buffers; 6 buffers let sampling run at most 6 ahead of the
# learner. The fault comes at the first status line that shows frames, and the frame
# budget ends the run (exit code 0) seconds after it: sampling has run at
# 2,000-16,000 frames/s on this project's machines, so the first status line shows
# at most ~16,000 of the 30,000, and while the worker is broken sampling stops (half
# of it goes on with two workers, for the second before the kill), so only a machine
# some 2x faster than the fastest of those would reach the budget before the restart
# (and fail in pid_titled, not pass). At 16,000 a run ended 2 s after the restart,
# which is why restart_after reads the new pids as soon as the restart is reported.
# (50,000 frames took these three tests 58 s here at ~3,500 frames/s, 30,000 45 s.)
POLICY_WORKER_RUN = [*CARTPOLE, "--inference", "policy_worker", "--num_buffers", "6",
                     "--train_for_env_frames", "30000"]


def lags_after(run: TrainRun, line: str) -> list:
    """The learner's lag max on each status line printed after `line`."""
    later = run.lines[run.lines.index(line) + 1:]
    return [int(m.group(1)) for m in map(re.compile(r"lag min/mean/max \d+/[\d.]+/(\d+)").search, later) if m]


def policy_worker_restart(run: TrainRun, tmp_path, how, message: str, workers: int = 1) -> None:
    """Break the last of the run's `workers` policy workers with `how(pid)` once
    sampling has begun, and see the run restart them all, go on to its frame budget
    with a bounded lag, lose no buffer, exit 0 and leave nothing behind. Any request
    the dead worker held, or one still queued, is dropped by its successor as stale
    (an older epoch): sampling goes on only if the rollout worker sends each again."""
    wait_for_frames(run, 1, timeout=60)
    restart_after(run, f"policy-worker {workers - 1}", how, message, samples_per_buffer=64,
                  restarted_with=tuple(f"policy-worker {i}" for i in range(workers - 1)))
    restarted = next(line for line in run.lines if message in line)
    assert run.wait(60) == 0, run.output()
    lags = lags_after(run, restarted)
    assert lags and max(lags) <= 25, run.output()  # --max_policy_lag's default
    summary = read_summary(tmp_path, "CartPole-v1")
    assert summary["env_frames"] >= 30000 and summary["worker_restarts"] == 1
    assert summary["trajectories_discarded"] == 0
    assert_nothing_left(run)


def stop_then_kill(pid: int) -> None:
    """SIGKILL after a second frozen, when every split's request is surely in flight:
    taken by the worker or queued for it, rather than answered (a split with its
    answer in hand would go on alone, and a lost request of the other would pass
    unseen)."""
    os.kill(pid, signal.SIGSTOP)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("workers,device", [(1, "cpu"), (2, "cpu"), pytest.param(1, "cuda", marks=GPU_MARKS)])
def test_a_killed_policy_worker_is_restarted_and_the_run_goes_on(tmp_path, workers, device):
    # With two, the healthy one is restarted with the dead one (inference.RemotePolicy says why).
    # On a GPU the dead worker held CUDA IPC mappings of the weights and CUDA graphs:
    # nothing of it may be left behind either.
    run = start([*POLICY_WORKER_RUN, "--num_policy_workers", str(workers), "--train_dir", str(tmp_path),
                 "--device", device])
    policy_worker_restart(run, tmp_path, stop_then_kill, f"policy-worker {workers - 1} was killed by signal 9",
                          workers)


def test_a_hung_policy_worker_is_killed_and_restarted(tmp_path):
    run = start([*POLICY_WORKER_RUN, "--worker_timeout_seconds", "3", "--train_dir", str(tmp_path)])
    policy_worker_restart(run, tmp_path, lambda pid: os.kill(pid, signal.SIGSTOP),
                          "policy-worker 0 sent no heartbeat for 3 s and was killed")


def test_a_killed_learner_stops_the_run_naming_it(tmp_path):
    run = start([*CARTPOLE, "--train_dir", str(tmp_path)])
    wait_for_frames(run, 1, timeout=60)
    kill_and_see_the_run_stop_naming_it(run, "learner")
    assert_nothing_left(run)


RESTARTED = re.compile(r"fastrl: the learner was killed by SIGKILL; restarted the run from checkpoint \S+ "
                       r"\(frames ([\d,]+)\), restart (\d) of (\d) \(--max_restarts\)\.$")


def kill_the_learner_once_it_checkpointed(run: TrainRun, ckpt_dir) -> int:
    """SIGKILL the learner once a checkpoint exists (one taken from the start would
    restart nothing); returns its pid."""
    deadline = time.time() + 60
    while not (ckpt_dir.is_dir() and checkpoints(ckpt_dir)):
        assert run.proc.poll() is None and time.time() < deadline, run.output()
        run._take_lines(0.2)
    pid = pid_titled(run, "fastrl: learner")
    os.kill(pid, signal.SIGKILL)
    return pid


def test_a_killed_learner_restarts_the_run_from_its_checkpoint_with_max_restarts(tmp_path):
    # The first checkpoint comes 0.5 s into training: 6,500 frames at the sampling
    # seen on a busy machine, 15,000 on a quiet one, where a 20,000 budget was
    # reached before the kill landed. 50,000 stays out of its reach either way, and
    # the restarted run trains for most of it (at ~3,500 frames/s this setup makes,
    # 100,000 took the test 34 s).
    run = start([*CARTPOLE, "--train_dir", str(tmp_path), "--max_restarts", "2", "--checkpoint_every_seconds", "0.5",
                 "--train_for_env_frames", "50000"])
    old = kill_the_learner_once_it_checkpointed(run, tmp_path / "CartPole-v1" / "checkpoints")
    line = wait_for_new_line(run, lambda text: RESTARTED.match(text) is not None, timeout=30)
    frames, restart, allowed = RESTARTED.match(line).groups()
    assert (restart, allowed) == ("1", "2")
    assert int(frames.replace(",", "")) < 25000, run.output()  # else the restarted run need not train to finish
    assert pid_titled(run, "fastrl: learner") != old
    assert run.wait(60) == 0, run.output()
    assert "reached 50,000 env frames" in run.output()
    summary = read_summary(tmp_path, "CartPole-v1")
    assert summary["learner_restarts"] == 1 and summary["env_frames"] >= 50000, summary
    # Frames go on from the checkpoint's count, and the restarted run trained on.
    assert summary["env_frames"] - summary["env_frames_this_run"] == int(frames.replace(",", "")), summary
    assert summary["samples_trained"] > 0, run.output()
    assert_nothing_left(run)


def test_a_learner_dying_more_often_than_max_restarts_stops_the_run_naming_it(tmp_path):
    run = start([*CARTPOLE, "--train_dir", str(tmp_path), "--max_restarts", "1", "--checkpoint_every_seconds", "0.5",
                 "--train_for_env_frames", "100000000"])
    ckpt_dir = tmp_path / "CartPole-v1" / "checkpoints"
    kill_the_learner_once_it_checkpointed(run, ckpt_dir)
    wait_for_new_line(run, lambda text: RESTARTED.match(text) is not None, timeout=30)
    wait_for_frames(run, 1, timeout=30)
    kill_and_see_the_run_stop_naming_it(run, "learner")
    assert "stopping the run, as the 1 restarts --max_restarts allows are used up" in run.output()
    assert read_summary(tmp_path, "CartPole-v1")["learner_restarts"] == 1
    assert_nothing_left(run)


# -- a child stopped when the run ends -----------------------------------------------------
# Found under torchrun: a learner stopped by a chaos test outlived its run, orphaned
# in state T, once torchrun had SIGKILLed its runner. A stopped process sees no stop
# flag and keeps a SIGTERM pending; however the run ends, it must go with the run.

def stop(pid: int) -> None:
    """SIGSTOP `pid` and wait until it is stopped, so that the run ends with it so."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.time() + 10
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
        assert time.time() < deadline, f"pid {pid} was not stopped 10 s after SIGSTOP"
        time.sleep(0.05)


def run_with_a_stopped(tmp_path, name: str, budget: list) -> TrainRun:
    """A CartPole run whose 'fastrl: <name>' is stopped once training has begun (a
    learner stopped before its loop would leave, continued, with no checkpoint to write)."""
    run = start([*CARTPOLE, "--train_dir", str(tmp_path), *budget])
    run.wait_for_line(lambda line: "first batch trained" in line, timeout=60)
    stop(pid_titled(run, f"fastrl: {name}"))
    return run


# A time budget ends the run however few frames a stopped learner lets it sample,
# and 10 s leaves a slow start-up its first trained batch in time (CartPole's comes
# 2-6 s after launch on a loaded 2-core machine); the signals come into a run whose
# frame budget is out of reach.
ENDINGS = {"its budget": (["--train_for_seconds", "10"], None, 0),
           "Ctrl-C": (["--train_for_env_frames", "100000000"], "group", 128 + signal.SIGINT),
           "SIGTERM": (["--train_for_env_frames", "100000000"], "runner", 128 + signal.SIGTERM)}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_stopped_learner_is_continued_and_leaves_with_the_run(tmp_path, ending):
    budget, target, code = ENDINGS[ending]
    run = run_with_a_stopped(tmp_path, "learner", budget)
    if target == "group":
        run.signal_group(signal.SIGINT)  # as a terminal's Ctrl-C
    elif target == "runner":
        os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait(60) == code, run.output()
    # It left when asked, as a running learner does, writing its final checkpoint;
    # not killed after the runner's minute of waiting for it.
    assert "had to kill" not in run.output()
    assert checkpoints(tmp_path / "CartPole-v1" / "checkpoints"), run.output()
    assert_nothing_left(run)


@pytest.mark.parametrize("name", ["learner", "rollout-worker 0"])
def test_a_stopped_child_goes_when_the_runner_is_sigkilled(tmp_path, name):
    # No shutdown code runs in the runner: the process server ends with it, its
    # end continues every child (their parent-death signal), and each child's
    # runner watch then ends it. The grace only bounds the wait: a child that
    # stays stopped stays for good.
    run = run_with_a_stopped(tmp_path, name, ["--train_for_env_frames", "100000000"])
    os.kill(run.proc.pid, signal.SIGKILL)
    assert run.wait(timeout=30) == -signal.SIGKILL
    assert_nothing_left(run, grace=30)
    # Continued, the learner unwound as it does on a stop: its final checkpoint.
    assert checkpoints(tmp_path / "CartPole-v1" / "checkpoints"), run.output()


# -- data safety --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cartpole_experiment(tmp_path_factory):
    """A finished CartPole run with several checkpoints; tests copy it before changing it."""
    root = tmp_path_factory.mktemp("trained")
    ckpt_dir = root / "CartPole-v1" / "checkpoints"
    run = start([*CARTPOLE, "--train_dir", str(root), "--train_for_env_frames", "100000000",
                 "--checkpoint_every_seconds", "0.5", "--keep_checkpoints", "3"])
    # Trained until two checkpoints exist, then stopped (which writes one more): a
    # budget could not say when that is, as a time budget counts start-up, which took
    # most of 6 s on a loaded machine, and a frame budget ends early on a fast one.
    deadline = time.time() + 90
    while not (ckpt_dir.is_dir() and len(checkpoints(ckpt_dir)) >= 2):
        assert run.proc.poll() is None and time.time() < deadline, run.output()
        run._take_lines(0.2)
    stop_with_sigterm(run, 60)
    return root / "CartPole-v1"


def test_a_truncated_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path, cartpole_experiment):
    shutil.copytree(cartpole_experiment, tmp_path / "CartPole-v1")
    *_, previous, newest = checkpoints(tmp_path / "CartPole-v1" / "checkpoints")
    kept = load_checkpoint(previous)
    with open(newest, "r+b") as fh:
        fh.truncate(os.path.getsize(newest) // 2)

    run = start([*CARTPOLE, "--train_dir", str(tmp_path), "--train_for_env_frames", str(kept["env_frames"] + 3000)])
    assert run.wait(90) == 0, run.output()
    assert f"Skipping unusable checkpoint: Checkpoint {newest} is truncated" in run.output()
    summary = read_summary(tmp_path, "CartPole-v1")
    assert summary["env_frames"] - summary["env_frames_this_run"] == kept["env_frames"]
    assert summary["learner_steps"] > kept["version"]
    # The damaged file did not outlive the run that skipped it: what is left all loads,
    # the newest being the resumed run's last.
    left = checkpoints(tmp_path / "CartPole-v1" / "checkpoints")
    assert [load_checkpoint(p)["version"] for p in left][-1] == summary["learner_steps"]


def test_resume_carries_the_obs_normaliser_and_the_rng(tmp_path):
    args = [*CARTPOLE, "--train_dir", str(tmp_path), "--normalize_obs", "--checkpoint_every_seconds", "1",
            "--keep_checkpoints", "50"]
    ckpt_dir = tmp_path / "CartPole-v1" / "checkpoints"
    first = start([*args, "--train_for_env_frames", "8000"])
    assert first.wait(90) == 0, first.output()
    path1 = checkpoints(ckpt_dir)[-1]
    state1 = load_checkpoint(path1)
    counts1 = norm_counts(state1)
    # The runner's first frames, then every batch's batch_size observations, go into the
    # statistics (actor's and critic's).
    assert len(counts1) == 2 and counts1 == [NORMALIZER_SEED_STEPS + state1["version"] * 128.0] * 2
    assert any("norm" in k and k.endswith("var") and not torch.allclose(v, torch.ones_like(v))
               for k, v in state1["model"].items())

    # The learner of a resumed run starts with the checkpoint's RNG, counters and Adam state.
    cfg = Config(**state1["config"])
    env = gym.make("CartPole-v1")
    model = build_model(cfg, env.observation_space, env.action_space)
    model.load_state_dict(state1["model"])
    params = SharedParams(flat_state(model).numel())
    params.publish(flat_state(model), state1["version"])
    ctx = types.SimpleNamespace(obs_space=env.observation_space, action_space=env.action_space, params=[params],
                                board=StatsBoard(["learner"]), precision=Precision("fp32", "fp32", "no image encoder"))
    torch.manual_seed(12345)
    learner = Learner(cfg, ctx, "cpu", LearnerStart(path1))
    assert torch.equal(torch.get_rng_state(), state1["torch_rng"])
    assert learner.version == state1["version"] and learner.samples_trained == state1["samples_trained"]
    adam_steps = [float(s["step"]) for s in learner.optimizer.state_dict()["state"].values()]
    assert adam_steps == [float(s["step"]) for s in state1["optimizer"]["state"].values()] and adam_steps[0] > 0
    assert norm_counts({"model": learner.model.state_dict()}) == counts1

    second = start([*args, "--train_for_env_frames", "16000"])
    assert second.wait(90) == 0, second.output()
    resumed = [load_checkpoint(p) for p in checkpoints(ckpt_dir) if p > path1]
    assert resumed, second.output()
    assert norm_counts(resumed[0]) >= counts1  # continued, not started again from zero
    last = resumed[-1]
    assert norm_counts(last) == [NORMALIZER_SEED_STEPS + last["version"] * 128.0] * 2  # seeded once, not again


def test_nan_rewards_drop_their_batch_and_training_goes_on(tmp_path):
    run = start(["--env", "faulty_env:NanOnce-v0", *SMALL, "--train_dir", str(tmp_path),
                 "--train_for_env_frames", "4000"], env=TEST_ENVS_ON_PATH)
    assert run.wait(60) == 0, run.output()
    summary = read_summary(tmp_path, "faulty_env:NanOnce-v0")
    # All 8 envs hit their one NaN in the same step, so one batch is poisoned, and dropped before
    # the loss sees it: far from the 20 in a row that stop a run.
    assert 0 < summary["bad_batches_dropped"] < 20 and summary["nonfinite_skips"] == 0
    assert summary["env_frames"] >= 4000 and summary["samples_trained"] > 0
    state, _ = load_latest_checkpoint(str(tmp_path / "faulty_env:NanOnce-v0" / "checkpoints"))
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_persistent_nan_stops_the_run_and_keeps_a_good_checkpoint(tmp_path):
    run = start(["--env", "faulty_env:NanReward-v0", *SMALL, "--train_dir", str(tmp_path),
                 "--checkpoint_every_seconds", "1"], env=TEST_ENVS_ON_PATH)
    assert run.wait(60) == 1, run.output()
    assert "learner failed" in run.output()
    assert ("faulty_env:NanReward-v0 sent non-finite rewards (NaN or inf) in 21 batches in a row, past "
            "--max_bad_batches 20") in run.output()
    summary = read_summary(tmp_path, "faulty_env:NanReward-v0")
    assert summary["bad_batches_dropped"] == 21
    ckpt_dir = tmp_path / "faulty_env:NanReward-v0" / "checkpoints"
    assert checkpoints(ckpt_dir), run.output()
    for path in checkpoints(ckpt_dir):
        state = load_checkpoint(path)  # raises if damaged
        assert all(torch.isfinite(v).all() for v in state["model"].values()), path
        assert all(torch.isfinite(t).all() for s in state["optimizer"]["state"].values()
                   for t in s.values() if torch.is_tensor(t)), path
    assert_nothing_left(run)


# -- bad input ------------------------------------------------------------------------------

def test_an_unwritable_train_dir_is_refused_before_any_process(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    run = start([*CARTPOLE, "--train_dir", str(tmp_path / "a_file" / "runs")])
    assert run.wait(60) == 2
    assert (f"The experiment folder {tmp_path / 'a_file' / 'runs' / 'CartPole-v1'} cannot be written "
            f"({tmp_path / 'a_file'} is not a folder)") in run.output()
    assert "Traceback" not in run.output()
    assert run.descendants == set()


def test_a_checkpoint_from_another_env_is_refused(tmp_path, cartpole_experiment):
    # CartPole-v0 has CartPole-v1's spaces, so only the env check can tell them apart.
    shutil.copytree(cartpole_experiment / "checkpoints", tmp_path / "other" / "checkpoints")
    before = checkpoints(tmp_path / "other" / "checkpoints")
    run = start(["--env", "CartPole-v0", *SMALL, "--train_dir", str(tmp_path), "--experiment", "other"])
    assert run.wait(60) == 2
    assert re.search(r"The checkpoint \S+ was trained on CartPole-v1, not CartPole-v0; pass --restart", run.output())
    assert "Traceback" not in run.output()
    assert run.worker_titles() == []
    assert checkpoints(tmp_path / "other" / "checkpoints") == before
    assert run.leftover_processes() == []


def _processes_marked(mark: str) -> list:
    """Live processes whose environment holds FASTRL_TEST_MARK=mark: a command's every
    descendant inherits it, orphans included."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("FASTRL_TEST_MARK") == mark and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


REFUSED_BY_A_CALLER = """
import sys

import torch  # a caller that imported it already: the refusal then comes long before the server's own import ends

from fastrl.train import main

sys.exit(main(sys.argv[1:]))
"""


def test_a_run_refused_after_its_process_server_started_leaves_nothing_running(tmp_path, cartpole_experiment):
    # The experiment's checks read checkpoints with torch, so they come after the
    # process server has begun importing it. Refused while the server was still at
    # it, a run left the server importing, a core's work, for 2-13 s after it
    # returned (77 refusals in a row in test_bad_input ran 1.8x as long for it).
    shutil.copytree(cartpole_experiment / "checkpoints", tmp_path / "CartPole-v1" / "checkpoints")
    script = tmp_path / "refused.py"
    script.write_text(REFUSED_BY_A_CALLER)
    mark = f"refused-{os.getpid()}-{time.monotonic_ns()}"
    # Output to a file: through a pipe, run() would also wait for the server, which holds the pipe open.
    with open(tmp_path / "said.txt", "w") as said:
        code = subprocess.run([sys.executable, str(script), *CARTPOLE, "--train_dir", str(tmp_path),
                               "--hidden_sizes", "32"], stdout=said, stderr=said, timeout=60,
                              env={**os.environ, "PYTHONPATH": REPO, "FASTRL_TEST_MARK": mark}).returncode
    said = (tmp_path / "said.txt").read_text()
    assert code == 2 and "does not fit this model" in said, said
    deadline = time.time() + 0.5  # multiprocessing's resource tracker leaves once its pipe closes
    while _processes_marked(mark) and time.time() < deadline:
        time.sleep(0.05)
    assert _processes_marked(mark) == []
