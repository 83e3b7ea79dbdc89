"""How fast a ViZDoom engine's memory creeps up, and what replacing it costs: the two
numbers behind `--doom_engine_recycle_episodes`.

    python benchmarks/experiments/doom_engine_memory.py --env doom_basic --minutes 10
    python benchmarks/experiments/doom_engine_memory.py --env doom_battle --minutes 10 --recycle 200

One env in this process steps random actions for --minutes; every --sample_seconds
the engine process's USS (memory only it holds) is read with the episodes and frames
so far. Growth is the least-squares slope of USS after the warm-up (the first
--warmup_fraction of the samples), per 1,000 episodes, per million frames and per
hour of this process's full-speed stepping (a trainer steps each env far slower). With
--recycle N the env replaces its engine every N episodes, so the line should be flat
(the USS read is then the current engine's).

Then the cost of a replacement: --restarts resets of an env that recycles on every
episode, against as many of one that never does, alternating; the median difference
is the seconds one recycle adds. With the mean episode's seconds, it gives the
smallest N whose recycling costs at most --max_overhead of stepping time.

Random actions are not a trained agent (episodes end differently), so the episode
length and the growth per episode here are this policy's; the growth per frame and
the restart cost are the engine's (measured: 1.6-1.9 MB per million frames on both
doom_basic and doom_battle, whose growth per episode differs fivefold). Stepping
time here is the bare engine's: in a trainer each frame also pays
for the model and the learner, so the same N costs the trainer a smaller share.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np
import psutil

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

MB = 1024 * 1024


def engine_uss_mb(env) -> float:
    return psutil.Process(env.engine_pid).memory_full_info().uss / MB


def slope(xs: list, ys: list) -> float:
    """Least-squares slope of ys on xs; 0 for fewer than two distinct xs."""
    if len(set(xs)) < 2:
        return 0.0
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])


def step_for(env, seconds: float, sample_seconds: float) -> dict:
    """Random actions for `seconds`; samples of (elapsed s, episodes, frames, engine USS MB)."""
    env.action_space.seed(0)
    env.reset(seed=0)
    start = time.perf_counter()
    samples, episodes, frames, next_sample = [], 0, 0, 0.0
    while True:
        now = time.perf_counter() - start
        if now >= next_sample:
            samples.append((now, episodes, frames, engine_uss_mb(env)))
            next_sample += sample_seconds
            if now >= seconds:
                break
        _, _, terminated, truncated, _ = env.step(env.action_space.sample())
        frames += env.frameskip
        if terminated or truncated:
            episodes += 1
            env.reset()
    return {"samples": samples, "episodes": episodes, "frames": frames, "seconds": samples[-1][0]}


def recycle_cost(make, rounds: int) -> tuple:
    """Median seconds of reset() on an env that replaces its engine every episode,
    and on one that never does, alternating round by round."""
    recycling, keeping = make(1), make(0)
    times = {"recycling": [], "keeping": []}
    try:
        for env in (recycling, keeping):
            env.reset(seed=0)  # the first reset starts nothing new on either
        for _ in range(rounds):
            for name, env in (("recycling", recycling), ("keeping", keeping)):
                t = time.perf_counter()
                env.reset()
                times[name].append(time.perf_counter() - t)
        assert recycling.engine_recycles == rounds and keeping.engine_recycles == 0
    finally:
        recycling.close()
        keeping.close()
    return statistics.median(times["recycling"]), statistics.median(times["keeping"])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="doom_basic", help="a fastrl doom_* name")
    p.add_argument("--minutes", type=float, default=10.0, help="stepping time for the growth line")
    p.add_argument("--sample_seconds", type=float, default=10.0, help="seconds between USS reads")
    p.add_argument("--warmup_fraction", type=float, default=0.2, help="share of the samples left out of the slope")
    p.add_argument("--recycle", type=int, default=0, help="doom_engine_recycle_episodes for the growth line (0: never)")
    p.add_argument("--restarts", type=int, default=10, help="resets timed on each side for the recycle cost")
    p.add_argument("--max_overhead", type=float, default=0.01,
                   help="share of stepping time recycling may cost, for the smallest N printed")
    args = p.parse_args(argv)

    from fastrl.envs.registry import get_spec

    from fastrl.tuning.profiling import cpu_model

    spec = get_spec(args.env)

    def make(recycle: int):
        return spec.make(seed=0, doom_engine_recycle_episodes=recycle)

    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_model()}, {os.cpu_count()} logical CPUs; "
          f"{args.env}, random actions, {args.minutes:g} min, "
          f"{f'recycling every {args.recycle} episodes' if args.recycle else 'never recycling'}",
          flush=True)
    env = make(args.recycle)
    try:
        run = step_for(env, args.minutes * 60.0, args.sample_seconds)
        recycles = env.engine_recycles
    finally:
        env.close()
    samples = run["samples"]
    kept = samples[int(len(samples) * args.warmup_fraction):]
    t, eps, frames, uss = zip(*kept)
    per_episode = slope(list(eps), list(uss))
    per_mframe = slope(list(frames), list(uss)) * 1e6
    per_hour = slope(list(t), list(uss)) * 3600.0
    episode_s = run["seconds"] / max(run["episodes"], 1)
    print(f"  stepped      {run['episodes']:,} episodes, {run['frames']:,} frames in {run['seconds']:.0f} s "
          f"({episode_s * 1000:.0f} ms an episode, {run['frames'] / run['seconds']:,.0f} frames/s); "
          f"{recycles} engines recycled")
    print(f"  engine USS   {samples[0][3]:.1f} MB at start, {kept[0][3]:.1f} after warm-up, "
          f"{samples[-1][3]:.1f} at the end")
    print(f"  growth       {per_episode * 1000:+.2f} MB per 1,000 episodes, {per_mframe:+.2f} MB per million frames, "
          f"{per_hour:+.1f} MB per hour of stepping at full speed "
          f"(slope after the first {args.warmup_fraction:.0%} of {len(samples)} samples)")

    with_recycle, without = recycle_cost(make, args.restarts)
    cost = max(with_recycle - without, 0.0)
    smallest = math.ceil(cost / (args.max_overhead * episode_s)) if episode_s > 0 else 0
    print(f"  recycle cost {cost * 1000:.0f} ms (reset {with_recycle * 1000:.0f} ms with a new engine, "
          f"{without * 1000:.0f} ms without; medians of {args.restarts})")
    print(f"  smallest N   {smallest:,} episodes keeps recycling under {args.max_overhead:.0%} of stepping time; "
          f"the engine grows {per_episode * smallest:+.2f} MB in that many")
    return 0


if __name__ == "__main__":
    sys.exit(main())
