"""What the per-pixel z-score costs: the model's RunningNorm against the textbook
expressions it replaced, and against its own statistics stored [C, H, W], inside
the learner's step, the learner's update of the statistics and an actor's forward.

    python benchmarks/pixel_norm_layout.py [--env doom_battle] [--rounds 6] [--compiled]

The textbook `((x.float() - mean) * rsqrt(var + eps)).clamp(...)` gives the same
numbers (tests/test_model.py checks every bit), but against channels-last frames
its [C, H, W] statistics make the innermost loop stride across memory, and it
makes four full-size tensors; the update's moments likewise. The model lays the
statistics out as the frames are when it computes; `stats [C,H,W]` is the model
with its statistics stored [C, H, W] (as before they were stored channels-last),
which costs an eager forward a copy of them and a compiled one a transposing
kernel. For each precision the script times, in interleaved rounds on one thread,
the learner's gradient step on a minibatch of the trainer's shape, its update of
the statistics from that minibatch, and an actor's forward on --forward_batch
samples, with each version, and prints the medians and the ratios to the model.
With --compiled the learner's evaluate and the actor's act run under torch.compile,
as a run's compiled learner and workers do, and the textbook version is left out
(it would only time inductor's fusion of the same arithmetic).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cartpole_time_to_score import cpu_model  # noqa: E402  the same machine line in every benchmark
from fastrl.envs.registry import get_spec  # noqa: E402

from fastrl.algo import model as model_module  # noqa: E402
from fastrl.algo.model import Precision  # noqa: E402
from fastrl.config import parse_args  # noqa: E402
from fastrl.plumbing.caching_allocator import learner_memory  # noqa: E402
from fastrl.tuning.profiling import ModelBench  # noqa: E402

MODEL = {"forward": model_module.RunningNorm.forward, "update": model_module.RunningNorm.update}


def textbook_zscore(self, x: torch.Tensor) -> torch.Tensor:
    z = (x.float() - self.mean) * torch.rsqrt(self.var + model_module.NORM_EPS)
    return z.clamp(-model_module.NORM_CLIP, model_module.NORM_CLIP)


def textbook_moments(self, x: torch.Tensor, reduce=None) -> None:
    """RunningNorm.update with the batch's moments taken as they were before the
    statistics followed the frames' layout."""
    x = x.reshape(-1, *self.mean.shape).double()
    d = x - self.mean.double()
    moments = torch.cat([d.new_full((1,), x.shape[0]), d.sum(dim=0).reshape(-1), d.square().sum(dim=0).reshape(-1)])
    n = float(moments[0])
    d_sum, d_sq = moments[1:].view(2, *self.mean.shape).unbind(0)
    batch_mean = self.mean.double() + d_sum / n
    batch_var = (d_sq / n - (d_sum / n).square()).clamp(min=0.0)
    count = self.count.double()
    total = count + n
    delta = batch_mean - self.mean.double()
    m2 = self.var.double() * count + batch_var * n + delta.square() * (count * n / total)
    self.mean.copy_(self.mean.double() + delta * (n / total))
    self.var.copy_(m2 / total)
    self.count.copy_(total)


TEXTBOOK = {"forward": textbook_zscore, "update": textbook_moments}


def stats_stored_chw(bench) -> None:
    """The statistics of every image encoder of the bench stored [C, H, W]."""
    for model in (bench.learner, bench.actor):
        for encoder in model.encoders:
            norm = getattr(encoder, "norm", None)
            if norm is not None and norm.mean.dim() == 3:
                norm.mean, norm.var = norm.mean.contiguous(), norm.var.contiguous()


def time_versions(cfg, obs_space, action_space, precision: str, forward_batch: int, rounds: int,
                  compiled: bool) -> dict:
    """{(version, "step" | "forward" | "update"): median seconds}, the versions interleaved,
    each on a bench of its own built from the same seed."""
    versions = {"stats [C,H,W]": (MODEL, stats_stored_chw), "model": (MODEL, None)}
    if not compiled:
        versions = {"textbook": (TEXTBOOK, stats_stored_chw), **versions}
    benches = {}
    for version, (_, prepare) in versions.items():
        bench = ModelBench(cfg, obs_space, action_space, [forward_batch], Precision(precision, precision, ""))
        if prepare is not None:
            prepare(bench)
        if compiled:
            bench.learner.evaluate = torch.compile(bench.learner.evaluate)
            bench.actor.act = torch.compile(bench.actor.act)

        def update(bench=bench):
            obs = {k: v[:-1] for k, v in bench.minibatch["obs"].items()}
            bench.learner.update_normalizer(obs, keep=bench.minibatch["valid"].bool())

        benches[version] = (("step", bench.train), ("forward", bench.forward_call(forward_batch)), ("update", update))
    times: dict = {}
    try:
        for round_ in range(rounds + 1):  # round 0 warms up (and compiles), untimed
            for version, (methods, _) in versions.items():
                for name, method in methods.items():
                    setattr(model_module.RunningNorm, name, method)
                for what, fn in benches[version]:
                    start = time.perf_counter()
                    fn()
                    if round_:
                        times.setdefault((version, what), []).append(time.perf_counter() - start)
    finally:
        for name, method in MODEL.items():
            setattr(model_module.RunningNorm, name, method)
    return {key: statistics.median(values) for key, values in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--precisions", nargs="+", default=["bf16", "fp32"])
    parser.add_argument("--forward_batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--compiled", action="store_true",
                        help="Run the learner's evaluate and the actor's act under torch.compile.")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    cfg, _ = parse_args(["--env", args.env])
    if not cfg.normalize_obs:
        raise SystemExit(f"pixel_norm_layout.py: {args.env}'s model does not normalise its pixels "
                         "(--normalize_obs is off in its preset); pick a Doom env that does, such as doom_battle.")
    obs_space, action_space = get_spec(cfg.env).spaces()
    print(f"pixel_norm_layout: {args.env}, {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"1 thread, {'compiled' if args.compiled else 'eager'}; learner step on {cfg.batch_size} samples, "
          f"actor forward on {args.forward_batch}", flush=True)
    with learner_memory(cfg.learner_allocator):  # the learner's memory, as a run has it
        for precision in args.precisions:
            med = time_versions(cfg, obs_space, action_space, precision, args.forward_batch, args.rounds,
                                args.compiled)
            versions = sorted({version for version, _ in med}, key=lambda v: v == "model")
            for what, name in (("step", "learner step"), ("update", "statistics update"), ("forward", "forward")):
                new = med[("model", what)]
                cells = [f"{v} {med[(v, what)] * 1e3:6.2f} ms ({med[(v, what)] / new:.3f}x)" for v in versions]
                print(f"{precision:>4} {name}: " + "; ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
