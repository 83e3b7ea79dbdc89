"""Does `--plan auto` choose the same layout every time it profiles afresh?

    python benchmarks/plan_stability.py --env doom_battle --rounds 6 [train options...]

Each round is a new Python process that starts the trainer's process server and
plans exactly as `python -m fastrl.train` does, with an empty profile cache, so
every round pays for and decides on its own start-up profile. It prints each
round's plan and prediction, then how many rounds chose each layout (recorded in
benchmarks/results/plan_stability_<env>.jsonl). A planner whose choice flips between
rounds on the same machine is deciding on noise.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

import psutil
import records


def plan_once(train_args: list) -> dict:
    """In this process: plan as the trainer does and return the plan's summary."""
    from fastrl.config import parse_args
    from fastrl.plumbing.proc import start_process_server

    cfg, extra = parse_args(train_args)
    start_process_server()  # the trainer profiles while this server imports torch
    from fastrl.runtime.runner import prepare_experiment
    from fastrl.tuning import planner

    with tempfile.TemporaryDirectory() as train_dir:
        cfg.train_dir, cfg.restart = train_dir, True
        prepared = prepare_experiment(cfg, extra.explicit)
        plan, spec = prepared.plan, prepared.spec
    layout = {k: v for k, v in plan.options().items() if k != "num_buffers"}
    return {"layout": layout, "description": planner.describe(plan, spec.frameskip),
            "predicted_fps": plan.predicted["trained_steps_per_s"] * spec.frameskip}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--rounds", type=int, default=6, help="fresh profiles to take")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a round's own process
    args, passthrough = parser.parse_known_args()
    if args.one:
        print(json.dumps(plan_once(["--env", args.env, *passthrough])))
        return 0
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    print(f"machine: {records.cpu_model()}, {psutil.cpu_count()} logical cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB")
    chosen = collections.Counter()
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory() as cache:
            done = subprocess.run([sys.executable, __file__, "--one", "--env", args.env, *passthrough],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "XDG_CACHE_HOME": cache})
        if done.returncode != 0:
            raise SystemExit(f"plan_stability: round {i + 1} failed (exit {done.returncode}):\n{done.stdout[-3000:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        chosen[json.dumps(result["layout"], sort_keys=True)] += 1
        print(f"round {i + 1}: {result['description']}", flush=True)
    print("layouts chosen:")
    for layout, count in chosen.most_common():
        print(f"  {count} of {args.rounds}: {layout}")
    layout, count = chosen.most_common(1)[0]
    records.append(f"plan_stability_{args.env}",
                   {"layouts_chosen": len(chosen), "most_chosen": f"{count} of {args.rounds}", "layout": layout},
                   records.this_command())
    return 0


if __name__ == "__main__":
    sys.exit(main())
