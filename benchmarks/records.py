"""What a standing benchmark measured: one JSON line per run, so that the headline
table in benchmarks/README.md is generated from the measurements, not typed in.

    import records
    records.append("cartpole_time_to_300", {"median_seconds": 3.9}, records.this_command())

Each question (what a benchmark answers, named by the script and the arguments that
change the answer) has its own file, benchmarks/results/<question>.jsonl, newest line
last. A line holds the figure(s), the machine, the command, the UTC date and the git
commit. benchmarks/report.py puts the newest line of every file into the table.

From a shell, for a figure read off a log (gpu_check.sh's layouts, say):

    python benchmarks/records.py QUESTION '{"trained_fps": 65604}' 'bash benchmarks/gpu_check.sh layouts'

Only the standard library at import, so that report.py reads records without torch;
the machine's names are looked up when a record is written.
"""
from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
from typing import Optional

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCHMARKS)
# The folder records go to when the caller names none. The tests point it at a
# temporary folder, so that a benchmark they run end to end leaves results/ alone.
FOLDER_VAR = "FASTRL_BENCHMARK_RESULTS"
QUESTION = re.compile(r"[A-Za-z0-9._-]+")


def default_folder() -> str:
    return os.environ.get(FOLDER_VAR) or os.path.join(BENCHMARKS, "results")


def cpu_model() -> str:
    """The CPU as fastrl's profile cache names it: /proc/cpuinfo's model name and, on
    x86, its family, model and best vector extension (one cloud name can cover CPUs
    that rank fp32 and bf16 opposite ways). Every benchmark's machine line uses it."""
    from fastrl.tuning.profiling import cpu_model as named  # here, not at the top: it imports torch

    return named()


def gpu_name() -> Optional[str]:
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def machine() -> dict:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "gpu": gpu_name()}


def git_commit(repo: str = REPO) -> Optional[str]:
    """HEAD's short hash, with "+dirty" when a tracked file differs from it. The results
    folder does not count: the last record appended must not make the next one dirty."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if changed else "")


def this_command() -> str:
    """The running script's command line as typed from the repository root."""
    script = os.path.relpath(os.path.abspath(sys.argv[0]), REPO)
    return shlex.join(["python", script, *sys.argv[1:]])


def append(question: str, figure: dict, command: str, folder: Optional[str] = None,
           made_by: Optional[dict] = None) -> dict:
    """Add one record to <folder>/<question>.jsonl and return it. `made_by` ({"machine",
    "commit"}) names where the figure's runs were made, when not here and now."""
    if not QUESTION.fullmatch(question):
        raise ValueError(f"a question names a file: letters, digits, '.', '_' and '-' only, not {question!r}")
    made_by = made_by or {"machine": machine(), "commit": git_commit()}
    record = {"question": question, "figure": figure, "machine": made_by["machine"], "command": command,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "commit": made_by["commit"]}
    folder = folder or default_folder()
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{question}.jsonl"), "a") as fh:
        fh.write(json.dumps(record) + "\n")
    print(f"recorded in {os.path.join(folder, question)}.jsonl: {json.dumps(figure)}", flush=True)
    return record


def newest(folder: Optional[str] = None) -> dict:
    """{question: its newest record}, for every .jsonl file in the folder."""
    folder = folder or default_folder()
    found = {}
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.endswith(".jsonl"):
            with open(os.path.join(folder, name)) as fh:
                lines = [line for line in fh if line.strip()]
            if lines:
                found[name[:-len(".jsonl")]] = json.loads(lines[-1])
    return found


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    append(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3])
