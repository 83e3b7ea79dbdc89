"""Reliability III (#63), tested for real: two runs on one experiment, the evaluator's
best.pt saved while the learner rotates, an experiment that leaves --train_dir, envs
that send NaN or observations of the wrong shape, and a learner that stops responding."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types

import pytest
import torch
from helpers import REPO, TEST_ENVS_ON_PATH, read_summary
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_reliability import (
    CARTPOLE,
    SMALL,
    _no_run_outlives_its_test,  # noqa: F401  (kills what a failed test left running)
    assert_nothing_left,
    checkpoints,
    pid_titled,
    start,
    wait_for_frames,
    wait_for_new_line,
)

from fastrl.algo.model import RunningNorm
from fastrl.config import Config
from fastrl.learning.checkpoint import NonFiniteStateError, load_checkpoint, load_latest_checkpoint, save_checkpoint
from fastrl.plumbing.ranks import SOLO
from fastrl.plumbing.stats_board import StatsBoard
from fastrl.runtime.supervision import WorkerSupervisor


def train(args: list, timeout: float = 120) -> subprocess.CompletedProcess:
    """`python -m fastrl.train ARGS` to its end, output and errors together."""
    return subprocess.run([sys.executable, "-m", "fastrl.train", *args], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


# -- one writer per experiment -------------------------------------------------------------------

def test_a_second_run_on_an_experiment_is_refused_naming_the_first(tmp_path):
    first = start([*CARTPOLE, "--train_dir", str(tmp_path), "--train_for_env_frames", "100000000",
                   "--checkpoint_every_seconds", "0.5"])
    ckpt_dir = tmp_path / "CartPole-v1" / "checkpoints"
    wait_for_frames(first, 1, timeout=60)
    while not (ckpt_dir.is_dir() and checkpoints(ckpt_dir)):
        assert first.proc.poll() is None, first.output()
        first._take_lines(0.2)

    # --restart included: it would have deleted the checkpoints the first run is writing.
    second = train([*CARTPOLE, "--train_dir", str(tmp_path), "--restart", "--train_for_env_frames", "2000"])
    assert second.returncode == 2, second.stdout
    assert (f"fastrl: error: The experiment {tmp_path / 'CartPole-v1'} is in use by another run "
            f"(pid {first.proc.pid}); wait for it to end or stop it, or choose another --experiment.") in second.stdout
    assert "Traceback" not in second.stdout
    assert first.proc.poll() is None and checkpoints(ckpt_dir), first.output()

    # The kernel lets go of the lock of a run killed outright: the next run may start.
    os.kill(first.proc.pid, signal.SIGKILL)
    assert first.wait(timeout=30) == -signal.SIGKILL
    assert_nothing_left(first, grace=30)
    third = train([*CARTPOLE, "--train_dir", str(tmp_path), "--train_for_env_frames", "2000"])
    assert third.returncode == 0, third.stdout
    assert not (tmp_path / "CartPole-v1" / "run.lock").exists()


LOCK_THEN_FORK = textwrap.dedent("""
    import os, sys, time
    from fastrl.runtime.experiment_lock import ExperimentLock

    lock = ExperimentLock(sys.argv[1])
    lock.acquire()
    if os.fork() == 0:  # a child that outlives its parent, as a profile's timing process may
        for out in (1, 2):  # not holding the test's pipes open
            os.dup2(os.open(os.devnull, os.O_WRONLY), out)
        time.sleep(30)
        os._exit(0)
    print("locked", flush=True)
    os._exit(0)  # the parent ends without releasing: the kernel must drop its lock
