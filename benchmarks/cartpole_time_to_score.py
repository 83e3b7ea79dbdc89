"""Time to a 100-episode mean return on CartPole-v1, from command launch.

    python benchmarks/cartpole_time_to_score.py [--seeds 0 1 2] [--target 300] [train options...]

Runs `python -m fastrl.train` once per seed, as a user would, and reads each
run's summary.json: `reached_reward_at_seconds` counts from the process's
launch, so start-up (imports, process creation) is included. Prints each seed
and the median, and the machine it ran on; records the median in
benchmarks/results/cartpole_time_to_<target>.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

import psutil
import records


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=300.0)
    parser.add_argument("--budget_seconds", type=float, default=120.0, help="give up on a seed after this long")
    args, train_args = parser.parse_known_args()
    print(f"machine: {records.cpu_model()}, {psutil.cpu_count()} logical cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, python {platform.python_version()}")
    times = []
    with tempfile.TemporaryDirectory() as train_dir:
        for seed in args.seeds:
            cmd = [sys.executable, "-m", "fastrl.train", "--env", "CartPole-v1", "--seed", str(seed),
                   "--stop_at_reward", str(args.target), "--train_for_seconds", str(args.budget_seconds),
                   "--train_dir", train_dir, "--experiment", f"seed{seed}", "--status_every_seconds", "1000",
                   *train_args]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(train_dir, f"seed{seed}", "summary.json")) as fh:
                summary = json.load(fh)
            reached = summary["reached_reward_at_seconds"]
            times.append(reached)
            print(f"seed {seed}: {'not reached' if reached is None else f'{reached:.1f} s'} "
                  f"({summary['env_frames']:,} env frames, {summary['fps']:,.0f} fps)", flush=True)
    # A seed that never got there counts as slower than any that did.
    median = statistics.median(float("inf") if t is None else t for t in times)
    print(f"median time to a 100-episode mean of {args.target:g}: {median:.1f} s "
          f"over seeds {args.seeds}; train options: {' '.join(train_args) or '(defaults)'}")
    records.append(f"cartpole_time_to_{args.target:g}",
                   {"median_seconds": None if median == float("inf") else round(median, 1),
                    "seconds_per_seed": [None if t is None else round(t, 1) for t in times]},
                   records.this_command())
    return 0


if __name__ == "__main__":
    sys.exit(main())
