"""What a ViZDoom step costs the CPU, by where its engine runs and how many engines
take turns on a core.

    python benchmarks/engine_handoff.py [--env doom_battle] [--envs 1 16 32] [--steps 3000] [--rounds 2]

One process steps N envs round-robin with random actions, as a rollout worker does
between two forwards. Each step is ViZDoom's hand-off to the env's engine process
and back, once per tic. Two placements, alternating within each round, each in a
fresh process (an engine keeps the cores of the thread that started it):
- same core: the stepping process and its engines on one core, as `--pin_workers`
  places a rollout worker; every hand-off is a switch on that core;
- free: left to the scheduler, which wakes an engine on whichever core is idle,
  an interrupt that on a VM goes through the hypervisor.
Prints, per agent step and median over the rounds: wall time, the engines' CPU and
the stepping process's (user + system). No model and no shared memory: the env side
of a step only. On a quiet machine, since a busy core changes where engines wake.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import sys
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cartpole_time_to_score import cpu_model  # noqa: E402  the same machine line in every benchmark

PLACEMENTS = ("same core", "free")


def _engines(me: psutil.Process) -> list:
    """This process's ViZDoom engines (its env reapers are children too)."""
    from fastrl.envs.doom.engine_files import ENGINE  # the name the engines run under

    return [p for p in me.children(recursive=True) if os.path.basename((p.cmdline() or [""])[0]) == ENGINE]


def _cpu(proc: psutil.Process) -> tuple:
    t = proc.cpu_times()
    return t.user, t.system


def measure(env_name: str, envs: int, steps: int, same_core: bool, results) -> None:
    """In a fresh process: make `envs` envs (pinned first where `same_core`), step them
    round-robin, and put (wall, engines' CPU, own user, own system), seconds per step."""
    if same_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from fastrl.envs.registry import get_spec

    spec = get_spec(env_name)
    # No engine replaced after its 20th episode: the window sums the CPU of the engine
    # processes alive at its start, and a replaced one would take its share with it.
    games = [spec.make(doom_engine_recycle_episodes=0) for _ in range(envs)]
    for i, game in enumerate(games):
        game.reset(seed=i)

    def step_all(rounds: int) -> None:
        for _ in range(rounds):
            for game in games:
                _, _, terminated, truncated, _ = game.step(game.action_space.sample())
                if terminated or truncated:
                    game.reset()

    try:
        step_all(max(1, 200 // envs))  # the engines' first steps load their caches
        me = psutil.Process()
        engines = _engines(me)
        if len(engines) != envs:
            raise SystemExit(f"engine_handoff.py: found {len(engines)} ViZDoom engine processes for {envs} envs; "
                             f"is {env_name} a single-player Doom env?")
        rounds = max(1, steps // envs)
        engines0, own0, start = [_cpu(p) for p in engines], _cpu(me), time.perf_counter()
        step_all(rounds)
        wall, own1 = time.perf_counter() - start, _cpu(me)
        try:
            engines1 = [_cpu(p) for p in engines]
        except psutil.NoSuchProcess:
            raise SystemExit(f"engine_handoff.py: an engine exited during the {envs}-env window (a crash the env "
                             "recovered from); run it again.") from None
        n = rounds * envs
        engine_s = sum(sum(b) - sum(a) for a, b in zip(engines0, engines1))
        results.put((wall / n, engine_s / n, (own1[0] - own0[0]) / n, (own1[1] - own0[1]) / n))
    finally:
        for game in games:
            game.close()


def _result(child, results, what: str) -> tuple:
    """The measuring process's result, or a clear exit when it died without one."""
    while True:
        try:
            found = results.get(timeout=1.0)
            child.join()
            return found
        except queue.Empty:
            if not child.is_alive():
                raise SystemExit(f"engine_handoff.py: the measurement of {what} ended (exit code {child.exitcode}) "
                                 "without a result; its error is printed above.") from None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_battle")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 16, 32], help="envs one process steps in turn")
    parser.add_argument("--steps", type=int, default=3000, help="agent steps timed per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every placement and count; medians reported")
    args = parser.parse_args()
    if min(args.envs) < 1 or args.steps < 1 or args.rounds < 1:
        parser.error("--envs, --steps and --rounds take counts of 1 or more")
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("engine_handoff.py: this process may use one core only, so both placements are the same; "
                         "run it where two or more cores are allowed (check taskset).")
    print(f"machine: {cpu_model()}, {psutil.cpu_count()} logical cores; env {args.env}, "
          f"{args.steps} steps a measurement, {args.rounds} round(s), medians", flush=True)
    ctx = mp.get_context("spawn")
    timed = {(p, n): [] for p in PLACEMENTS for n in args.envs}
    for _ in range(args.rounds):
        for n in args.envs:
            for placement in PLACEMENTS:
                results = ctx.Queue()
                child = ctx.Process(target=measure, args=(args.env, n, args.steps, placement == "same core", results))
                child.start()
                timed[(placement, n)].append(_result(child, results, f"{n} envs, {placement}"))
    print("us per agent step:")
    for (placement, n), rows in timed.items():
        wall, engines, user, system = (statistics.median(r[i] for r in rows) * 1e6 for i in range(4))
        print(f"  {placement:<9} {n:>3} envs: wall {wall:4.0f}, CPU {engines + user + system:4.0f} = engines "
              f"{engines:4.0f} + stepper {user + system:3.0f} (user {user:.0f}, system {system:.0f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
