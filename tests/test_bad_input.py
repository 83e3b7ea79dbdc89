"""Bad input, all of it, ends in one sentence and exit 2, never a traceback.

Each row of CASES is something a user can type: the command, its arguments, and a
fragment of the one sentence that must answer it. Every row runs the real command
line as a user does (`python -m fastrl.<command>`, in a subprocess), and must:

- exit with code 2, with no "Traceback" on stdout or stderr;
- say so on stderr in one line under 300 characters, starting with the command's
  prefix ("fastrl: error:" for train, "fastrl.enjoy: error:", ...), holding the
  fragment;
- leave the scratch folder the rows read exactly as it was (test_nothing_is_left_
  behind): no experiment folder for a refused run, no checkpoint deleted, no video,
  image or report begun, and no code run from a forged checkpoint (its marker file
  never appears).

Arguments name {root}, the scratch folder (see `scratch`): {root}/train holds
experiments as the trainer leaves them, built without training.

The cases:

train, resuming
  - the newest checkpoint is forged to run code when unpickled
  - every checkpoint is damaged (was: a fresh start, deleting them at the first save)
enjoy
  - the newest checkpoint is forged to run code when unpickled
  - --checkpoint names a forged checkpoint
  - every checkpoint is damaged

The rows run two at a time: most wait on a Python start-up and torch's import.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import pytest
from helpers import REPO, MarkerPayload, forge_checkpoint, make_experiment

from fastrl.learning.checkpoint import checkpoint_dir, load_checkpoint

PREFIX = {"train": "fastrl: error: ", "enjoy": "fastrl.enjoy: error: ", "bench": "fastrl.bench: error: ",
          "plot": "fastrl.plot: error: "}
MAX_MESSAGE = 300
TIMEOUT_S = 60
TRAIN = "{root}/train"
FORGED_NEWEST = "{root}/train/forged/checkpoints/checkpoint_000000000004.pt"
RUNS_CODE = "holds more than tensors and plain data (it needs exec), so loading it could run code"
ALL_DAMAGED = "checkpoint_000000000003.pt is truncated: its header promises"


class Case(NamedTuple):
    name: str
    command: str
    argv: list
    expect: str


CASES = [
    Case("train-resume-forged", "train", ["--env", "CartPole-v1", "--train_dir", TRAIN, "--experiment", "forged"],
         RUNS_CODE),
    Case("enjoy-latest-forged", "enjoy", ["--env", "CartPole-v1", "--train_dir", TRAIN, "--experiment", "forged"],
         RUNS_CODE),
    Case("enjoy-path-forged", "enjoy", ["--env", "CartPole-v1", "--train_dir", TRAIN, "--experiment", "good",
                                        "--checkpoint", FORGED_NEWEST], RUNS_CODE),
    Case("train-resume-all-damaged", "train", ["--env", "CartPole-v1", "--train_dir", TRAIN, "--experiment", "damaged"],
         ALL_DAMAGED),
    Case("enjoy-all-damaged", "enjoy", ["--env", "CartPole-v1", "--train_dir", TRAIN, "--experiment", "damaged"],
         ALL_DAMAGED),
]


def build_scratch(root: str) -> None:
    """The files the rows point at."""
    train = os.path.join(root, "train")
    make_experiment(train, "good")
    forged = make_experiment(train, "forged")
    state = load_checkpoint(os.path.join(checkpoint_dir(forged), "checkpoint_000000000003.pt"))
    forge_checkpoint(FORGED_NEWEST.format(root=root),
                     {**state, "version": 4, "extra": MarkerPayload(os.path.join(root, "code_ran"))})
    damaged = os.path.join(checkpoint_dir(make_experiment(train, "damaged")), "checkpoint_000000000003.pt")
    with open(damaged, "r+b") as fh:
        fh.truncate(os.path.getsize(damaged) // 2)


def snapshot(root: str) -> dict:
    """Every path under root with its size and modification time."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            found[os.path.relpath(path, root)] = (info.st_size, info.st_mtime_ns)
    return found


def run_case(case: Case, root: str, cwd: str) -> subprocess.CompletedProcess:
    """The command as a user runs it. One that was not refused may go on training,
    so it gets TIMEOUT_S and then its whole session is killed, and the row fails."""
    # No bytecode caches and a working folder outside root: the rows must leave root as it was.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (REPO, root, os.environ.get("PYTHONPATH")) if p)}
    argv = [sys.executable, "-m", f"fastrl.{case.command}", *(arg.format(root=root) for arg in case.argv)]
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\n(still running after {TIMEOUT_S} s: not refused)"
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every row's result, and the scratch folder before and after all of them ran."""
    root = str(tmp_path_factory.mktemp("scratch"))
    cwd = str(tmp_path_factory.mktemp("cwd"))
    build_scratch(root)
    before = snapshot(root)
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip([c.name for c in CASES], pool.map(lambda c: run_case(c, root, cwd), CASES)))
    return results, before, snapshot(root), root


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_refused_in_one_sentence(outcomes, case):
    result = outcomes[0][case.name]
    said = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 2, said
    assert "Traceback" not in result.stdout + result.stderr, said
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, said
    assert lines[0].startswith(PREFIX[case.command]) and len(lines[0]) < MAX_MESSAGE, said
    assert case.expect in lines[0], said


def test_nothing_is_left_behind(outcomes):
    _, before, after, root = outcomes
    assert not os.path.exists(os.path.join(root, "code_ran"))
    changed = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
    assert changed == []
