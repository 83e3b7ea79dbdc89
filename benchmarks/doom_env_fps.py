"""Raw Doom env throughput: N processes step an env with random actions, no model.

    python benchmarks/doom_env_fps.py                      # 2 processes, doom_battle, 20 s
    python benchmarks/doom_env_fps.py --procs 4 --seconds 60 --env doom_deathmatch

Prints env frames per second summed over the processes, where env frames =
agent steps x frameskip (4 for Doom), the unit the trainer reports. Each process
measures the same wall-clock window after a common start, so startup is not counted.
Episode ends reset the env (not counted as steps). The rate goes to
benchmarks/results/doom_env_fps_<env>_<procs>procs.jsonl.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import sys
import time

import records

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker(env_name: str, seconds: float, seed: int, barrier, results) -> None:
    import numpy as np
    from fastrl.envs.registry import get_spec

    spec = get_spec(env_name)
    env = spec.make(seed=seed)
    env.reset()
    nvec = env.action_space.nvec
    rng = np.random.default_rng(seed)
    actions = rng.integers(0, nvec, size=(4096, len(nvec)))  # drawn up front: time the env only
    barrier.wait()
    steps, episodes = 0, 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for a in actions[steps % len(actions):][:64]:
            _, _, terminated, truncated, _ = env.step(a)
            steps += 1
            if terminated or truncated:
                env.reset()
                episodes += 1
    elapsed = time.perf_counter() - start
    env.close()
    results.put((steps, episodes, elapsed, spec.frameskip))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args(argv)

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(args.procs), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(args.env, args.seconds, 1000 + i, barrier, results))
             for i in range(args.procs)]
    for p in procs:
        p.start()
    rows = [results.get(timeout=args.seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    steps = sum(r[0] for r in rows)
    episodes = sum(r[1] for r in rows)
    elapsed = max(r[2] for r in rows)
    frameskip = rows[0][3]
    print(f"env {args.env}, {args.procs} processes x {args.seconds:g} s, random actions, no model")
    print(f"machine: {records.cpu_model()}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}")
    print(f"agent steps/s: {steps / elapsed:,.0f}   episodes: {episodes}")
    print(f"env frames/s:  {steps * frameskip / elapsed:,.0f}   (frames = agent steps x frameskip {frameskip})")
    records.append(f"doom_env_fps_{args.env}_{args.procs}procs",
                   {"env_frames_per_s": round(steps * frameskip / elapsed), "seconds": args.seconds},
                   records.this_command())
    return 0


if __name__ == "__main__":
    sys.exit(main())
