"""Scaling out with torchrun on one machine: 1 rank against 2 ranks on the same cores,
what a slow rank costs the others, and the gradient all-reduce's share of a Doom
learner step.

    python benchmarks/scale_out.py [--seeds 0 1 2] [--target 300] [--budget_seconds 120]
                                   [--slow_seconds 60] [--allreduce_rounds 10]
                                   [--train_options='--num_minibatches 2']
                                   [--skip_runs] [--skip_slow_rank] [--skip_allreduce]
    python benchmarks/scale_out.py --env doom_battle --seeds 0 --budget_seconds 150 --skip_slow_rank --skip_allreduce

Part 1 runs `torchrun --standalone --nproc_per_node N -m fastrl.train --env CartPole-v1`
as a user would, per seed, for: 1 rank (the whole machine); 2 ranks (each on half the
cores, each with the per-rank batch of 1 rank, so a gradient step averages twice the
samples); 2 ranks with half the batch each (the same samples per gradient step as 1
rank, and 16 envs per rollout worker, which that batch needs); and 2 independent
runs at once (plain `python -m fastrl.train`, no torchrun), each confined to the cores
a rank of two gets: what 2 ranks would make if keeping their weights identical cost
nothing. 2 ranks against that pair is the cost of the lockstep; the pair against 1
rank is the cost of splitting the machine in two pipelines. Each run stops at a
100-episode mean return of --target or after --budget_seconds. It reports env
frames/s and samples trained/s (rank 0's status lines, which sum every rank's
counters, averaged over the lines after training began) and the time from launch to
the target (summary.json's reached_reward_at_seconds), the median over the seeds,
and each variant's frames/s as a share of 1 rank's. --train_options adds fastrl.train
options to every run. With --env other than CartPole-v1 (the main job, doom_battle,
whose learner step is ~500x CartPole's), each run trains for
--budget_seconds with no target, and the half-batch variant is left out: its env
counts are CartPole's.

Part 2, a slow rank: 2 ranks train CartPole-v1 for --slow_seconds, once as they are
and once with a busy loop pinned to the last cpu, which is in rank 1's share: rank 1
then runs at about half speed. It reports env frames/s of both ranks together and
the share of rank 0's learner's wall time spent in collectives (summary.json's
learner_sync_seconds), waiting for rank 1 included: the learners step in lockstep,
so the run goes at the slower rank's pace.

Part 3 starts two local processes, each on its own core as two ranks on this
machine would be, joined by Gloo on loopback. Each builds the doom_battle model
(the Doom preset's options) and times, alternately for --allreduce_rounds rounds, a
learner gradient step on a minibatch of the preset's size without the all-reduce,
the same step with it (fastrl.learning.learner.gradient_step with Peers), the
all-reduce alone, and TINY_PER_ROUND all-reduces of 4 numbers (the floor under any
collective: a normaliser's moments, a batch's agreement). The all-reduce's share of
a step is (all-reduce alone) / (step with it). Both processes time at once, as two
ranks' learners would run.

It prints the machine first: run it when nothing else runs on the machine, or read
the numbers as those of a shared one. Parts 1 and 3's figures go to
benchmarks/results/scale_out_<env>.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

import psutil
import records

STATUS = re.compile(r"^\[\s*([\d.]+)s\] frames [\d,]+ \| ([\d,]+) fps .* trained ([\d,]+) samples/s")
BATCH = 1024  # CartPole's per-rank batch (the trainer's default)
PAIR = "2 independent runs"
TINY_PER_ROUND = 50  # part 3's all-reduces of 4 numbers after each round's steps


# --------------------------------------------------------------------------------------
# Part 1: 1 rank against 2 on the same machine

def _launch(ranks: int, seed: int, options: list, train_dir: str, experiment: str, env: str,
            cpus: Optional[List[int]] = None) -> subprocess.Popen:
    """Start one training run on `env`: under torchrun with `ranks` ranks, or, with `ranks`
    0, as a plain `python -m fastrl.train` confined to `cpus`."""
    train = ["-m", "fastrl.train", "--env", env, "--seed", str(seed), "--train_dir", train_dir,
             "--experiment", experiment, "--status_every_seconds", "2", *options]
    if ranks:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), *train]
    else:
        cmd = [sys.executable, *train]
    loopback = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}  # ranks on one machine talk over loopback
    confine = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    # Output to files, not pipes: a pair's second run must not block on a full pipe
    # while the first one's is read.
    with open(os.path.join(train_dir, f"{experiment}.out"), "w") as out, \
            open(os.path.join(train_dir, f"{experiment}.err"), "w") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, env=loopback, preexec_fn=confine)


def _result(proc: subprocess.Popen, train_dir: str, experiment: str) -> dict:
    """A launched run's steady rates and its time to a stop_at_reward, once it has ended."""
    proc.wait()
    with open(os.path.join(train_dir, f"{experiment}.out")) as out, \
            open(os.path.join(train_dir, f"{experiment}.err")) as err:
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:  # the run's own words say why; torchrun's summary alone does not
        tail = "\n".join((stdout + stderr).splitlines()[-40:])
        raise SystemExit(f"scale_out.py: {' '.join(proc.args[2:])} exited {proc.returncode}; its last lines:\n{tail}")
    lines = [m for m in map(STATUS.match, stdout.splitlines()) if m]
    training = [(float(m.group(2).replace(",", "")), float(m.group(3).replace(",", ""))) for m in lines
                if float(m.group(3).replace(",", "")) > 0][1:]  # the first window straddles the start of training
    with open(os.path.join(train_dir, experiment, "summary.json")) as fh:
        summary = json.load(fh)
    return {"fps": statistics.fmean(f for f, _ in training) if training else float("nan"),
            "samples_per_s": statistics.fmean(s for _, s in training) if training else float("nan"),
            "to_target_s": summary["reached_reward_at_seconds"] or float("inf"),
            "sync_s": (summary.get("ranks") or {}).get("learner_sync_seconds"),
            "wall_s": summary["wall_seconds"]}


