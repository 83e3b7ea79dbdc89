"""Start-up time of `python -m fastrl.train`, from the command's launch.

    python benchmarks/startup.py [--env doom_battle] [--launches 3] [--cases cold,warm] [train options...]

Launches the trainer as a user would (a fresh process, a fresh experiment), waits
for the line that says the first batch was trained, then stops it with a Ctrl-C
to its process group. Two cases:
- cold: an empty profile cache (a temporary XDG_CACHE_HOME per launch), so the
  run measures its precision and profiles the machine for its plan, as a
  machine's first run of a setup does;
- warm: a cache filled by one untimed launch first, as every later run finds it.
Reports, per case, the median over the launches of the seconds from launch to
- the plan line and the start-up line ("fastrl: training ..."),
- the first env frames (the first rollout worker that reset its envs),
- the first trained batch (summary.json `first_batch_s`, which counts from the
  runner process's creation, the command's launch);
and the timeline of where the seconds went, from the marks every process writes
with FASTRL_TIMELINE set (fastrl/plumbing/timeline.py): each event's first and last
time, median over the launches. Each case's median first batch goes to
benchmarks/results/startup_<env>_<case>.jsonl. Time it on a quiet machine: nothing else should
be running (`ps aux`), or say that the numbers come from a shared CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil
import records

from fastrl.plumbing.timeline import ENV_VAR, read

STOP_TIMEOUT_S = 60.0
# Per-worker events read as one: "rollout-worker 1: env made" -> "rollout-worker *: env made".
WORKER_NUMBER = re.compile(r"(rollout-worker|policy-worker) \d+")


def launch(env: str, train_args: list, cache: str, timeout: float) -> dict:
    """One launch until its first trained batch; the seconds from launch to each
    console line that matters and to each timeline event (first and last)."""
    with tempfile.TemporaryDirectory() as work:
        timeline = os.path.join(work, "timeline.tsv")
        child_env = {**os.environ, "XDG_CACHE_HOME": cache, ENV_VAR: timeline, "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "fastrl.train", "--env", env, "--train_dir", work,
               "--train_for_seconds", str(timeout), *train_args]
        start = time.time()
        proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        lines = _until_first_batch(proc, start)
        _stop(proc)
        with open(os.path.join(work, env, "summary.json")) as fh:
            summary = json.load(fh)
        marks = read(timeline)
    result = {"lines": lines, "first_batch_s": summary["first_batch_s"], "events": {}}
    for t, _pid, event in marks:
        first, last = result["events"].get(WORKER_NUMBER.sub(r"\1 *", event), (t - start, t - start))
        result["events"][WORKER_NUMBER.sub(r"\1 *", event)] = (min(first, t - start), max(last, t - start))
    return result


def _until_first_batch(proc, start: float) -> dict:
    """{what: seconds from launch} for the console lines that mark start-up, read
    until the first-batch line (or the end of the output), and the plan's layout."""
    seen = {}
    for line in proc.stdout:
        now = time.time() - start
        seen.setdefault("first output", now)
        if line.startswith("fastrl: plan:"):
            seen["plan"] = line.split(";")[0].removeprefix("fastrl: plan: ")
        for key, prefix in (("plan line", "fastrl: plan:"), ("start-up line", "fastrl: training "),
                            ("first batch line", "fastrl: first batch trained")):
            if line.startswith(prefix):
                seen.setdefault(key, now)
        if line.startswith("fastrl: first batch trained"):
            return seen
    raise RuntimeError(f"the run ended (code {proc.wait()}) before its first trained batch")


def _stop(proc) -> None:
    """Ctrl-C, as a terminal sends it to the whole group; the run saves and exits."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.communicate(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def report(case: str, runs: list) -> None:
    """Medians over the launches of one case."""
    def median(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else float("nan")

    print(f"\n== {case} profile cache: median of {len(runs)} launches (each: "
          + ", ".join(f"{r['first_batch_s']:.1f}" for r in runs) + " s to the first trained batch)")
    for plan in sorted({r["lines"].get("plan", "no plan") for r in runs}):
        print(f"  plan: {plan}")
    for key in ("first output", "plan line", "start-up line"):
        print(f"  {key:<44} {median(r['lines'].get(key) for r in runs):6.2f} s")
    first_frames = median(r["events"].get("rollout-worker *: envs reset", (None,))[0] for r in runs)
    print(f"  {'first env frames (a worker reset its envs)':<44} {first_frames:6.2f} s")
    print(f"  {'first trained batch (summary first_batch_s)':<44} {median(r['first_batch_s'] for r in runs):6.2f} s")
    print("  timeline (first .. last occurrence, seconds from launch):")
    events = {event for r in runs for event in r["events"]}
    rows = sorted(((median(r["events"].get(e, (None, None))[0] for r in runs),
                    median(r["events"].get(e, (None, None))[1] for r in runs), e) for e in events))
    for first, last, event in rows:
        span = f"{first:6.2f}" if abs(last - first) < 0.005 else f"{first:6.2f} .. {last:6.2f}"
        print(f"    {span:<16} {event}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--cases", default="cold,warm", help="cold, warm or both, comma-separated")
    parser.add_argument("--timeout", type=float, default=300.0, help="--train_for_seconds of each launch: a bound")
    parser.add_argument("--json", help="also write every launch's numbers to this file")
    args, train_args = parser.parse_known_args()
    unknown = set(args.cases.split(",")) - {"cold", "warm"}
    if unknown:
        parser.error(f"--cases takes cold and warm, not {', '.join(sorted(unknown))}")
    print(f"machine: {records.cpu_model()}, {psutil.cpu_count()} logical cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB")
    print("command: python -m fastrl.train --env", args.env, *train_args, flush=True)
    results = {}
    for case in args.cases.split(","):
        with tempfile.TemporaryDirectory() as shared_cache:
            if case == "warm":
                launch(args.env, train_args, shared_cache, args.timeout)  # fills the cache, untimed
            runs = []
            for _ in range(args.launches):
                with tempfile.TemporaryDirectory() as fresh_cache:
                    runs.append(launch(args.env, train_args, fresh_cache if case == "cold" else shared_cache,
                                       args.timeout))
        results[case] = runs
        report(case, runs)
        seconds = [round(r["first_batch_s"], 2) for r in runs]
        records.append(f"startup_{args.env}_{case}",
                       {"first_batch_median_s": round(statistics.median(seconds), 2), "first_batch_s": seconds,
                        "plan": sorted({r["lines"].get("plan", "no plan") for r in runs})},
                       records.this_command())
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": records.cpu_model(), "results": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
