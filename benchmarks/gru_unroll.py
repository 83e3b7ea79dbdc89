"""The learner's GRU unroll: gru_sequence (its backward by hand) against the
step-by-step unroll under autograd it replaced.

    python benchmarks/gru_unroll.py [--env doom_battle] [--seconds 20] [--compiled]

Times, interleaved on one thread, the learner's gradient step on a minibatch of
the trainer's shape with each unroll (two models from the same seed), and the
unroll alone, forward and backward, at that minibatch's T+1 steps x B rows. With
--compiled the learner's evaluate runs under torch.compile, as a run's compiled
learner does (gru_sequence is a custom op, which the compile calls whole).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cartpole_time_to_score import cpu_model  # noqa: E402  the same machine line in every benchmark
from fastrl.envs.registry import get_spec  # noqa: E402

from fastrl.algo import model as model_module  # noqa: E402
from fastrl.algo.gru_sequence import gru_sequence  # noqa: E402
from fastrl.algo.model import Precision, gru_step  # noqa: E402
from fastrl.config import parse_args  # noqa: E402
from fastrl.plumbing.caching_allocator import learner_memory  # noqa: E402
from fastrl.presets import preset_for_spaces  # noqa: E402
from fastrl.tuning.profiling import ModelBench, time_interleaved  # noqa: E402


def step_by_step(gi, h0, keep, w_hh, b_hh):
    """The unroll as evaluate ran it before gru_sequence: gru_step per step, autograd
    recording each step's hidden projection and so each step's weight gradient."""
    h, outputs, states = h0, [], []
    for t in range(gi.shape[0]):
        states.append(h)
        h = gru_step(gi[t], h * keep[t], w_hh, b_hh)
        outputs.append(h)
    return torch.stack(outputs), torch.stack(states)


UNROLLS = {"step by step": step_by_step, "gru_sequence": gru_sequence}


def with_unroll(fn, unroll):
    """fn with the model module's unroll swapped for `unroll` during the call (evaluate
    looks it up by name on every call)."""
    def call():
        model_module.gru_sequence = unroll
        try:
            fn()
        finally:
            model_module.gru_sequence = gru_sequence
    return call


def unroll_alone(unroll, steps: int, batch: int, hidden: int, compiled: bool):
    """One forward and backward of `unroll` over random inputs of the learner's shape."""
    gen = torch.Generator().manual_seed(0)
    gi = torch.randn(steps, batch, 3 * hidden, generator=gen, requires_grad=True)
    h0 = torch.randn(batch, hidden, generator=gen, requires_grad=True)
    keep = (torch.rand(steps, batch, 1, generator=gen) > 0.02).float()
    w_hh = (torch.randn(3 * hidden, hidden, generator=gen) * 0.05).requires_grad_()
    b_hh = torch.randn(3 * hidden, generator=gen, requires_grad=True)
    d_outputs = torch.randn(steps, batch, hidden, generator=gen)
    fn = torch.compile(unroll) if compiled else unroll

    def call():
        outputs, _ = fn(gi, h0, keep, w_hh, b_hh)
        torch.autograd.grad((outputs * d_outputs).sum(), (gi, h0, w_hh, b_hh))
    return call


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds for each pair compared")
    parser.add_argument("--compiled", action="store_true", help="Run the learner's evaluate under torch.compile.")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    cfg, _ = parse_args(["--env", args.env])
    obs_space, action_space = get_spec(cfg.env).spaces()
    cfg = dataclasses.replace(cfg, **preset_for_spaces(cfg.env, obs_space, action_space))
    if not cfg.use_rnn:
        raise SystemExit(f"gru_unroll.py: {args.env}'s model has no GRU (--use_rnn is off in its preset); "
                         "pick an env whose model has one, such as doom_battle.")
    mode = "compiled" if args.compiled else "eager"
    print(f"gru_unroll: {args.env}, {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread, "
          f"{mode}; learner step on {cfg.batch_size} samples", flush=True)
    with learner_memory(cfg.learner_allocator):  # the learner's memory, as a run has it
        calls = {}
        for name, unroll in UNROLLS.items():
            bench = ModelBench(cfg, obs_space, action_space, [1], Precision("fp32", "fp32", ""))
            if args.compiled:
                bench.learner.evaluate = torch.compile(bench.learner.evaluate)
            steps, batch = bench.minibatch["episode_start"].shape
            calls[(name, "learner step")] = (1, with_unroll(bench.train, unroll))
            calls[(name, "unroll alone")] = (1, unroll_alone(unroll, steps, batch, cfg.rnn_size, args.compiled))
        per_call = time_interleaved(calls, args.seconds).per_call  # its untimed first calls compile
    for what in ("learner step", "unroll alone"):
        old, new = per_call[("step by step", what)], per_call[("gru_sequence", what)]
        print(f"{what}: step by step {old * 1e3:6.1f} ms, gru_sequence {new * 1e3:6.1f} ms ({new / old:.3f}x); "
              f"{steps} steps x {batch} rows", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