def _run(ranks: int, seed: int, options: list, train_dir: str, experiment: str, env: str = "CartPole-v1") -> dict:
    """One torchrun launch on `env`: its steady rates and its time to a stop_at_reward in `options`."""
    return _result(_launch(ranks, seed, options, train_dir, experiment, env), train_dir, experiment)


def _run_pair(seed: int, options: list, train_dir: str, experiment: str, env: str) -> dict:
    """Two independent runs at once, each on the half of the cores a rank of two would
    get, joined by nothing: what 2 ranks would make if keeping their weights identical
    cost nothing. Their rates add up; the time to the target is the slower one's."""
    from fastrl.plumbing.ranks import rank_cpus

    halves = [rank_cpus(i, 2) for i in range(2)]
    procs = [_launch(0, seed + 1000 * i, options, train_dir, f"{experiment}_{i}", env, half)
             for i, half in enumerate(halves)]
    runs = [_result(p, train_dir, f"{experiment}_{i}") for i, p in enumerate(procs)]
    return {"fps": sum(r["fps"] for r in runs), "samples_per_s": sum(r["samples_per_s"] for r in runs),
            "to_target_s": max(r["to_target_s"] for r in runs), "sync_s": None,
            "wall_s": max(r["wall_s"] for r in runs)}


def scale_runs(args) -> dict:
    # Half the batch needs half the envs per rollout worker, as a buffer holds rollout x envs samples.
    cartpole = args.env == "CartPole-v1"
    variants = [("1 rank", 1, []), ("2 ranks", 2, []), (PAIR, 0, [])]
    if cartpole:
        half = ["--batch_size", str(BATCH // 2), "--num_envs_per_worker", "16"]
        variants.append(("2 ranks, half batch each", 2, half))
    results = {}
    with tempfile.TemporaryDirectory() as train_dir:
        for seed in args.seeds:
            for name, ranks, options in variants:  # interleaved, so that a slow spell hits every variant
                budget = ["--train_for_seconds", str(args.budget_seconds), *args.train_options.split()]
                if cartpole:
                    budget += ["--stop_at_reward", str(args.target)]
                experiment = f"r{ranks}_s{seed}_{len(options)}"
                if name == PAIR:
                    r = _run_pair(seed, [*budget, *options], train_dir, experiment, args.env)
                else:
                    r = _run(ranks, seed, [*budget, *options], train_dir, experiment, args.env)
                results.setdefault(name, []).append(r)
                sync = f", rank 0's learner in collectives {r['sync_s']:.1f} s" if r["sync_s"] is not None else ""
                target = f"{r['to_target_s']:.1f} s to {args.target:g} " if cartpole else ""
                print(f"seed {seed}, {name}: {r['fps']:,.0f} env frames/s, {r['samples_per_s']:,.0f} samples/s, "
                      f"{target}(run {r['wall_s']:.0f} s{sync})", flush=True)
    median = {name: statistics.median(r["fps"] for r in runs) for name, runs in results.items()}
    for name, runs in results.items():
        target = f"{statistics.median(r['to_target_s'] for r in runs):.1f} s to {args.target:g} " if cartpole else ""
        print(f"{name} ({args.env}): median {median[name]:,.0f} env frames/s ({median[name] / median['1 rank']:.2f}x "
              f"1 rank), {statistics.median(r['samples_per_s'] for r in runs):,.0f} samples/s, {target}"
              f"over seeds {args.seeds}")
    # The pair splits the cores as the ranks do but never meets: 2 ranks against it is
    # what keeping the weights identical costs; the pair against 1 rank is what halving
    # the cores costs, which no scheme of two pipelines avoids.
    print(f"keeping 2 ranks' weights identical costs: 2 ranks = {median['2 ranks'] / median[PAIR]:.2f}x "
          f"{PAIR}; splitting the cores costs: {PAIR} = {median[PAIR] / median['1 rank']:.2f}x 1 rank")
    return {"one_rank_fps": round(median["1 rank"]), "two_ranks_fps": round(median["2 ranks"]),
            "two_ranks_over_one": round(median["2 ranks"] / median["1 rank"], 2),
            "pair_over_one": round(median[PAIR] / median["1 rank"], 2),
            "two_ranks_over_pair": round(median["2 ranks"] / median[PAIR], 2)}


# --------------------------------------------------------------------------------------
# Part 2: a slow rank holds every rank back

def slow_rank(args) -> None:
    last_cpu = sorted(os.sched_getaffinity(0))[-1]
    with tempfile.TemporaryDirectory() as train_dir:
        for hogged in (False, True):
            hog = None
            if hogged:  # a busy loop on rank 1's core: rank 1 gets about half of it
                hog = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                       preexec_fn=lambda: os.sched_setaffinity(0, {last_cpu}))
            try:
                r = _run(2, 0, ["--train_for_seconds", str(args.slow_seconds)], train_dir, f"hog{int(hogged)}")
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
            share = r["sync_s"] / r["wall_s"]
            print(f"2 ranks{', a busy loop on cpu ' + str(last_cpu) + ' (rank 1)' if hogged else ''}: "
                  f"{r['fps']:,.0f} env frames/s, {r['samples_per_s']:,.0f} samples/s; rank 0's learner spent "
                  f"{r['sync_s']:.1f} s of {r['wall_s']:.0f} s ({share:.0%}) in collectives", flush=True)


# --------------------------------------------------------------------------------------
# Part 3: the all-reduce's share of a Doom learner step

def _allreduce_rank(rank: int, port: int, rounds: int, obs_space, action_space, result) -> None:
    import torch

    from fastrl.algo.model import build_model
    from fastrl.config import parse_args
    from fastrl.learning.learner import gradient_step
    from fastrl.plumbing.collectives import Peers
    from fastrl.plumbing.ranks import Rank, claim_cores
    from fastrl.plumbing.stats_board import StatsBoard
    from fastrl.tuning.precision import resolve_precision
    from fastrl.tuning.profiling import _fake_minibatch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    me = Rank(rank=rank, world_size=2, local_rank=rank, local_world_size=2)
    claim_cores(me)
    torch.set_num_threads(1)
    cfg, _ = parse_args(["--env", "doom_battle"])
    precision = resolve_precision(cfg, obs_space, action_space)
    torch.manual_seed(0)
    model = build_model(cfg, obs_space, action_space, precision.learning).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
    mb = _fake_minibatch(cfg, model, obs_space, torch.Generator().manual_seed(rank))
    peers = Peers(me, "gloo", 120.0, torch.device("cpu"), StatsBoard(["learner"]).row("learner"))
    params = [p for p in model.parameters()]
    times = {"step": [], "step_allreduce": [], "allreduce": [], "tiny": []}
    tiny = torch.zeros(4, dtype=torch.float64)
    try:
        for i in range(rounds + 1):  # the first round warms up, untimed
            t0 = time.perf_counter()
            gradient_step(cfg, model, optimizer, mb, mb["valid"])
            t1 = time.perf_counter()
            gradient_step(cfg, model, optimizer, mb, mb["valid"], peers)
            t2 = time.perf_counter()
            # What gradient_step sends: its two decisions and the return normaliser's moments.
            peers.average_gradients(params, float(mb["valid"].sum()), [0.0, 0.0], torch.zeros(3, dtype=torch.float64))
            t3 = time.perf_counter()
            # The floor under every collective: a normaliser's few moments, repeated, as
            # a CartPole batch's nine collectives are each about this small.
            tiny_s = []
            for _ in range(TINY_PER_ROUND):
                t4 = time.perf_counter()
                peers.sum_(tiny)
                tiny_s.append(time.perf_counter() - t4)
            if i:
                times["step"].append(t1 - t0)
                times["step_allreduce"].append(t2 - t1)
                times["allreduce"].append(t3 - t2)
                times["tiny"].extend(tiny_s)
    finally:
        peers.leave()
    result.send({"times": times, "params": sum(p.numel() for p in params), "precision": precision.describe(),
                 "minibatch": int(mb["valid"].numel()), "cpus": sorted(os.sched_getaffinity(0))})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def allreduce_share(args) -> float:
    """Prints each rank's timings; returns the all-reduce's share of a step, rank 0's."""
    import multiprocessing

    from fastrl.envs.registry import get_spec

    env = get_spec("doom_battle").make(seed=0)
    obs_space, action_space = env.observation_space, env.action_space
    env.close()
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
    procs = [ctx.Process(target=_allreduce_rank, args=(r, port, args.allreduce_rounds, obs_space, action_space,
                                                       pipes[r][1])) for r in range(2)]
    for p in procs:
        p.start()
    results = [receive.recv() for receive, _ in pipes]
    for p in procs:
        p.join()
    first = results[0]
    print(f"doom_battle model: {first['params']:,} parameters ({first['params'] * 4 / 2**20:.1f} MiB of float32 "
          f"gradient), minibatch {first['minibatch']:,} samples, {first['precision']}")
    for rank, r in enumerate(results):
        med = {k: statistics.median(v) * 1e3 for k, v in r["times"].items()}
        print(f"rank {rank} (cpus {r['cpus']}): step {med['step']:.0f} ms alone, {med['step_allreduce']:.0f} ms "
              f"with the all-reduce; the all-reduce alone {med['allreduce']:.1f} ms = "
              f"{med['allreduce'] / med['step_allreduce']:.1%} of a step (medians of {len(r['times']['step'])}); "
              f"an all-reduce of 4 numbers {med['tiny'] * 1e3:.0f} us (median), "
              f"{statistics.quantiles(r['times']['tiny'], n=10)[-1] * 1e6:.0f} us (p90) of {len(r['times']['tiny'])}")
    times = results[0]["times"]
    return statistics.median(times["allreduce"]) / statistics.median(times["step_allreduce"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1",
                        help="part 1's env; only CartPole-v1 has a target and a half-batch variant")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=300.0)
    parser.add_argument("--budget_seconds", type=float, default=120.0, help="give up on a run after this long")
    parser.add_argument("--slow_seconds", type=float, default=60.0, help="length of each slow-rank run")
    parser.add_argument("--allreduce_rounds", type=int, default=10)
    parser.add_argument("--train_options", default="",
                        help="more fastrl.train options for every run of part 1, in one string: --train_options="
                             "'--num_minibatches 2' takes half the gradient steps (and collectives) a batch")
    parser.add_argument("--skip_runs", action="store_true", help="leave out part 1")
    parser.add_argument("--skip_slow_rank", action="store_true", help="leave out part 2")
    parser.add_argument("--skip_allreduce", action="store_true", help="leave out part 3")
    args = parser.parse_args()
    print(f"machine: {records.cpu_model()}, {psutil.cpu_count()} logical cores "
          f"({len(os.sched_getaffinity(0))} usable), {psutil.virtual_memory().total / 2**30:.0f} GiB, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    figure = {}
    if not args.skip_runs:
        figure.update(scale_runs(args))
    if not args.skip_slow_rank:
        slow_rank(args)
    if not args.skip_allreduce:
        figure["allreduce_share_of_doom_battle_step"] = round(allreduce_share(args), 3)
    if figure:  # the slow rank alone has no headline figure
        records.append(f"scale_out_{args.env}", figure, records.this_command())
    return 0


if __name__ == "__main__":
    sys.exit(main())
