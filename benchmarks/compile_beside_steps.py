"""What the learner's background compile costs the eager steps it runs beside.

    python benchmarks/compile_beside_steps.py [--env doom_battle] [--rounds 3]

`--compile_learner` compiles a replica of the model in a process of its own
while the learner goes on training eagerly (fastrl/learning/compiled.py). This
drives the learner's own CompiledEvaluate with its real gradient steps on one
thread, on the env's model and a minibatch of the trainer's shape, with nothing
else running beside it but the compile, and reports:
- the median eager step before the compile starts, and during it;
- the seconds the background compile took.
Each round runs in a fresh process, so that no run finds another's compiled code
in memory; one untimed run first fills inductor's on-disk cache, so every timed
one compiles as a machine's later runs do. In a run the rollout workers take
their share of the cores beside both.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cartpole_time_to_score import cpu_model  # noqa: E402  the same machine line in every benchmark


def one_run(env: str, max_seconds: float) -> dict:
    """In this process: eager steps, then the compile beside them, until it is done."""
    import torch
    from fastrl.envs.registry import get_spec

    from fastrl.algo.model import Precision
    from fastrl.config import parse_args
    from fastrl.learning.compiled import CompiledEvaluate
    from fastrl.presets import preset_for_spaces
    from fastrl.tuning.profiling import ModelBench

    torch.set_num_threads(1)
    cfg, _ = parse_args(["--env", env])
    obs_space, action_space = get_spec(cfg.env).spaces()
    cfg = dataclasses.replace(cfg, **preset_for_spaces(cfg.env, obs_space, action_space))
    bench = ModelBench(cfg, obs_space, action_space, [32], Precision("fp32", "fp32", ""))
    # "on": compile whatever the model, no timing of eager against compiled after it.
    ce = CompiledEvaluate(bench.learner, "on", cfg.exploration_loss == "symmetric_kl", auto_compiles=False)

    def step() -> float:
        t0 = time.perf_counter()
        bench.train()
        return time.perf_counter() - t0

    step(), step()  # untimed: the first steps allocate what the later ones reuse
    before = [step() for _ in range(5)]  # a Doom step: a second; a vector model's: ms, so 2 s of them
    while sum(before) < 2.0:
        before.append(step())
    during = []
    start = time.perf_counter()
    while time.perf_counter() - start < max_seconds:
        ce.before_step(bench.minibatch)  # the first takes the inputs; once the compile is done, it switches
        if ce.state not in ("armed", "warming"):
            break
        warming = ce.state == "warming"
        seconds = step()
        if warming:
            during.append(seconds)
        ce.after_step(seconds)  # after the first step: starts the compile
    return {"eager_alone_s": statistics.median(before),
            "eager_beside_compile_s": statistics.median(during) if during else None,
            # The compile's own account: the run stops before the report a learner would get.
            "steps_beside_compile": len(during), "compile_s": ce._warm_s, "error": ce._warm_error}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max_seconds", type=float, default=240.0, help="one run's limit")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one run
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_run(args.env, args.max_seconds)))
        return 0

    def child() -> dict:
        out = subprocess.run([sys.executable, __file__, "--env", args.env, "--one",
                              "--max_seconds", str(args.max_seconds)], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"compile_beside_steps.py: a run failed:\n{out.stderr[-3000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])

    print(f"compile_beside_steps: {args.env}, {cpu_model()}, {os.cpu_count()} cores; one thread for the steps")
    child()  # untimed: fills inductor's on-disk cache
    runs = []
    for r in range(args.rounds):
        res = child()
        runs.append(res)
        beside = res["eager_beside_compile_s"]
        print(f"round {r}: eager step alone {res['eager_alone_s'] * 1e3:,.0f} ms, "
              f"beside the compile {beside * 1e3 if beside else float('nan'):,.0f} ms "
              f"({res['steps_beside_compile']} steps), compile {res['compile_s']:.1f} s"
              + (f", failed: {res['error']}" if res["error"] else ""), flush=True)
    ratio = statistics.median(r["eager_beside_compile_s"] / r["eager_alone_s"] for r in runs
                              if r["eager_beside_compile_s"])
    print(f"a step beside the compile {ratio:.2f}x its time alone, "
          f"compile {statistics.median(r['compile_s'] for r in runs):.1f} s (median of {len(runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
