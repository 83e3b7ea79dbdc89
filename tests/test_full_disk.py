"""A full disk, met as a user's shared workstation or a small cloud volume meets it: each run
trains into a small tmpfs of its own (tests/small_disk.py, in a private mount namespace) that
another program fills once the run has written a checkpoint. The run must end in sentences,
never a traceback, with no half-written file, and the same command must resume it."""
import errno
import json
import os
import pickle
import shutil
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrl.algo.model import build_model
from fastrl.config import Config
from fastrl.learning.checkpoint import save_checkpoint
from fastrl.plumbing import disk_space
from fastrl.plumbing.files import DiskFullError, writing

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ["--env", "CartPole-v1", "--plan", "off", "--num_workers", "1", "--checkpoint_every_seconds", "1"]

def _can_mount_privately() -> bool:
    """Root, Linux, unshare(1), and a kernel or container that lets a mount namespace be made."""
    if os.getuid() != 0 or shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return False
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                          capture_output=True).returncode == 0


needs_a_mount_namespace = pytest.mark.skipif(
    not _can_mount_privately(), reason="a small disk of the test's own takes root, Linux, unshare(1) and the "
                                       "right to make a mount namespace, for a private tmpfs")


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """The runs, in order, on one small disk: refused for want of room, left without room mid-run,
    filled to the last byte mid-run, then resumed once the space is back."""
    disk = str(tmp_path_factory.mktemp("disk"))
    train_dir = os.path.join(disk, "train")
    args = [*TRAIN, "--train_dir", train_dir]
    request = {"disk": disk, "steps": [
        {"size": "4m", "args": [*args, "--experiment", "refused"]},
        {"size": "32m", "args": [*args, "--experiment", "run", "--train_for_seconds", "60"],
         "fill_leaving_kb": 6 * 1024},
        {"size": "32m", "args": [*args, "--experiment", "run", "--train_for_seconds", "60", "--with_wandb", "true"],
         "fill_leaving_kb": 0},
        # Long enough to train at least a batch after resuming, even on a slow machine.
        {"size": "32m", "args": [*args, "--experiment", "run", "--train_for_seconds", "12"]},
    ]}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p),
           "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable,
                           os.path.join(REPO, "tests", "small_disk.py")], input=json.dumps(request), env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def said(step: dict) -> str:
    return f"stdout:\n{step['stdout']}\nstderr:\n{step['stderr']}"


def final_checkpoint_of(summary: dict, frames: int) -> bool:
    """Whether a checkpoint of `frames` env frames is the one written as the run ended: the summary
    also counts the steps the workers took while the learner saved, at most a batch more, where the
    periodic checkpoints lie a second (tens of thousands of CartPole frames) apart."""
    return 0 < summary["env_frames"] - Config().batch_size <= frames <= summary["env_frames"]


def errors(step: dict) -> list:
    return [line for line in step["stderr"].splitlines() if line.startswith("fastrl: error:")]


@needs_a_mount_namespace
def test_a_run_without_room_for_its_checkpoints_is_refused_before_it_writes(steps):
    refused = steps[0]
    assert refused["returncode"] == 2, said(refused)
    assert refused["stderr"].strip().splitlines() == errors(refused) and len(errors(refused)) == 1, said(refused)
    assert "MB this run needs to write its checkpoints and reports; free space there" in refused["stderr"]
    assert refused["files"] == []


@needs_a_mount_namespace
def test_a_run_left_without_room_stops_while_its_final_checkpoint_and_summary_still_fit(steps):
    stopped = steps[1]
    assert stopped["returncode"] == 1, said(stopped)
    assert "Traceback" not in stopped["stdout"] + stopped["stderr"], said(stopped)
    assert len(errors(stopped)) == 1 and "MB this run needs to write its final checkpoint and reports, so it stops " \
        "now; free space there, then run the command again to resume." in errors(stopped)[0], said(stopped)
    summary = stopped["summaries"]["train/run/summary.json"]
    path, frames = stopped["newest"]["train/run/checkpoints"]
    assert final_checkpoint_of(summary, frames)
    assert not [f for f in stopped["files"] if f.endswith(".partial") or f.endswith(".tmp")], stopped["files"]


@needs_a_mount_namespace
def test_a_disk_filled_to_the_last_byte_ends_the_run_in_sentences_and_keeps_good_checkpoints(steps):
    before, full = steps[1], steps[2]
    assert full["returncode"] == 1, said(full)
    assert "Traceback" not in full["stdout"] + full["stderr"], said(full)
    assert errors(full) and all("is full (No space left on device); free space there, then run the command "
                                "again" in line or "MB left" in line for line in errors(full)), said(full)
    # Whatever could not be written, the newest good checkpoint is one from this run or the one before,
    # and a summary.json, if any, is this run's.
    path, frames = full["newest"]["train/run/checkpoints"]
    assert frames >= before["newest"]["train/run/checkpoints"][1]
    summary = full["summaries"].get("train/run/summary.json")
    assert summary is None or summary["env_frames"] > before["summaries"]["train/run/summary.json"]["env_frames"]
    assert not [f for f in full["files"] if f.endswith(".partial") or f.endswith(".tmp")], full["files"]
    assert any(f.startswith("train/run/wandb/") for f in full["files"]), full["files"]


@needs_a_mount_namespace
def test_the_same_command_resumes_once_there_is_space_again(steps):
    full, resumed = steps[2], steps[3]
    assert resumed["returncode"] == 0, said(resumed)
    newest_before = os.path.basename(full["newest"]["train/run/checkpoints"][0])
    assert any(line.startswith("fastrl: resuming from ") and newest_before in line
               for line in resumed["stdout"].splitlines()), said(resumed)
    path, frames = resumed["newest"]["train/run/checkpoints"]
    assert frames > full["newest"]["train/run/checkpoints"][1]
    assert final_checkpoint_of(resumed["summaries"]["train/run/summary.json"], frames)


def test_a_write_that_finds_no_space_says_what_and_where_in_one_sentence(tmp_path):
    target = str(tmp_path / "summary.json")
    for err_no in (errno.ENOSPC, errno.EDQUOT):
        with pytest.raises(DiskFullError) as raised, writing(target, "summary.json"):
            raise OSError(err_no, os.strerror(err_no))
        assert str(raised.value) == (f"summary.json could not be written, as the disk holding {tmp_path} is full "
                                     f"({os.strerror(err_no)}); free space there, then run the command again")
        assert str(pickle.loads(pickle.dumps(raised.value))) == str(raised.value)
    with pytest.raises(PermissionError), writing(target, "summary.json"):  # not a full disk: left as it was
        raise PermissionError(errno.EACCES, "Permission denied")


@pytest.mark.parametrize("env, obs_space, actions", [
    ("CartPole-v1", gym.spaces.Box(-1, 1, (4,), np.float32), 2),
    ("doom_battle", gym.spaces.Box(0, 255, (3, 72, 128), np.uint8), 8),
])
def test_the_room_a_run_keeps_holds_its_checkpoint(tmp_path, env, obs_space, actions):
    cfg = Config(env=env)
    model = build_model(cfg, obs_space, gym.spaces.Discrete(actions))
    optimizer = torch.optim.Adam(model.parameters())
    sum(p.sum() for p in model.parameters()).backward()
    optimizer.step()  # Adam's moments exist from the first step on
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "version": 1, "env_frames": 1,
             "config": cfg.to_dict(), "torch_rng": torch.get_rng_state()}
    written = os.path.getsize(save_checkpoint(str(tmp_path), state, 1, 1))
    assert written <= disk_space.bytes_needed([model], evaluates=False) - disk_space.SLACK_BYTES