""")


def test_a_forked_child_that_outlives_the_run_does_not_keep_the_experiment_locked(tmp_path):
    from fastrl.runtime.experiment_lock import ExperimentLock

    folder = str(tmp_path / "exp")
    done = subprocess.run([sys.executable, "-c", LOCK_THEN_FORK, folder], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert done.stdout.strip() == "locked", done.stderr
    lock = ExperimentLock(folder)
    lock.acquire()  # the child still lives, holding the parent's file open
    lock.release()


def test_an_experiment_outside_train_dir_is_refused(tmp_path):
    for experiment in ("../elsewhere", str(tmp_path / "elsewhere"), "a/../../elsewhere"):
        run = train([*CARTPOLE, "--train_dir", str(tmp_path / "runs"), "--experiment", experiment], timeout=60)
        assert run.returncode == 2, run.stdout
        assert (f"fastrl: error: --experiment {experiment} leads out of --train_dir {tmp_path / 'runs'}, where a "
                "--restart would delete another folder's checkpoints; give a name inside it, or set --train_dir."
                in run.stdout)
        assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


# The evaluator's save of best.pt, stopped once its temp file is written and before its rename,
# until the file named by argv[2] exists.
PAUSED_BEST_SAVE = textwrap.dedent("""
    import os, sys, time
    import torch
    from fastrl.learning.checkpoint import save_best

    real_save = torch.save

    def save_then_wait(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        open(sys.argv[2] + ".written", "w").close()
        while not os.path.exists(sys.argv[2]):
            time.sleep(0.01)

    torch.save = save_then_wait
    save_best(sys.argv[1], {"model": {"w": torch.ones(3)}}, 7.5)
""")


def test_the_evaluator_saving_best_while_the_learner_rotates(tmp_path):
    ckpt_dir = tmp_path / "checkpoints"
    ckpt_dir.mkdir()
    # What writers killed mid-save left: one of a pid that is gone, one of an older fastrl without a pid.
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    (ckpt_dir / f".tmp_{gone}-abc.partial").write_bytes(b"x")
    (ckpt_dir / ".tmp_k3j2h1gf.partial").write_bytes(b"x")
    go = tmp_path / "go"
    evaluator = subprocess.Popen([sys.executable, "-c", PAUSED_BEST_SAVE, str(ckpt_dir), str(go)], cwd=REPO)
    try:
        while not (tmp_path / "go.written").exists():
            assert evaluator.poll() is None, "the evaluator's save ended before its pause"
            time.sleep(0.05)
        # The learner saves and rotates while the evaluator's best.pt is half-way.
        for step in (1, 2, 3):
            save_checkpoint(str(ckpt_dir), {"model": {"w": torch.full((3,), float(step))}}, step, keep=1)
        left = sorted(os.listdir(ckpt_dir))
        assert left[0].startswith(f".tmp_{evaluator.pid}-") and left[1:] == ["checkpoint_000000000003.pt"], left
    finally:
        go.touch()
    assert evaluator.wait(timeout=60) == 0
    assert sorted(os.listdir(ckpt_dir)) == ["best.pt", "checkpoint_000000000003.pt"]
    assert load_checkpoint(str(ckpt_dir / "best.pt"))["best_score"] == 7.5


# -- bad data is not kept as good -----------------------------------------------------------------

def strict_json(path) -> dict:
    """The file parsed as strict JSON, which has no NaN or Infinity."""
    def refuse(name):
        raise ValueError(f"{path} holds a bare {name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def test_a_nan_observation_and_reward_drop_their_batch_and_never_reach_the_statistics(tmp_path):
    # Every env sends one NaN observation and reward at its 100th step: that batch is dropped and
    # counted, the normaliser stays finite, and the NaN episodes leave the mean return alone.
    run = start(["--env", "bad_data_env:NanBurst-v0", *SMALL, "--normalize_obs", "--train_dir", str(tmp_path),
                 "--train_for_env_frames", "4000", "--plan", "off"], env=TEST_ENVS_ON_PATH)
    assert run.wait(90) == 0, run.output()
    experiment = tmp_path / "bad_data_env:NanBurst-v0"
    summary = strict_json(experiment / "summary.json")
    assert summary["bad_batches_dropped"] >= 1 and summary["samples_trained"] > 0, summary
    assert summary["mean_return_100"] == 50.0, summary  # the 50-step episodes without a NaN
    assert re.search(r"\| bad batches dropped [1-9]", run.output()), run.output()
    state, _ = load_latest_checkpoint(str(experiment / "checkpoints"))
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert any("norm" in k and k.endswith("count") and float(v) > 0 for k, v in state["model"].items())
    tags = EventAccumulator(str(experiment / "tb")).Reload().Tags()["scalars"]
    assert "data/bad_batches_dropped" in tags
    assert_nothing_left(run)


def test_nan_observations_that_keep_coming_stop_the_run_naming_the_env(tmp_path):
    run = start(["--env", "bad_data_env:NanObs-v0", *SMALL, "--train_dir", str(tmp_path), "--max_bad_batches", "3",
                 "--plan", "off", "--checkpoint_every_seconds", "0.5"], env=TEST_ENVS_ON_PATH)
    assert run.wait(90) == 1, run.output()
    assert ("BadDataError: bad_data_env:NanObs-v0 sent non-finite observations (NaN or inf) in 4 batches in a row, "
            "past --max_bad_batches 3; fix the env, or wrap it to clean its output.") in run.output()
    for path in checkpoints(tmp_path / "bad_data_env:NanObs-v0" / "checkpoints"):
        assert all(torch.isfinite(v).all() for v in load_checkpoint(path)["model"].values()), path
    assert_nothing_left(run)


@pytest.mark.parametrize("env,wrong", [
    ("WrongShape-v0", "Env 0 of this worker (bad_data_env:WrongShape-v0) at its first step returned an observation "
                      "of shape (1,) and dtype float32, where its observation_space promises shape (4,) and dtype "
                      "float32; make them match."),
    ("WrongDtype-v0", "Env 0 of this worker (bad_data_env:WrongDtype-v0) on reset returned an observation of shape "
                      "() and dtype float64, where its observation_space promises shape () and dtype int64; make them "
                      "match.")])
def test_an_observation_of_the_wrong_shape_or_dtype_is_refused_at_once(tmp_path, env, wrong):
    run = start(["--env", f"bad_data_env:{env}", *SMALL, "--train_dir", str(tmp_path), "--plan", "off"],
                env=TEST_ENVS_ON_PATH)
    assert run.wait(90) == 1, run.output()
    assert f"ObservationMismatchError: {wrong}" in run.output()
    assert_nothing_left(run)


def test_the_normaliser_never_merges_non_finite_statistics():
    norm = RunningNorm((2,))
    norm.update(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    before = {k: v.clone() for k, v in norm.state_dict().items()}
    norm.update(torch.tensor([[float("nan"), 2.0], [3.0, float("inf")]]))
    assert all(torch.equal(before[k], v) for k, v in norm.state_dict().items())


def test_a_checkpoint_with_a_non_finite_buffer_is_not_saved(tmp_path):
    state = {"model": {"w": torch.ones(3), "encoders.0.norm.var": torch.tensor([1.0, float("nan")])}}
    with pytest.raises(NonFiniteStateError, match=r"state\['model'\]\['encoders.0.norm.var'\] holds a NaN or inf"):
        save_checkpoint(str(tmp_path), state, 1, keep=3)
    assert os.listdir(tmp_path) == []


# -- a learner that stops responding ------------------------------------------------------------------

def test_a_frozen_learner_is_named_and_the_run_restarts_then_stops(tmp_path):
    run = start([*CARTPOLE, "--train_dir", str(tmp_path), "--worker_timeout_seconds", "3", "--max_restarts", "1",
                 "--checkpoint_every_seconds", "0.5", "--train_for_env_frames", "100000000"])
    ckpt_dir = tmp_path / "CartPole-v1" / "checkpoints"
    run.wait_for_line(lambda line: "first batch trained" in line, timeout=60)
    while not (ckpt_dir.is_dir() and checkpoints(ckpt_dir)):
        assert run.proc.poll() is None, run.output()
        run._take_lines(0.2)
    frozen = pid_titled(run, "fastrl: learner")
    os.kill(frozen, signal.SIGSTOP)
    run.wait_for_line(lambda line: line.startswith("fastrl: the learner sent no heartbeat for 3 s and was killed; "
                                                   "restarted the run from checkpoint"), timeout=60)
    # The restarted run's learner, frozen too, ends the run: its one restart is spent.
    wait_for_new_line(run, lambda line: "first batch trained" in line, timeout=60)
    again = pid_titled(run, "fastrl: learner")
    assert again != frozen
    os.kill(again, signal.SIGSTOP)
    assert run.wait(60) == 1, run.output()
    assert ("fastrl: learner sent no heartbeat for 3 s and was killed.\nfastrl: stopping the run, as the 1 restarts "
            "--max_restarts allows are used up.") in run.output()
    assert read_summary(tmp_path, "CartPole-v1")["learner_restarts"] == 1
    assert_nothing_left(run)


def test_a_slow_learner_is_given_ten_of_its_steps():
    # A learner whose batches take 30 s each (a large batch, a slow machine) is not taken for a hung one.
    board = StatsBoard(["learner"])
    runner = types.SimpleNamespace(ctx=types.SimpleNamespace(board=board), cfg=Config(env="CartPole-v1"),
                                   rank=SOLO, learner_processes={})
    supervisor = WorkerSupervisor(runner, heartbeat_timeout_s=60.0, max_restarts=5)
    assert supervisor.learner_timeout(0) == 60.0  # before its first batch
    row = board.row("learner")
    row.add("samples_received", 3 * runner.cfg.batch_size)
    row.add("busy_s", 90.0)
    assert supervisor.learner_timeout(0) == 300.0


@pytest.mark.parametrize("command", ["train", "enjoy"])
def test_under_an_old_torch_no_checkpoint_is_opened_and_the_user_is_told_how_to_upgrade(tmp_path, command):
    from helpers import make_experiment

    make_experiment(str(tmp_path), "handed_over")
    # As an install with --no-deps would leave it: fastrl beside a torch older than setup.py asks for.
    code = (f"import sys, torch; torch.__version__ = '2.5.1'; from fastrl.{command} import main; "
            "sys.exit(main(sys.argv[1:]))")
    args = ["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--experiment", "handed_over"]
    done = subprocess.run([sys.executable, "-c", code, *args, *(["--plan", "off"] if command == "train" else [])],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    prefix = "fastrl" if command == "train" else "fastrl.enjoy"
    assert done.stderr.strip().splitlines() == [
        f"{prefix}: error: torch 2.5.1 can run code hidden in a checkpoint as it loads it (fixed in torch 2.6), so "
        "fastrl opens no checkpoint with it; pip install 'torch>=2.6'."], done.stderr
