"""Can one disturbed run make later runs slower? The main command, run as a user
would, on a private empty cache:

    python benchmarks/plan_after_disturbance.py --env doom_battle --seconds 150 --after 3

1. a quiet run on the empty cache: the reference rate;
2. a run with CPU burners beside it on every core (a package install, another job);
3. --after quiet runs on the caches the first two left.

Each run's steady trained rate (summary.json) and plan are printed; the figure is the
slowest later run over the reference. The layout memory keeps only runs that measured
their layout (fastrl/tuning/layout_memory.py), so every later run should plan as the
first did and train within the spread between quiet runs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import records

BURN = "import time\nt = time.time()\nwhile time.time() - t < 3600: pass"


def train(env: str, seconds: float, cache: str, train_dir: str, name: str, extra: list) -> dict:
    """One `python -m fastrl.train` run; its summary, plan line and memory line."""
    cmd = [sys.executable, "-m", "fastrl.train", "--env", env, "--train_for_seconds", str(seconds),
           "--train_dir", train_dir, "--experiment", name, *extra]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "XDG_CACHE_HOME": cache})
    if done.returncode != 0:
        raise SystemExit(f"plan_after_disturbance: run {name} failed (exit {done.returncode}):\n{done.stdout[-3000:]}")
    with open(os.path.join(train_dir, name, "summary.json")) as fh:
        summary = json.load(fh)
    lines = done.stdout.splitlines()
    plan = next((line for line in lines if line.startswith("fastrl: plan:")), "")
    memory = next((line for line in lines if "for the next plan" in line), "")
    return {"fps": summary["steady_trained_frames_per_s"], "first_batch_s": summary["first_batch_s"], "plan": plan,
            "memory": memory}


def _layout(plan_line: str) -> str:
    """The processes a plan line names (workers x envs, inference, learner threads), not the niceness,
    which follows the learner's cost as a compile's measured speed-up is learned."""
    return plan_line.split(";")[0].split(", workers at nice")[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--seconds", type=float, default=150.0, help="each run's --train_for_seconds")
    parser.add_argument("--after", type=int, default=3, help="quiet runs after the disturbed one")
    args, extra = parser.parse_known_args()
    print(f"machine: {records.cpu_model()}, {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as train_dir:
        def run(name: str) -> dict:
            result = train(args.env, args.seconds, cache, train_dir, name, extra)
            print(f"{name}: {result['fps']:,.0f} env frames/s trained in steady state, first batch "
                  f"{result['first_batch_s']:.1f} s after launch\n  {result['plan']}\n  {result['memory']}", flush=True)
            return result

        first = run("quiet")
        burners = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(os.cpu_count() or 1)]
        try:
            run("disturbed")
        finally:
            for b in burners:
                b.kill()
                b.wait()
        later = [run(f"after_{i + 1}") for i in range(args.after)]
    ratios = [r["fps"] / first["fps"] for r in later]
    same_plan = sum(_layout(r["plan"]) == _layout(first["plan"]) for r in later)
    print(f"later runs at {', '.join(f'{x:.2f}' for x in ratios)}x of the first; "
          f"{same_plan} of {len(later)} planned its layout")
    records.append(f"plan_after_disturbance_{args.env}",
                   {"first_fps": round(first["fps"]), "later_fps": [round(r["fps"]) for r in later],
                    "first_batch_s_empty_cache": round(first["first_batch_s"], 1),
                    "slowest_later_ratio": round(min(ratios), 3), "same_layout": f"{same_plan} of {len(later)}"},
                   records.this_command())
    return 0


if __name__ == "__main__":
    sys.exit(main())
