"""The learner's Adam: fastrl's FusedAdam against torch.optim.Adam on this CPU.

    python benchmarks/optimizer_step.py [--envs doom_battle CartPole-v1] [--seconds 10]

Three costs, each for the env's real model, on one thread as the learner runs:
- one optimizer step, timed in interleaved rounds (one call of each per round, so
  a busy second slows all alike): torch.optim.Adam as the learner made it before
  (its default implementation, which on a CPU loops over the weights), torch's
  fused=True, and fastrl.learning.adam.FusedAdam (the same kernel as fused=True),
  with random gradients;
- the learner's whole gradient step (forward, loss, backward, clipping, Adam) on a
  minibatch of the trainer's shape, with torch.optim.Adam's default against
  FusedAdam, interleaved the same way (--precision: the image encoders');
- the seconds from making the optimizer to the end of its first step in a fresh
  process that has already imported torch, as a learner process has: what each
  adds before a run's first trained batch (torch.optim imports torch._dynamo).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cartpole_time_to_score import cpu_model  # noqa: E402  the same machine line in every benchmark
from fastrl.envs.registry import get_spec  # noqa: E402

from fastrl.algo.model import Precision, build_model  # noqa: E402
from fastrl.config import parse_args  # noqa: E402
from fastrl.learning.adam import FusedAdam  # noqa: E402
from fastrl.tuning.profiling import ModelBench, time_interleaved  # noqa: E402

DEFAULT = "torch.optim.Adam (default)"
MAKERS = {
    DEFAULT: "torch.optim.Adam(params, lr=1e-4, eps=1e-6)",
    "torch.optim.Adam(fused=True)": "torch.optim.Adam(params, lr=1e-4, eps=1e-6, fused=True)",
    "fastrl FusedAdam": "FusedAdam(params, lr=1e-4, eps=1e-6)",
}
FIRST_STEP = """
import time, torch
from fastrl.learning.adam import FusedAdam
params = [torch.nn.Parameter(torch.zeros(64, 64))]
params[0].grad = torch.ones(64, 64)
t = time.perf_counter()
optimizer = {maker}
optimizer.step()
print(time.perf_counter() - t)
"""


def make_optimizer(maker: str, params: list):
    return eval(maker, {"torch": torch, "FusedAdam": FusedAdam, "params": params})


def stepper(cfg, obs_space, action_space, maker: str):
    """One optimizer step of `maker` over the model of `cfg`, gradients set once."""
    torch.manual_seed(0)
    params = list(build_model(cfg, obs_space, action_space).parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    return make_optimizer(maker, params).step


def learner_step(cfg, obs_space, action_space, maker: str, precision: str):
    """The learner's gradient step on the model of `cfg` with the optimizer `maker` makes."""
    bench = ModelBench(cfg, obs_space, action_space, [1], Precision(precision, precision, ""))
    bench.optimizer = make_optimizer(maker, list(bench.learner.parameters()))
    return bench.train


def report(title: str, calls: dict, seconds: float) -> None:
    """Time `calls` ({name: fn}) in interleaved rounds; print each against the default's."""
    timed = time_interleaved({name: (1, fn) for name, fn in calls.items()}, seconds).per_call
    print(f"{title}, median of interleaved rounds:")
    for name in calls:
        print(f"  {name:<30} {timed[name] * 1e3:8.3f} ms  ({timed[name] / timed[DEFAULT]:.2f}x the default's)",
              flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", nargs="+", default=["doom_battle", "CartPole-v1"])
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per env")
    parser.add_argument("--launches", type=int, default=5, help="fresh processes per optimizer for the first step")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"optimizer_step: {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread", flush=True)
    for env in args.envs:
        cfg, _ = parse_args(["--env", env])
        spaces = get_spec(cfg.env).spaces()
        weights = list(build_model(cfg, *spaces).parameters())
        report(f"{env}: {sum(p.numel() for p in weights):,} weights in {len(weights)} tensors; one step",
               {name: stepper(cfg, *spaces, maker) for name, maker in MAKERS.items()}, args.seconds)
        report(f"{env}: the learner's gradient step ({args.precision})",
               {name: learner_step(cfg, *spaces, MAKERS[name], args.precision)
                for name in (DEFAULT, "fastrl FusedAdam")}, args.seconds)
    print(f"first step in a fresh process with torch imported, median of {args.launches}:")
    for name, maker in MAKERS.items():
        code = FIRST_STEP.format(maker=maker)
        seconds = [float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                        text=True).stdout) for _ in range(args.launches)]
        print(f"  {name:<30} {statistics.median(seconds):6.3f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
