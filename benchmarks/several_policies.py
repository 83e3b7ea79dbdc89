"""What training several policies at once costs, and what population-based training buys.

    python benchmarks/several_policies.py [--env doom_basic] [--frames 2000000] [--policies 4] [--seeds 0]
                                          [train options...]

Trains `--env` for the same env-frame budget with one policy and with `--policies`
policies under `--with_pbt true`, alternating per seed so that both see the same
machine load, and prints for each run: env frames/s from launch and trained env
frames/s from the first trained batch on (summary.json), and the return of the best
policy (the mean of its last 100 episodes; for one policy, its own). The cost of P
policies is the ratio of their frames/s to one policy's, measured under the same load,
and goes to benchmarks/results/several_policies_<env>.jsonl.
Extra options (after the known ones) go to both runs; `--pbt_period_env_steps`
defaults here to a tenth of each policy's share of the budget, so that a run sees
about ten rounds.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile

import psutil
import records
from fastrl.envs.registry import get_spec


def run_once(env: str, policies: int, frames: int, seed: int, train_args: list, keep_in: str = "") -> dict:
    with contextlib.ExitStack() as stack:
        train_dir = keep_in or stack.enter_context(tempfile.TemporaryDirectory())
        experiment = f"{env}_{policies}p_seed{seed}"
        several = ["--num_policies", str(policies), "--with_pbt", "true"] if policies > 1 else []
        if policies > 1 and not any(a.startswith("--pbt_period_env_steps") for a in train_args):
            # Agent steps per policy: frames / frameskip / policies; a tenth of that per round.
            several += ["--pbt_period_env_steps", str(max(1, frames // get_spec(env).frameskip // policies // 10))]
        cmd = [sys.executable, "-m", "fastrl.train", "--env", env, "--seed", str(seed), "--experiment", experiment,
               "--train_for_env_frames", str(frames), "--train_dir", train_dir, "--status_every_seconds", "30",
               "--restart", *several, *train_args]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(train_dir, experiment, "summary.json")) as fh:
            summary = json.load(fh)
        rounds = 0
        log = os.path.join(train_dir, experiment, "pbt.jsonl")
        if os.path.isfile(log):
            with open(log) as fh:
                rounds = len({json.loads(line)["round"] for line in fh if line.strip()} - {0})
    # A policy replaced by PBT starts its 100-episode window again; in a short run of
    # long episodes (doom_duel) no policy may have finished one since.
    returns = ([p["mean_return_100"] for p in summary["policies"] if p["mean_return_100"] is not None]
               if policies > 1 else [r for r in [summary["mean_return_100"]] if r is not None])
    return {"fps": summary["fps"], "trained_fps": summary["measured_trained_frames_per_s"],
            "best_return": max(returns) if returns else None, "returns": returns, "seconds": summary["wall_seconds"],
            "pbt_rounds_with_changes": rounds}


def _median(values: list):
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _rounded(value):
    return None if value is None else round(value, 2)


def _text(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_basic")
    parser.add_argument("--frames", type=int, default=2_000_000)
    parser.add_argument("--policies", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--keep_in", default="", metavar="TRAIN_DIR",
                        help="Keep each run's experiment here (<env>_<P>p_seed<S>), for fastrl.plot --by_policy; "
                             "by default they go to a temporary folder.")
    args, train_args = parser.parse_known_args()
    print(f"machine: {records.cpu_model()}, {psutil.cpu_count()} logical cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB; load average {os.getloadavg()[0]:.1f}")
    print(f"{args.env}, {args.frames:,} env frames per run, 1 policy against {args.policies} with PBT; "
          f"extra options: {' '.join(train_args) or 'none'}")
    results = {1: [], args.policies: []}
    for seed in args.seeds:
        for policies in results:
            r = run_once(args.env, policies, args.frames, seed, train_args, args.keep_in)
            results[policies].append(r)
            each = " / ".join(f"{x:.2f}" for x in r["returns"])
            print(f"seed {seed}, {policies} polic{'y' if policies == 1 else 'ies'}: {r['fps']:,.0f} fps from launch, "
                  f"{r['trained_fps']:,.0f} trained in steady state, {r['seconds']:.0f} s; best return(100) "
                  f"{_text(r['best_return'])} (each: {each or '-'}); PBT rounds that changed a policy: "
                  f"{r['pbt_rounds_with_changes']}", flush=True)
    med = {p: {k: _median([r[k] for r in rs]) for k in ("fps", "trained_fps", "best_return")}
           for p, rs in results.items()}
    one, many = med[1], med[args.policies]
    print(f"median, 1 policy: {one['fps']:,.0f} fps, {one['trained_fps']:,.0f} trained, "
          f"best return {_text(one['best_return'])}")
    print(f"median, {args.policies} policies: {many['fps']:,.0f} fps, {many['trained_fps']:,.0f} trained, "
          f"best return {_text(many['best_return'])}")
    print(f"{args.policies} policies / 1 policy: {many['fps'] / one['fps']:.2f}x fps from launch, "
          f"{many['trained_fps'] / one['trained_fps']:.2f}x trained in steady state; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    records.append(f"several_policies_{args.env}",
                   {"policies": args.policies, "fps_ratio_from_launch": round(many["fps"] / one["fps"], 2),
                    "trained_fps_ratio": round(many["trained_fps"] / one["trained_fps"], 2),
                    "best_return_one_policy": _rounded(one["best_return"]),
                    "best_return_several": _rounded(many["best_return"]),
                    "frames": args.frames}, records.this_command())
    return 0


if __name__ == "__main__":
    sys.exit(main())
