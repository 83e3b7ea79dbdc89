"""Does keeping the learner's large blocks (fastrl/plumbing/caching_allocator.py)
make its step cheaper, and its memory steadier?

    python benchmarks/caching_allocator.py [--env doom_battle] [--rounds 8] [--steps 5] [--compiled]

One process, one thread, the learner's gradient step on a minibatch of the
trainer's shape (profiling.ModelBench). The allocator is installed once; each
round runs --steps steps with its cache off (max 0 bytes: every block goes back
to the system as torch's own allocator does) and --steps with it on, in
alternating order, and records per step the wall time, the process's CPU time in
the kernel and its minor page faults. It prints the medians, the ratio (cached /
system) and the private memory (USS) seen after each arm's steps. With
--compiled the model's evaluate goes through torch.compile first, as the
trainer's learner runs it on Doom.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

import psutil
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cartpole_time_to_score import cpu_model  # noqa: E402  the same machine line in every benchmark
from fastrl.envs.registry import get_spec  # noqa: E402

from fastrl.algo.model import Precision  # noqa: E402
from fastrl.config import parse_args  # noqa: E402
from fastrl.plumbing import caching_allocator  # noqa: E402
from fastrl.tuning.profiling import ModelBench  # noqa: E402

CACHE_BYTES = 2 << 30


def step_costs(train) -> tuple:
    """(wall s, kernel CPU s, minor faults) of one call."""
    before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    train()
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    return wall, after.ru_stime - before.ru_stime, after.ru_minflt - before.ru_minflt


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="steps per arm per round")
    parser.add_argument("--compiled", action="store_true", help="torch.compile the model's evaluate first")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    cfg, _ = parse_args(["--env", args.env])
    obs_space, action_space = get_spec(cfg.env).spaces()
    caching_allocator.install(0)
    bench = ModelBench(cfg, obs_space, action_space, [8], Precision(args.precision, args.precision, ""))
    if args.compiled:
        bench.learner.evaluate = torch.compile(bench.learner.evaluate)
    samples = bench.minibatch["rewards"].numel()
    print(f"caching_allocator: {args.env}, {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"1 thread, {args.precision}, evaluate {'compiled' if args.compiled else 'eager'}; learner step on "
          f"{samples} samples, {args.rounds} rounds x {args.steps} steps per arm", flush=True)
    for _ in range(3):  # warm-up (and the compile), untimed
        bench.train()
    me = psutil.Process()
    costs: dict = {"system": [], "cached": []}
    uss: dict = {"system": [], "cached": []}
    for round_ in range(args.rounds):
        for arm in (("system", "cached") if round_ % 2 == 0 else ("cached", "system")):
            caching_allocator.install(CACHE_BYTES if arm == "cached" else 0)
            bench.train()  # the first step of an arm fills (or empties) the cache, untimed
            costs[arm] += [step_costs(bench.train) for _ in range(args.steps)]
            uss[arm].append(me.memory_full_info().uss)
    for arm in ("system", "cached"):
        wall, kernel, faults = (statistics.median(c[i] for c in costs[arm]) for i in range(3))
        print(f"{arm:>7}: step {wall * 1e3:7.1f} ms ({wall / samples * 1e6:6.1f} us a sample), kernel CPU "
              f"{kernel * 1e3:6.1f} ms, {faults:8,.0f} minor faults; USS after the arm "
              f"{min(uss[arm]) / 2**20:,.0f}-{max(uss[arm]) / 2**20:,.0f} MB", flush=True)
    ratio = statistics.median(c[0] for c in costs["cached"]) / statistics.median(c[0] for c in costs["system"])
    print(f"cached / system step time: {ratio:.2f}x; allocator {caching_allocator.stats()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
