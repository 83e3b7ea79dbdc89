"""How close the model's own kernels run to this core's matrix-multiply rate.

    python benchmarks/experiments/kernel_efficiency.py [--env doom_battle] [--forward_batch 32] [--rounds 5]
                                           [--precisions fp32 bf16]

For the model fastrl builds for --env (its conv stack, FC and GRU), this times on
one thread, channels-last as the model runs them, each layer's kernels at the
learner's minibatch (T+1 x B frames) and at an actor's forward (--forward_batch
rows): a conv's forward, the gradient of its input (not the first conv's: frames
take none) and of its weights; the FC's and the GRU's input projection the same way;
the GRU's hidden projection as the learner's unroll runs it (T+1 products of B rows
forward and as many back, its weight gradient in one product). Each line is the
median of --rounds calls, in GFLOP/s (2 x multiply-adds a second) and as a share of
the core's practical peak: a 2,048-square product in the same precision, timed the
same way. The learner's tensors come from the allocator a run's learner uses (a
fresh 100-MB tensor from the system costs its page faults, which a run never pays).

What it answers: how much a step could still gain from faster kernels. A kernel
near the peak has little left; the rows are the model's fixed work, so the
time columns sum to what one learner step and one actor forward cost in them.
An actor's kernels are timed back to back with their weights in the cache; in a
run an actor's forward follows its envs' steps, which have evicted them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, List, NamedTuple, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/, for records
from fastrl.envs.registry import get_spec  # noqa: E402
from records import cpu_model  # noqa: E402  the same machine line in every benchmark

from fastrl.algo.model import ConvEncoder, build_model  # noqa: E402
from fastrl.config import parse_args  # noqa: E402
from fastrl.plumbing.caching_allocator import learner_memory  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PEAK_SIZE = 2048


class Kernel(NamedTuple):
    name: str
    flops: float  # 2 x multiply-adds of one call
    call: Callable[[], object]


def median_seconds(call: Callable[[], object], rounds: int) -> float:
    call()  # the first call picks and caches oneDNN's kernel for these shapes
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def peak_rate(dtype: torch.dtype, rounds: int) -> float:
    """FLOP/s of a PEAK_SIZE-square product: what this core's GEMM reaches at its best."""
    a, b = (torch.randn(PEAK_SIZE, PEAK_SIZE, dtype=dtype) for _ in range(2))
    return 2 * PEAK_SIZE ** 3 / median_seconds(lambda: a.mm(b), rounds)


def conv_kernels(conv: nn.Conv2d, frames: int, in_hw, first: bool, learner: bool, dtype: torch.dtype,
                 tag: str) -> Tuple[List[Kernel], Tuple[int, ...]]:
    """The forward of one conv at `frames`, and for the learner its input gradient
    (unless first) and weight gradient; and the output's height and width, the next
    conv's input."""
    cl = torch.channels_last
    x = torch.randn(frames, conv.in_channels, *in_hw, dtype=dtype).contiguous(memory_format=cl)
    w = conv.weight.detach().to(dtype).contiguous(memory_format=cl)
    y = F.conv2d(x, w, stride=conv.stride)
    g = torch.randn_like(y)
    macs = y.numel() * conv.in_channels * conv.kernel_size[0] * conv.kernel_size[1]
    args = (conv.stride, conv.padding, conv.dilation, False, (0, 0), 1)
    kernels = [Kernel(f"{tag} forward", 2 * macs, lambda: F.conv2d(x, w, stride=conv.stride))]
    if not learner:
        return kernels, tuple(y.shape[2:])
    if not first:
        kernels.append(Kernel(f"{tag} input grad", 2 * macs, lambda: torch.ops.aten.convolution_backward(
            g, x, w, None, *args, (True, False, False))))
    kernels.append(Kernel(f"{tag} weight grad", 2 * macs, lambda: torch.ops.aten.convolution_backward(
        g, x, w, None, *args, (False, True, False))))
    return kernels, tuple(y.shape[2:])


def linear_kernels(weight: torch.Tensor, rows: int, learner: bool, dtype: torch.dtype, tag: str) -> List[Kernel]:
    """x W^T at `rows`, and for the learner its input and weight gradients."""
    out_f, in_f = weight.shape
    w = weight.detach().to(dtype).contiguous()
    x = torch.randn(rows, in_f, dtype=dtype)
    g = torch.randn(rows, out_f, dtype=dtype)
    flops = 2 * rows * in_f * out_f
    kernels = [Kernel(f"{tag} forward", flops, lambda: F.linear(x, w))]
    if learner:
        kernels += [Kernel(f"{tag} input grad", flops, lambda: g.mm(w)),
                    Kernel(f"{tag} weight grad", flops, lambda: g.t().mm(x))]
    return kernels


