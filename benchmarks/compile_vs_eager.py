"""Does torch.compile (inductor) make the model cheaper on this CPU?

    python benchmarks/compile_vs_eager.py [--env doom_battle] [--parts conv evaluate] [--seconds 20]

For each precision (fp32, bf16) and each part compiled, builds the env's model
twice from the same seed, once eager and once with that part wrapped in
torch.compile, and times both in interleaved rounds (one call of each per
round, so a busy second slows both alike): the learner's gradient step on a
minibatch of the trainer's shape, and an actor's forward on --forward_batch
samples, on one thread as the trainer runs them. Prints the median of each, the
compiled/eager ratio (below 1: compiled is faster) and the seconds the first
compiled calls took (paid at every launch without a warm inductor cache).

Parts: `conv` the image encoder's conv and FC stacks, `evaluate` the whole
re-run of the policy over a trajectory batch (encoder, unrolled GRU, heads) that
the loss differentiates, `loss` that and the loss on it (V-trace, the PPO terms:
what a vector model's step mostly is). `--env` takes any env, its presets applied as the trainer
applies them.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cartpole_time_to_score import cpu_model  # noqa: E402  the same machine line in every benchmark
from fastrl.envs.registry import get_spec  # noqa: E402

from fastrl.algo import model as model_module  # noqa: E402
from fastrl.algo.model import Precision  # noqa: E402
from fastrl.config import parse_args  # noqa: E402
from fastrl.learning.learner import _time_limits, gradient_step, trajectory_loss  # noqa: E402
from fastrl.presets import preset_for_spaces  # noqa: E402
from fastrl.tuning.profiling import ModelBench, time_interleaved  # noqa: E402


def compile_part(model, part: str) -> None:
    """Wrap one part of `model` in torch.compile, in place (loss: see calls_for)."""
    if part == "conv":
        for encoder in model.encoders:
            if isinstance(encoder, model_module.ConvEncoder):
                encoder.conv, encoder.fc = torch.compile(encoder.conv), torch.compile(encoder.fc)
    elif part == "evaluate":
        model.evaluate = torch.compile(model.evaluate)
    elif part != "loss":
        raise SystemExit(f"compile_vs_eager.py: unknown part {part!r}; choose conv, evaluate or loss.")


def calls_for(cfg, obs_space, action_space, precision: str, part: str | None, forward_batch: int) -> dict:
    """{"train": one gradient step, "forward": one actor forward}, eager or with `part` compiled."""
    bench = ModelBench(cfg, obs_space, action_space, [forward_batch], Precision(precision, precision, ""))
    if part is not None:
        compile_part(bench.learner, part)
        compile_part(bench.actor, part)
    calls = {"train": bench.train, "forward": bench.forward_call(forward_batch)}
    if part == "loss":
        # The time limits run eagerly between the loss's two graphs: compiled, their
        # data-dependent indexing would recompile for every count of cut episodes.
        loss = torch.compile(functools.partial(trajectory_loss, time_limits=torch.compiler.disable(_time_limits)))
        mb = bench.minibatch
        calls["train"] = lambda: gradient_step(cfg, bench.learner, bench.optimizer, mb, mb["valid"], loss=loss,
                                               stats=False)  # as the eager side, ModelBench.train, steps
    return calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--parts", nargs="+", default=["conv", "evaluate"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--forward_batch", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0, help="timed seconds per part and precision")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    cfg, _ = parse_args(["--env", args.env])
    obs_space, action_space = get_spec(cfg.env).spaces()
    cfg = dataclasses.replace(cfg, **preset_for_spaces(cfg.env, obs_space, action_space))
    print(f"compile_vs_eager: {args.env}, {cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"1 thread; learner step on {cfg.batch_size} samples, actor forward on {args.forward_batch}", flush=True)
    for precision in args.precisions:
        eager = calls_for(cfg, obs_space, action_space, precision, None, args.forward_batch)
        for part in args.parts:
            compiled = calls_for(cfg, obs_space, action_space, precision, part, args.forward_batch)
            t0 = time.perf_counter()
            compiled["train"](), compiled["forward"]()
            first = time.perf_counter() - t0
            both = {(side, name): (1, fn) for side, calls in (("eager", eager), ("compiled", compiled))
                    for name, fn in calls.items()}
            timed = time_interleaved(both, args.seconds).per_call
            ratio = {name: timed[("compiled", name)] / timed[("eager", name)] for name in ("train", "forward")}
            print(f"{precision:>4} {part:>8}: learner step eager {timed[('eager', 'train')] * 1e3:7.1f} ms, "
                  f"compiled {timed[('compiled', 'train')] * 1e3:7.1f} ms ({ratio['train']:.2f}x); "
                  f"forward eager {timed[('eager', 'forward')] * 1e3:5.2f} ms, "
                  f"compiled {timed[('compiled', 'forward')] * 1e3:5.2f} ms ({ratio['forward']:.2f}x); "
                  f"first compiled calls {first:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
