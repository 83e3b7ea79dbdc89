"""Training throughput of `python -m fastrl.train` over a fixed wall time.

    python benchmarks/train_throughput.py --env doom_battle --seconds 300 [train options...]

Runs the trainer as a user would, for --seconds from launch, and reports:
- from launch: env frames / wall seconds (summary.json `fps`: start-up included);
- steady state: the env frames/s of the status lines after --warmup seconds,
  averaged (frames = agent steps x frameskip, so Doom's 4 frames per step count 4).
It prints the machine, the exact command and the plan the run chose, and records both
rates in benchmarks/results/train_throughput_<env>.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import psutil
import records

STATUS = re.compile(r"^\[\s*([\d.]+)s\] frames [\d,]+ \| ([\d,]+) fps .* trained ([\d,]+) samples/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--warmup", type=float, default=60.0)
    args, train_args = parser.parse_known_args()
    print(f"machine: {records.cpu_model()}, {psutil.cpu_count()} logical cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB")
    with tempfile.TemporaryDirectory() as train_dir:
        cmd = [sys.executable, "-m", "fastrl.train", "--env", args.env, "--train_for_seconds", str(args.seconds),
               "--train_dir", train_dir, "--status_every_seconds", "10", *train_args]
        print("command:", " ".join(cmd[1:]), flush=True)
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        with open(os.path.join(train_dir, args.env, "summary.json")) as fh:
            summary = json.load(fh)
    steady = [(float(m[2].replace(",", "")), float(m[3].replace(",", "")))
              for m in map(STATUS.match, out.splitlines()) if m and float(m[1]) >= args.warmup]
    for line in out.splitlines():
        if line.startswith("fastrl: plan:") or "measured" in line or "the learner's step" in line \
                or "the rollout workers' forward" in line:
            print(line)
    print(f"from launch: {summary['env_frames']:,} env frames in {summary['wall_seconds']:.0f} s = "
          f"{summary['fps']:,.0f} env frames/s; mean return(100) {summary['mean_return_100']}")
    figure = {"steady_fps": None, "trained_samples_per_s": None, "launch_fps": round(summary["fps"])}
    if steady:
        fps = statistics.mean(s[0] for s in steady)
        trained = statistics.mean(s[1] for s in steady)
        print(f"steady state (after {args.warmup:g} s, {len(steady)} status lines): {fps:,.0f} env frames/s, "
              f"{trained:,.0f} samples/s trained")
        figure.update(steady_fps=round(fps), trained_samples_per_s=round(trained))
    records.append(f"train_throughput_{args.env}", figure, records.this_command())
    return 0


if __name__ == "__main__":
    sys.exit(main())
