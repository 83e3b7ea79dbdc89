"""Bad input, all of it, ends in one sentence and exit 2, never a traceback.

Each row of CASES is something a user can type into train, enjoy, bench or plot:
the command, what is wrong, its arguments, and a fragment of the one sentence that
must answer it. Every row runs the real command line as a user does
(`python -m fastrl.<command>`, in a subprocess), and must:

- exit with code 2, with no "Traceback" on stdout or stderr;
- say so on stderr in one line under 300 characters, starting with the command's
  prefix ("fastrl: error:" for train, "fastrl.enjoy: error:", ...), holding the
  fragment;
- leave the scratch folder the rows read exactly as it was (test_nothing_is_left_
  behind): no experiment folder for a refused run, no checkpoint deleted, no video,
  image or report begun, and no code run from a forged checkpoint (its marker file
  never appears).

Arguments name {root}, the scratch folder that build_scratch fills: experiments as
the trainer leaves them (built without training) under {root}/train, and files
that stand where other things are expected. Rows that are not about the plan pass
--plan off: they stay fast and leave the machine's profile cache alone.

The rows run two at a time, each forked from one interpreter that imported torch
once (tests/fork_launcher.py): as 77 fresh interpreters they spent a minute
importing it.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from typing import NamedTuple

import pytest
from helpers import REPO, TESTS, MarkerPayload, forge_checkpoint, make_experiment

from fastrl.learning.checkpoint import checkpoint_dir, load_checkpoint

PREFIX = {"train": "fastrl: error: ", "enjoy": "fastrl.enjoy: error: ", "bench": "fastrl.bench: error: ",
          "plot": "fastrl.plot: error: "}
MAX_MESSAGE = 300
TIMEOUT_S = 60
CARTPOLE = "--env CartPole-v1 --train_dir {root}/train --plan off"  # train's options for one of the experiments
ENJOY = "--env CartPole-v1 --train_dir {root}/train"
BENCH = "--env CartPole-v1 --mode infer --seconds 1 --warmup 0"
FORGED_NEWEST = "{root}/train/forged/checkpoints/checkpoint_000000000004.pt"
RUNS_CODE = "holds more than tensors and plain data (it needs exec), so loading it could run code"
ALL_DAMAGED = "checkpoint_000000000003.pt is truncated: its header promises"
NOT_WRITABLE = "cannot be written"


class Case(NamedTuple):
    command: str
    what: str
    argv: str
    expect: str


CASES = [
    # -- train: env names and env options
    Case("train", "no --env", "--train_dir {root}/train", "No environment given: pass --env"),
    Case("train", "unknown env", "--env NoSuchEnv-v0 --train_dir {root}/train", "Unknown env 'NoSuchEnv-v0'"),
    Case("train", "misspelt env", "--env cartpole-v1 --train_dir {root}/train", "did you mean 'CartPole-v1'?"),
    Case("train", "an option since removed", CARTPOLE + " --clip_anchor proximal",
         "--clip_anchor was removed (the PPO clip measures each step from the acting policy"),
    Case("train", "a value since removed", CARTPOLE + " --lr_schedule kl_adaptive",
         "argument --lr_schedule: invalid choice: 'kl_adaptive'"),
    Case("train", "env module missing", "--env no_such_module:Foo-v0 --train_dir {root}/train",
         "module 'no_such_module' cannot be imported"),
    Case("train", "env module raises on import", "--env boom_env:Foo-v0 --train_dir {root}/train",
         "module 'boom_env' failed to import (RuntimeError: boom at import)"),
    Case("train", "env module registers no such id", "--env failing_env:Other-v0 --train_dir {root}/train",
         "did not register 'Other-v0'"),
    Case("train", "env fails to construct (a missing dependency)", "--env failing_env:Failing-v0 --train_dir "
         "{root}/train --plan off", "The env failing_env:Failing-v0 could not be made (DependencyNotInstalled: "
                                   "needs frobnicate"),
    Case("train", "Doom option for a non-Doom env", "--env CartPole-v1 --doom_measurements --train_dir {root}/train",
         "--doom_measurements applies to doom_* envs only"),
    Case("train", "Doom engine option for a non-Doom env", "--env CartPole-v1 --doom_engine_recycle_episodes 50 "
         "--train_dir {root}/train", "--doom_engine_recycle_episodes applies to doom_* envs only"),
    Case("train", "negative engine recycle count", "--env doom_basic --doom_engine_recycle_episodes -1 --train_dir "
         "{root}/train", "--doom_engine_recycle_episodes is -1 but must not be negative"),
    # -- train: scenario files
    Case("train", "scenario file missing", "--env doom_custom --doom_scenario {root}/missing.cfg --train_dir "
         "{root}/train", "--doom_scenario {root}/missing.cfg is not a file"),
    Case("train", "scenario is a folder", "--env doom_custom --doom_scenario {root}/adir --train_dir {root}/train",
         "--doom_scenario {root}/adir is not a file"),
    Case("train", "scenario file is not a ViZDoom .cfg", "--env doom_custom --doom_scenario {root}/notes.cfg "
         "--train_dir {root}/train --plan off", "could not load the config {root}/notes.cfg: Syntax error in line #1"),
    # -- train: folders
    Case("train", "--train_dir is a file", "--env CartPole-v1 --train_dir {root}/afile",
         "({root}/afile is not a folder)"),
    Case("train", "--train_dir under a file", "--env CartPole-v1 --train_dir {root}/afile/runs",
         "({root}/afile is not a folder)"),
    Case("train", "--train_dir in /proc", "--env CartPole-v1 --train_dir /proc", f"/proc/CartPole-v1 {NOT_WRITABLE}"),
    Case("train", "experiment folder is a file", f"{CARTPOLE} --experiment afile",
         "({root}/train/afile is not a folder)"),
    Case("train", "checkpoints folder is a file", f"{CARTPOLE} --experiment ckptfile",
         "{root}/train/ckptfile/checkpoints is not a folder"),
    # -- train: resuming
    Case("train", "newest checkpoint forged to run code", f"{CARTPOLE} --experiment forged", RUNS_CODE),
    Case("train", "every checkpoint damaged", f"{CARTPOLE} --experiment damaged", ALL_DAMAGED),
    Case("train", "checkpoint of another env", "--env CartPole-v0 --train_dir {root}/train --plan off "
         "--experiment good_env", "was trained on CartPole-v1, not CartPole-v0"),
    Case("train", "checkpoint of another model", f"{CARTPOLE} --experiment good_model --hidden_sizes 32",
         "does not fit this model"),
    Case("train", "--restart with a plan file that is not JSON (the checkpoints stay)", "--env CartPole-v1 "
         "--train_dir {root}/train --experiment good_restart --restart --plan {root}/bad_plan.json",
         "--plan {root}/bad_plan.json is not a readable plan"),
    Case("train", "a plan file edited by hand into a wrong type", "--env CartPole-v1 --train_dir {root}/train "
         "--experiment fresh --plan {root}/typo_plan.json",
         "--plan {root}/typo_plan.json is not a readable plan (its num_workers is 'two', not an int)"),
    # -- train: numbers and options
    Case("train", "unknown option", f"{CARTPOLE} --lrr 0.1", "unknown option --lrr. Did you mean --lr?"),
    Case("train", "not a number", f"{CARTPOLE} --num_workers abc", "argument --num_workers: invalid int value"),
    Case("train", "zero workers", f"{CARTPOLE} --num_workers 0", "--num_workers is 0 but must be a positive"),
    Case("train", "NCCL without a GPU", f"{CARTPOLE} --dist_backend nccl --device cpu",
         "--dist_backend nccl all-reduces CUDA tensors, but this run's learner computes on the CPU"),
    Case("train", "NaN learning rate", f"{CARTPOLE} --lr nan", "--lr is nan but must be a finite number"),
    Case("train", "infinite time budget", f"{CARTPOLE} --train_for_seconds inf",
         "--train_for_seconds is inf but must be a finite number"),
    Case("train", "negative seed", f"{CARTPOLE} --seed -1", "--seed is -1 but must lie in [0, 2147483647]"),
    Case("train", "seed too large for torch and the engines", f"{CARTPOLE} --seed 99999999999999999999",
         "--seed is 99999999999999999999 but must lie in"),
    Case("train", "batch not a multiple of the rollout", f"{CARTPOLE} --batch_size 1000",
         "--batch_size 1000 is not a multiple"),
    # -- train: several policies
    Case("train", "zero policies", f"{CARTPOLE} --num_policies 0", "--num_policies is 0 but must be a positive"),
    Case("train", "PBT with one policy", f"{CARTPOLE} --with_pbt true", "--with_pbt true needs a population"),
    Case("train", "envs not shared evenly among policies", f"{CARTPOLE} --num_policies 3 --num_envs_per_worker 16",
         "must be a multiple of the 3 env groups"),
    Case("train", "resuming with another number of policies",
         f"{CARTPOLE} --experiment good_policies --num_policies 2",
         "trained 1 policy; pass --num_policies 1 to resume it"),
    # -- train: several agents in one game
    Case("train", "several agents in a single-player scenario", "--env doom_basic --doom_agents 2 --train_dir "
         "{root}/train --plan off", "--doom_agents applies to the Doom deathmatch scenarios only"),
    Case("train", "a duel's agents split unevenly", "--env doom_duel --num_envs_per_worker 3 --train_dir {root}/train "
         "--plan off", "must be a multiple of the 2 env groups each worker has with 2 agents in each game"),
    # -- enjoy
    Case("enjoy", "no --env", "--train_dir {root}/train", "the following arguments are required: --env"),
    Case("enjoy", "not a number", f"{ENJOY} --episodes abc", "argument --episodes: invalid int value"),
    Case("enjoy", "zero episodes", f"{ENJOY} --episodes 0", "--episodes is 0 but must be at least 1"),
    Case("enjoy", "negative seed", f"{ENJOY} --seed -1", "--seed is -1 but must lie in"),
    Case("enjoy", "no such experiment", "--env CartPole-v1 --train_dir {root}/nowhere", "No experiment at"),
    Case("enjoy", "experiment without checkpoints", f"{ENJOY} --experiment nockpt", "has no usable checkpoint"),
    Case("enjoy", "config.json not JSON", f"{ENJOY} --experiment badjson", "cannot be read as the JSON fastrl writes"),
    Case("enjoy", "config.json not an object", f"{ENJOY} --experiment listjson", "holds a JSON list"),
    Case("enjoy", "--checkpoint is a special file", f"{ENJOY} --experiment good --checkpoint /proc/self/status",
         "is not a fastrl checkpoint"),
    Case("enjoy", "newest checkpoint forged to run code", f"{ENJOY} --experiment forged", RUNS_CODE),
    Case("enjoy", "--checkpoint forged to run code", f"{ENJOY} --experiment good --checkpoint {FORGED_NEWEST}",
         RUNS_CODE),
    Case("enjoy", "every checkpoint damaged", f"{ENJOY} --experiment damaged", ALL_DAMAGED),
    Case("enjoy", "a policy the experiment does not have", f"{ENJOY} --experiment good --policy 5",
         "--policy 5 does not exist"),
    Case("enjoy", "env of other spaces", "--env Acrobot-v1 --train_dir {root}/train --experiment good",
         "does not fit the model for Acrobot-v1"),
    Case("enjoy", "env fails to construct", "--env failing_env:Failing-v0 --train_dir {root}/train --experiment "
         "good", "could not be made (DependencyNotInstalled: needs frobnicate"),
    Case("enjoy", "video not .mp4", f"{ENJOY} --experiment good --save_video {{root}}/adir",
         "must name an .mp4 file"),
    Case("enjoy", "video under a file", f"{ENJOY} --experiment good --save_video {{root}}/afile/run.mp4",
         f"{NOT_WRITABLE} ({{root}}/afile is not a folder)"),
    Case("enjoy", "video in /proc", f"{ENJOY} --experiment good --save_video /proc/run.mp4", NOT_WRITABLE),
    # -- bench
    Case("bench", "unknown mode", "--env CartPole-v1 --mode fast", "argument --mode: invalid choice: 'fast'"),
    Case("bench", "zero seconds", f"{BENCH} --seconds 0", "--seconds is 0 but must be a positive number"),
    Case("bench", "NaN warm-up", f"{BENCH} --warmup nan", "--warmup is nan but must be a number"),
    Case("bench", "NaN train option", f"{BENCH} --lr nan", "--lr is nan but must be a finite number"),
    Case("bench", "--json is a folder", f"{BENCH} --json {{root}}/adir", f"{NOT_WRITABLE} ({{root}}/adir is a folder)"),
    Case("bench", "--json in /proc", f"{BENCH} --json /proc/bench.json", NOT_WRITABLE),
    Case("bench", "several policies", f"{BENCH} --num_policies 2", "fastrl.bench measures one policy's pipeline"),
    Case("bench", "env fails to construct", "--env failing_env:Failing-v0 --mode infer --plan off",
         "could not be made (DependencyNotInstalled: needs frobnicate"),
    # -- plot
    Case("plot", "no experiment", "", "the following arguments are required: EXP_DIR"),
    Case("plot", "unknown option", "{root}/train/good --nope", "unrecognized arguments: --nope"),
    Case("plot", "no such experiment", "{root}/nowhere", "has no TensorBoard folder"),
    Case("plot", "a file for an experiment", "{root}/afile", "has no TensorBoard folder"),
    Case("plot", "experiment without the metric", "{root}/train/good --metric train/nope",
         "has no 'train/nope' values yet"),
    Case("plot", "--by_policy for a run of one policy", "{root}/train/good --by_policy", "has no per-policy returns"),
    Case("plot", "--out without an extension", "{root}/train/good --out {root}/curves", "must end in an image type"),
    Case("plot", "--out of an unknown type", "{root}/train/good --out {root}/curves.xyz", "must end in an image type"),
    Case("plot", "--out is a folder", "{root}/train/good --out {root}/adir.png",
         f"{NOT_WRITABLE} ({{root}}/adir.png is a folder)"),
    Case("plot", "--out under a file", "{root}/train/good --out {root}/afile/curves.png",
         f"{NOT_WRITABLE} ({{root}}/afile is not a folder)"),
    Case("plot", "--out in /proc", "{root}/train/good --out /proc/curves.png", NOT_WRITABLE),
]
IDS = [f"{c.command}: {c.what}" for c in CASES]


# Files that stand in the rows' way, by their path under {root}.
FILES = {
    "afile": "a file, not a folder\n",
    "notes.cfg": "buy milk\nsee Bob\n",
    "bad_plan.json": "not JSON\n",
    "typo_plan.json": ('{"num_workers": "two", "num_envs_per_worker": 8, "inference": "local", '
                       '"num_policy_workers": 1, "learner_threads": 1, "num_buffers": 4}\n'),
    "boom_env.py": 'raise RuntimeError("boom at import")\n',
    "failing_env.py": (
        "import gymnasium as gym\n\n\n"
        "class Failing(gym.Env):  # fails to be made as an env with a missing dependency does\n"
        "    metadata = {'render_modes': ['rgb_array']}\n\n"
        "    def __init__(self, render_mode=None):\n"
        "        raise gym.error.DependencyNotInstalled('needs frobnicate: pip install frobnicate')\n\n\n"
        "gym.register(id='Failing-v0', entry_point=Failing)\n"),
    "train/afile": "a file where an experiment folder would go\n",
    "train/badjson/config.json": "{nope\n",
    "train/listjson/config.json": "[1, 2]\n",
    "train/ckptfile/checkpoints": "a file where the checkpoint folder would go\n",
}


def build_scratch(root: str) -> None:
    """The files the rows point at."""
    for name, text in FILES.items():
        os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
        with open(os.path.join(root, name), "w") as fh:
            fh.write(text)
    for folder in ("adir", "adir.png", "train/good/tb"):
        os.makedirs(os.path.join(root, folder))
    train = os.path.join(root, "train")
    good = make_experiment(train, "good")
    for name in ("nockpt", "ckptfile"):  # the config of a model the rows' options build
        os.makedirs(os.path.join(train, name), exist_ok=True)
        shutil.copy(os.path.join(good.experiment_dir, "config.json"), os.path.join(train, name, "config.json"))
    # Rows run two at a time, and a train row locks its experiment: each resuming row has its own copy.
    for name in ("good_env", "good_model", "good_restart", "good_policies"):
        make_experiment(train, name)
    forged = make_experiment(train, "forged")
    state = load_checkpoint(os.path.join(checkpoint_dir(forged), "checkpoint_000000000003.pt"))
    forge_checkpoint(FORGED_NEWEST.format(root=root),
                     {**state, "version": 4, "extra": MarkerPayload(os.path.join(root, "code_ran"))})
    damaged = os.path.join(checkpoint_dir(make_experiment(train, "damaged")), "checkpoint_000000000003.pt")
    with open(damaged, "r+b") as fh:
        fh.truncate(os.path.getsize(damaged) // 2)


def snapshot(root: str) -> dict:
    """Every path under root, with each file's size and modification time. Not a
    folder's: checking that a folder can be written (plumbing/files.py) makes and
    removes an entry in it, which changes its time and nothing else."""
    found = {}
    for folder, dirs, files in os.walk(root):
        found.update({os.path.relpath(os.path.join(folder, name), root): "folder" for name in dirs})
        for name in files:
            info = os.lstat(os.path.join(folder, name))
            found[os.path.relpath(os.path.join(folder, name), root)] = (info.st_size, info.st_mtime_ns)
    return found


def run_cases(cases: list, root: str, cwd: str) -> list:
    """Every row's command as a user runs it, forked from one interpreter that has
    imported torch (fork_launcher.py says why and what that leaves out). A row that
    was not refused may go on training, so it gets TIMEOUT_S and then its whole
    process group is killed, and the row fails."""
    # No bytecode caches and a working folder outside root: the rows must leave root as it was.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (REPO, root, os.environ.get("PYTHONPATH")) if p)}
    jobs = [{"module": f"fastrl.{case.command}", "args": shlex.split(case.argv.format(root=root)), "cwd": cwd}
            for case in cases]
    launcher = subprocess.run([sys.executable, os.path.join(TESTS, "fork_launcher.py")], cwd=cwd, env=env,
                              input=json.dumps({"jobs": jobs, "parallel": 2, "timeout": TIMEOUT_S}),
                              capture_output=True, text=True, timeout=TIMEOUT_S * len(cases))
    assert launcher.returncode == 0, launcher.stderr
    return [subprocess.CompletedProcess(job["args"], r["returncode"], r["stdout"], r["stderr"])
            for job, r in zip(jobs, json.loads(launcher.stdout))]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every row's result, and the scratch folder before and after all of them ran."""
    root = str(tmp_path_factory.mktemp("scratch"))
    cwd = str(tmp_path_factory.mktemp("cwd"))
    build_scratch(root)
    before = snapshot(root)
    results = run_cases(CASES, root, cwd)
    return results, before, snapshot(root), root


@pytest.mark.parametrize("index", range(len(CASES)), ids=IDS)
def test_bad_input_is_refused_in_one_sentence(outcomes, index):
    case, result, root = CASES[index], outcomes[0][index], outcomes[3]
    said = f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 2, said
    assert "Traceback" not in result.stdout + result.stderr, said
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, said
    assert lines[0].startswith(PREFIX[case.command]) and len(lines[0]) < MAX_MESSAGE, said
    assert case.expect.format(root=root) in lines[0], said


def test_nothing_is_left_behind(outcomes):
    _, before, after, root = outcomes
    assert not os.path.exists(os.path.join(root, "code_ran"))
    changed = sorted(path for path in before.keys() | after.keys() if before.get(path) != after.get(path))
    assert changed == []
