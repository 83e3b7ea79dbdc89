"""How close training runs to the compute-bound limit, over several rounds.

    python benchmarks/compute_bound_ratio.py --env doom_battle --rounds 3 [bench options...]

Each round is one `python -m fastrl.bench --mode all`: it measures the env, the
model's forward and fwd+bwd costs (whose sum, spread over the cores, is the
compute-bound limit) for half a window before it samples and trains and half
after, and divides the train rate by the limit of the mean costs. This VM's
speed still moves between rounds (one round read 0.87 and the next, 5 minutes
later, 0.74), so the median of several rounds is the number to quote, with its
spread; each round also prints the limit before and after its runs, and the
ratio's two factors: the cores the run kept busy, and the limit's core time
per agent step over the run's (with the run's by role). Bench
options after the known ones pass through (a layout, a precision). The median goes to
benchmarks/results/compute_bound_ratio_<env>.jsonl.
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


def one_round(env: str, bench_args: list, json_path: str) -> dict:
    cmd = [sys.executable, "-m", "fastrl.bench", "--env", env, "--mode", "all", "--json", json_path, *bench_args]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise SystemExit(f"compute_bound_ratio: the bench failed (exit {done.returncode}):\n{done.stdout[-3000:]}")
    with open(json_path) as fh:
        report = json.load(fh)
    frameskip = report["frameskip"]
    infer, train = report["results"]["infer"], report["results"]["train"]
    return {
        "layout": report.get("plan", {}).get("description") or "as configured",
        "limit_fps": infer["compute_bound"]["steps_per_s"] * frameskip,
        "train_fps": train["frames_per_s"],
        "ratio": report["ratios"]["train_over_compute_bound"],
        "core_us": {k: v * 1e6 for k, v in infer["compute_bound"]["core_s_per_step"].items()},
        "limit_fps_before_after": [sps * frameskip for sps in infer["compute_bound"]["before_and_after_steps_per_s"]],
        "bottleneck": report.get("bottleneck", ""),
        "cores_busy": report["ratios"]["train_cores_busy_fraction"],
        "core_time_ratio": report["ratios"]["limit_over_train_core_s_per_step"],
        "run_us": {k: v * 1e6 for k, v in train["core_s_per_step"].items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--rounds", type=int, default=3, help="bench runs; the median ratio is reported")
    args, bench_args = parser.parse_known_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    print(f"machine: {records.cpu_model()}, {psutil.cpu_count()} logical cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB")
    print("command: python -m fastrl.bench --env", args.env, "--mode all", *bench_args, flush=True)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            r = one_round(args.env, bench_args, os.path.join(tmp, f"round{i}.json"))
            rounds.append(r)
            us = r["core_us"]
            before, after = r["limit_fps_before_after"]
            print(f"round {i + 1}: train {r['train_fps']:,.0f} fps / limit {r['limit_fps']:,.0f} fps = {r['ratio']:.3f}"
                  f"  (limit before the runs {before:,.0f}, after {after:,.0f}; core us per step: env {us['env']:.0f},"
                  f" forward {us['forward']:.0f}, learn {us['learn']:.0f}; {r['bottleneck']})", flush=True)
            run_us = ", ".join(f"{role} {v:.0f}" for role, v in r["run_us"].items())
            print(f"  = cores kept busy {r['cores_busy']:.3f} x core time per step, limit over run"
                  f" {r['core_time_ratio']:.3f} (run's core us per step: {run_us})", flush=True)
    print(f"layout: {rounds[0]['layout']}")
    ratios = [r["ratio"] for r in rounds]
    print(f"median ratio {statistics.median(ratios):.3f} over {len(ratios)} rounds (min {min(ratios):.3f}, "
          f"max {max(ratios):.3f}); median train {statistics.median(r['train_fps'] for r in rounds):,.0f} fps; "
          f"median cores kept busy {statistics.median(r['cores_busy'] for r in rounds):.3f}, "
          f"median limit/run core time per step {statistics.median(r['core_time_ratio'] for r in rounds):.3f}")
    records.append(f"compute_bound_ratio_{args.env}",
                   {"median_ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
                    "median_train_fps": round(statistics.median(r["train_fps"] for r in rounds))},
                   records.this_command())
    return 0


if __name__ == "__main__":
    sys.exit(main())
