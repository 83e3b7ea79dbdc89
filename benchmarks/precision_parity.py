"""Does bf16 arithmetic learn as well as fp32, frame for frame, and how much faster is it?

    python benchmarks/precision_parity.py [--env doom_basic] [--frames 300000] [--seeds 0 1] [train options...]

Trains `--env` for the same env-frame budget with `--precision fp32` and with
`--precision bf16`, alternating per seed so that both see the same machine load,
and prints each run's mean return of its last 100 episodes and its wall time,
then the medians (recorded in benchmarks/results/precision_parity_<env>.jsonl). A
learning difference shows as a return gap at equal frames; the speed difference as a
wall-time ratio measured under the same load.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import psutil
import records


def run_once(env: str, precision: str, frames: int, seed: int, train_args: list) -> dict:
    with tempfile.TemporaryDirectory() as train_dir:
        cmd = [sys.executable, "-m", "fastrl.train", "--env", env, "--precision", precision, "--seed", str(seed),
               "--train_for_env_frames", str(frames), "--train_dir", train_dir, "--status_every_seconds", "30",
               *train_args]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(train_dir, env, "summary.json")) as fh:
            summary = json.load(fh)
    return {"return": summary["mean_return_100"], "seconds": summary["wall_seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_basic")
    parser.add_argument("--frames", type=int, default=300_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args, train_args = parser.parse_known_args()
    print(f"machine: {records.cpu_model()}, {psutil.cpu_count()} logical cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB; load average {os.getloadavg()[0]:.1f}")
    print(f"{args.env}, {args.frames:,} env frames per run, extra options: {' '.join(train_args) or 'none'}")
    results = {"fp32": [], "bf16": []}
    for seed in args.seeds:
        for precision in results:
            r = run_once(args.env, precision, args.frames, seed, train_args)
            results[precision].append(r)
            print(f"seed {seed} {precision}: return(100) {r['return']:8.2f} in {r['seconds']:6.1f} s", flush=True)
    medians = {p: (statistics.median(r["return"] for r in rs), statistics.median(r["seconds"] for r in rs))
               for p, rs in results.items()}
    for p, (ret, secs) in medians.items():
        print(f"median {p}: return(100) {ret:8.2f}, {secs:6.1f} s")
    wall_ratio = medians["bf16"][1] / medians["fp32"][1]
    print(f"bf16 wall time / fp32 wall time: {wall_ratio:.2f}; load average at the end {os.getloadavg()[0]:.1f}")
    records.append(f"precision_parity_{args.env}",
                   {"fp32_return_median": round(medians["fp32"][0], 2),
                    "bf16_return_median": round(medians["bf16"][0], 2),
                    "bf16_over_fp32_wall_time": round(wall_ratio, 2), "frames": args.frames}, records.this_command())
    return 0


if __name__ == "__main__":
    sys.exit(main())