def model_kernels(model, frames: int, steps: int, learner: bool, dtype: torch.dtype, tag: str) -> List[Kernel]:
    encoder = next(m for m in model.encoders if isinstance(m, ConvEncoder))
    convs = [m for m in encoder.conv if isinstance(m, nn.Conv2d)]
    hw = tuple(model.layout[model.obs_keys[0]][0][1:])
    kernels = []
    for i, conv in enumerate(convs):
        layer, hw = conv_kernels(conv, frames, hw, i == 0, learner, dtype, f"{tag} conv{i + 1}")
        kernels += layer
    kernels += linear_kernels(encoder.fc[0].weight, frames, learner, dtype, f"{tag} fc")
    if model.core is not None:
        kernels += linear_kernels(model.core.weight_ih, frames, learner, dtype, f"{tag} gru input")
        kernels += gru_hidden_kernels(model.core.weight_hh, frames, steps, learner, dtype, f"{tag} gru hidden")
    return kernels


def gru_hidden_kernels(weight_hh: torch.Tensor, frames: int, steps: int, learner: bool, dtype: torch.dtype,
                       tag: str) -> List[Kernel]:
    """The hidden projection as fastrl runs it: an actor's one product at its rows
    (gru_step); the learner's unroll (fastrl/algo/gru_sequence.py) one product of B
    rows a step against a contiguous W_hh^T, one a step back for the state's
    gradient, and W_hh's gradient in one product over all the steps' rows."""
    w = weight_hh.detach().to(dtype).contiguous()
    three_h, hidden = w.shape
    if not learner:
        h = torch.randn(frames, hidden, dtype=dtype)
        return [Kernel(f"{tag} forward", 2 * frames * w.numel(), lambda: F.linear(h, w))]
    rows = frames // steps
    w_t = w.t().contiguous()
    h = torch.randn(rows, hidden, dtype=dtype)
    d_gh = torch.randn(rows, three_h, dtype=dtype)
    all_h = torch.randn(frames, hidden, dtype=dtype)
    all_d_gh = torch.randn(frames, three_h, dtype=dtype)
    flops = 2 * frames * w.numel()
    return [Kernel(f"{tag} forward x{steps}", flops, lambda: [h.mm(w_t) for _ in range(steps)]),
            Kernel(f"{tag} state grad x{steps}", flops, lambda: [d_gh.mm(w) for _ in range(steps)]),
            Kernel(f"{tag} weight grad", flops, lambda: all_d_gh.t().mm(all_h))]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--forward_batch", type=int, default=32, help="Rows of an actor's forward.")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precisions", nargs="+", default=["fp32"], choices=sorted(DTYPES))
    args = parser.parse_args(argv)
    if args.forward_batch < 1 or args.rounds < 1:
        raise SystemExit("kernel_efficiency.py: --forward_batch and --rounds take 1 or more.")

    torch.set_num_threads(1)
    cfg, _ = parse_args(["--env", args.env])
    obs_space, action_space = get_spec(cfg.env).spaces()
    model = build_model(cfg, obs_space, action_space)
    if not any(isinstance(m, ConvEncoder) for m in model.encoders):
        raise SystemExit(f"kernel_efficiency.py: {args.env}'s model has no conv encoder; pick an image env "
                         "such as doom_battle.")
    steps = cfg.rollout + 1
    frames = steps * (cfg.batch_size // cfg.rollout // cfg.num_minibatches)
    print(f"kernel_efficiency: {args.env}, {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"1 thread; learner minibatch {frames} frames ({steps} x {frames // steps}), actor "
          f"{args.forward_batch} rows; median of {args.rounds}", flush=True)
    with learner_memory(cfg.learner_allocator):
        for precision in args.precisions:
            dtype = DTYPES[precision]
            peak = peak_rate(dtype, args.rounds)
            print(f"{precision}: peak ({PEAK_SIZE}-square product) {peak / 1e9:6.1f} GFLOP/s", flush=True)
            for tag, rows, row_steps, learner in (("learner", frames, steps, True),
                                                  ("actor", args.forward_batch, 1, False)):
                total = 0.0
                for kernel in model_kernels(model, rows, row_steps, learner, dtype, tag):
                    seconds = median_seconds(kernel.call, args.rounds)
                    total += seconds
                    rate = kernel.flops / seconds
                    print(f"  {kernel.name:<34} {seconds * 1e3:8.2f} ms {rate / 1e9:7.1f} GFLOP/s "
                          f"{rate / peak:5.0%} of peak", flush=True)
                print(f"  {tag} kernels in all: {total * 1e3:.2f} ms, {total / rows * 1e6:.0f} us a "
                      f"{'frame' if learner else 'row'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
