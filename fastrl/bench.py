"""`python -m fastrl.bench --env ENV [--mode MODE] [--seconds S] [--warmup S] [--json PATH] [train options]`

How fast fastrl is on this machine, and what holds it back. Measures the layout
`python -m fastrl.train` would run (planned once), each mode for --seconds after a
--warmup:

  env     env stepping alone, random actions: the sampling limit (env-limit)
  infer   the model's inference and learner cost, which with env gives the
          compute-bound limit
  sample  rollout (and policy) workers feeding a sink instead of the learner
  train   the whole trainer

With sample or train, env and infer are measured half before and half after, so a
machine whose speed drifts is compared with itself. The report gives rates, ratios
to both limits, each component's busy/wait/comm shares, policy lag, CPU (and GPU)
use, and the bottleneck.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import math
import os
import shutil
import sys
import tempfile

import psutil
import torch
from tqdm import tqdm

from fastrl.algo.model import Precision, has_images, resolve_device
from fastrl.config import Config, ConfigError, build_parser, parse_args
from fastrl.learning.compiled import COMPILE_KEY, describe_compile, will_compile
from fastrl.plumbing.files import cannot_write, write_json
from fastrl.plumbing.proc import usable_cores
from fastrl.plumbing.stats_board import FIELDS
from fastrl.sampling.compiled_act import ACT_COMPILE_KEY, actors_compile, describe_actor_compiles
from fastrl.tuning.bottleneck import diagnose
from fastrl.tuning.profiling import (
    Budget,
    ProfilingError,
    compute_bound_limit,
    machine_info,
    mean_env_profile,
    mean_model_profile,
    measure_env,
    measure_model,
)

MODES = ("env", "infer", "sample", "train")
NEVER_S = 1e9  # "not within a bench run": periodic checkpoints and status lines would disturb the window
# How often the window reads the run (see _Window).
EDGE_SNAPSHOT_S, FALLBACK_SNAPSHOT_S = 0.5, 1.0
STARTUP_S = 300.0  # how long a sample/train run may take to start flowing (many Doom games start slowly)
# How long a train run's warm-up may wait for a compiling learner to pick its step.
COMPILE_WAIT_S = 120.0


class BenchError(RuntimeError):
    """A measurement could not be taken; the message says which and why."""


def build_bench_parser():
    parser = build_parser(prog="python -m fastrl.bench", error_name="fastrl.bench",
                          description="Measure fastrl's throughput on this machine and name the bottleneck. "
                                      "Takes every train option; runs go to a temporary folder, so --train_dir "
                                      "and --experiment are ignored.")
    group = parser.add_argument_group("bench")
    group.add_argument("--mode", choices=(*MODES, "all"), default="all",
                       help="What to measure: env stepping, model compute, the sampling system, the trainer, "
                            "or all four.")
    group.add_argument("--seconds", type=float, default=20.0, help="Measured seconds per mode, after the warm-up.")
    group.add_argument("--warmup", type=float, default=5.0,
                       help="Seconds each mode runs before its measurement starts.")
    group.add_argument("--json", default="", metavar="PATH",
                       help="Also write every number, with the machine, to this JSON file.")
    return parser


def bench_config(cfg: Config, train_dir: str, experiment: str, warmup: float, seconds: float) -> Config:
    """The user's config in a throwaway experiment that stops by startup + warm-up +
    window at the latest; reward and frame targets (they would end the window early)
    and W&B are dropped."""
    return dataclasses.replace(
        cfg, train_dir=train_dir, experiment=experiment, restart=True, train_for_env_frames=0,
        train_for_seconds=STARTUP_S + warmup + seconds, stop_at_reward=None, with_wandb=False,
        status_every_seconds=NEVER_S, checkpoint_every_seconds=NEVER_S)


def forward_batch_sizes(cfg: Config) -> list:
    """Inference batch sizes the config produces, the planned one last. A policy
    worker batches about one split from each worker it serves."""
    if cfg.inference == "local":
        return [cfg.envs_per_split]
    served = max(cfg.envs_per_split, cfg.num_workers * cfg.envs_per_split // cfg.num_policy_workers)
    return sorted({cfg.envs_per_split, served})


class _Progress:
    """One tqdm bar over every mode's planned seconds (startup time is not counted)."""

    def __init__(self, plan: dict):
        self._plan, self._base, self._mode = plan, 0.0, ""
        self._bar = tqdm(total=round(sum(plan.values())), unit="s", leave=False, mininterval=0.5,
                         bar_format="bench {desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s")

    def start(self, mode: str) -> None:
        self._base = self._bar.n
        self._mode = mode
        self._bar.set_description_str(mode)

    def at(self, elapsed: float) -> None:
        target = self._base + min(elapsed, self._plan[self._mode])
        if target > self._bar.n:
            self._bar.update(target - self._bar.n)

    def close(self) -> None:
        self._bar.close()


# Which role a run process's CPU time counts under, by its name's first word; a
# rollout worker's children (ViZDoom's engines) count as "env processes".
ROLES = {"learner": "learner", "rollout-worker": "rollout workers", "policy-worker": "policy workers",
         "sink": "sink", "evaluator": "evaluator"}


def _cpu_seconds(runner) -> tuple:
    """({role: CPU seconds so far}, busy CPU seconds of the whole machine); their
    change over the window says where the CPU went and whether others took cores."""
    def cpu(proc) -> float:
        try:
            t = proc.cpu_times()
            return t.user + t.system
        except psutil.Error:
            return 0.0  # it ended; a small undercount for a restarted worker

    roles = {}
    for p in runner.processes:
        role = ROLES.get(p.name.split(" ")[0], p.name)
        try:
            proc = psutil.Process(p.pid)
            children = proc.children(recursive=True)
        except psutil.Error:
            continue
        roles[role] = roles.get(role, 0.0) + cpu(proc)
        if children:
            roles["env processes"] = roles.get("env processes", 0.0) + sum(cpu(c) for c in children)
    roles["runner"] = cpu(psutil.Process())
    m = psutil.cpu_times()
    machine = (m.user + m.nice + m.system
               + getattr(m, "irq", 0.0) + getattr(m, "softirq", 0.0) + getattr(m, "steal", 0.0))
    return roles, machine


class _Window:
    """The runner's observer: board snapshots that bound the measurement window.

    The warm-up starts once the pipeline flows, so startup does not leak into the
    window. The edges are polls where the consumer has just taken a batch: timers
    add a span only when it ends, so edges at the same point of the consumer's cycle
    count whole cycles. Without two such points, the first and last polls serve.
    """

    def __init__(self, warmup: float, seconds: float, progress: _Progress, awaits_compile: bool = False,
                 awaits_actors: bool = False):
        """awaits_compile / awaits_actors: the warm-up lasts until the learner / rollout
        workers have chosen compiled or eager, so the window times what the run keeps."""
        self.warmup, self.seconds, self.progress = warmup, seconds, progress
        self.awaits_learner, self.awaits_actors = awaits_compile, awaits_actors
        self.compile_waited_s = 0.0  # warm-up time past --warmup spent waiting for that
        self.window_from = None
        self.flowing_at = None
        self.first = self.last = None  # polls after the warm-up
        self.start = self.end = None  # polls just after the consumer took a batch
        self.lags: list = []  # (elapsed, (min, mean, p90, max)) per learner batch
        self._received = self._version = None

    def __call__(self, runner, elapsed: float) -> None:
        board = runner.ctx.board
        if self.flowing_at is None:
            # A rollout worker beats while it makes its envs, so it has started once it steps them.
            started = all(board.get(r, "env_steps" if r.startswith("rollout_") else "heartbeat") > 0
                          for r in board.row_names if r != "runner")
            if not (started and board.get("learner", "samples_received") > 0):
                return
            self.flowing_at = elapsed
            # The run's stop condition, moved to the end of the window once it is known.
            runner.cfg.train_for_seconds = elapsed + self.warmup + self.seconds + (
                COMPILE_WAIT_S if self.awaits_learner or self.awaits_actors else 0.0)
        received, version = board.get("learner", "samples_received"), board.get("learner", "learner_steps")
        took_batch, self._received = received != self._received, received
        if version != self._version and self.first is not None:
            lag = tuple(board.get("learner", f) for f in ("lag_min", "lag_mean", "lag_p90", "lag_max"))
            self.lags.append((elapsed, lag))
        self._version = version
        if self.window_from is None:
            self.progress.at(min(elapsed - self.flowing_at, self.warmup))
            warm = elapsed >= self.flowing_at + self.warmup
            settled = ((not self.awaits_learner or COMPILE_KEY in runner.metrics)
                       and (not self.awaits_actors or runner.actor_compiles_said))
            if warm and not settled:
                warm = elapsed >= self.flowing_at + COMPILE_WAIT_S
            if not warm:
                return
            self.window_from = elapsed
            self.compile_waited_s = elapsed - self.flowing_at - self.warmup
            runner.cfg.train_for_seconds = elapsed + self.seconds
        self.progress.at(self.warmup + elapsed - self.window_from)
        # A snapshot scans /proc for every process on the machine, which with many
        # engines costs the run real CPU, so take one only at edges and once a second.
        since = elapsed - self.last[0] if self.last else math.inf
        if not ((took_batch and (self.start is None or since >= EDGE_SNAPSHOT_S)) or since >= FALLBACK_SNAPSHOT_S):
            return
        rows = {row: {f: board.get(row, f) for f in FIELDS} for row in board.row_names}
        snap = (elapsed, rows, _cpu_seconds(runner))
        if self.first is None:
            self.first = snap
        self.last = snap
        if took_batch:
            if self.start is None:
                self.start = snap
            else:
                self.end = snap

    def edges(self):
        """(start, end) snapshots, each (elapsed, {row: {field: value}}, cpu seconds), or None."""
        if self.end is not None:
            return self.start, self.end
        if self.last is not None and self.last[0] > self.first[0]:
            return self.first, self.last
        return None

    def lags_within(self, t0: float, t1: float) -> list:
        return [lag for t, lag in self.lags if t0 < t <= t1]


def _rate_report(window: _Window, learn: bool) -> dict:
    """Rates, fractions, lag and the bottleneck over the window."""
    (t0, s0, cpu0), (t1, s1, cpu1) = window.edges()
    dt = t1 - t0
    lags = window.lags_within(t0, t1)

    def delta(row: str, field: str) -> float:
        return s1[row][field] - s0[row][field]

    def rows(prefix: str) -> list:
        return [r for r in s1 if r.startswith(prefix)]

    def fractions(names: list, fields=("busy", "wait", "comm")) -> dict:
        # A span straddling the window's edge can push a share past 1: clamp.
        out = {f: min(1.0, sum(delta(r, f + "_s") for r in names) / len(names) / dt) for f in fields}
        return {**out, "count": len(names)}

    steps = sum(delta(r, "env_steps") for r in rows("rollout_"))
    frames = sum(delta(r, "env_frames") for r in rows("rollout_"))
    received = delta("learner", "samples_received")
    consumer = "learner" if learn else "sink"
    parts = {"rollout": fractions(rows("rollout_"))}
    if rows("policy_"):
        parts["policy"] = fractions(rows("policy_"))
        # The sink only waits and frees buffers: it has no busy share.
    parts[consumer] = fractions(["learner"], ("busy", "wait", "comm") if learn else ("wait", "comm"))
    result = {
        "window_s": dt,
        "frames_per_s": frames / dt,
        "steps_per_s": steps / dt,
        "throughput": {"produced_per_s": steps / dt, "received_per_s": received / dt},
        "fractions": parts,
    }
    if learn:
        trained, learner_steps = delta("learner", "samples_trained"), delta("learner", "learner_steps")
        result["throughput"]["trained_per_s"] = trained / dt
        result["learner_steps_per_s"] = learner_steps / dt
        if lags:
            lag_mean = sum(lag[1] for lag in lags) / len(lags)
            result["lag"] = {"min": min(lag[0] for lag in lags), "mean": lag_mean,
                             "p90": sum(lag[2] for lag in lags) / len(lags), "max": max(lag[3] for lag in lags)}
            # Staleness in time: lag learner steps x seconds per learner step.
            result["staleness"] = {"mean_age_s": lag_mean * dt / learner_steps,
                                   "dropped_fraction": delta("learner", "samples_dropped") / max(received, 1.0)}
    restarts = sum(delta(r, "env_restarts") for r in rows("rollout_"))
    if restarts:  # reported only when it happened: the rates then include failing envs
        result["env_restarts"] = restarts
        # max(0, ...): a worker restarted inside the window counts from zero.
    roles = {role: max(0.0, seconds - cpu0[0].get(role, 0.0)) for role, seconds in cpu1[0].items()}
    ours, machine = sum(roles.values()) / dt, (cpu1[1] - cpu0[1]) / dt
    result["cpu_cores_used"] = {"by_this_run": ours, "by_other_programs": max(0.0, machine - ours)}
    # Core time per agent step by role, comparable with the compute-bound limit's parts.
    result["core_s_per_step"] = {role: seconds / max(steps, 1.0) for role, seconds in roles.items()}
    gpu = _gpu_report(delta, rows, dt, steps)
    if gpu is not None:
        result["gpu"] = gpu
    result["bottleneck"] = diagnose(parts, cores=usable_cores(), others_cores=max(0.0, machine - ours),
                                    gpu_busy=None if gpu is None else gpu["busy"])
    return result


def _gpu_report(delta, rows, dt: float, steps: float):
    """The GPU's share of the window by what it ran, its time per agent step and the
    copies' time; None on a run without a GPU."""
    learners, policies = rows("learner"), rows("policy_")
    spans = {"learner": sum(delta(r, "gpu_s") for r in learners), "policy": sum(delta(r, "gpu_s") for r in policies),
             "h2d": sum(delta(r, "h2d_s") for r in learners), "d2h": sum(delta(r, "d2h_s") for r in policies)}
    total = sum(spans.values())
    if total <= 0.0:
        return None
    batches = sum(delta(r, "learner_steps") for r in learners)
    forwards = sum(delta(r, "inference_batches") for r in policies)
    # Different processes' spans may overlap, so their sum can pass the wall time:
    # busy is capped at 1, `spanned` keeps the sum.
    return {"busy": min(1.0, total / dt), "spanned": total / dt, "shares": {k: v / dt for k, v in spans.items()},
            "s_per_step": total / max(steps, 1.0), "wall_s_per_step": dt / max(steps, 1.0),
            "h2d_s_per_batch": spans["h2d"] / batches if batches else None,
            "d2h_s_per_forward": spans["d2h"] / forwards if forwards else None}


def measure_runner(cfg: Config, learn: bool, warmup: float, seconds: float, progress: _Progress) -> dict:
    """Run the trainer (learn=True) or the sampling system with a sink (learn=False)
    for warm-up + window and report the window."""
    from fastrl.runtime.runner import Runner  # the runner pulls in every process module; env/infer modes do not need it

    runner = Runner(cfg, learn=learn)
    images, device_type = has_images(runner.obs_space), torch.device(runner.device).type
    compiles = learn and will_compile(cfg.compile_learner, images, cfg.use_rnn, device_type)
    actors = actors_compile(cfg.compile_actors, images, cfg.use_rnn, device_type, cfg.inference,
                            runner.precision.acting)
    window = _Window(warmup, seconds, progress, awaits_compile=compiles, awaits_actors=actors)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):  # the runner's own status lines would break the bar and the table
        code = runner.run(observer=window)
    mode = "train" if learn else "sample"
    if code != 0:
        raise BenchError(f"the {mode} run stopped with exit code {code}:\n{log.getvalue().rstrip()}")
    if window.edges() is None:
        raise BenchError(f"the {mode} run never started flowing within {STARTUP_S:.0f} s, so nothing was measured:\n"
                         f"{log.getvalue().rstrip()}")
    result = _rate_report(window, learn)
    if compiles or actors:
        result["compile_waited_s"] = window.compile_waited_s
    if compiles:
        result["learner_compile"] = runner.metrics.get(COMPILE_KEY)
    if actors:
        result[ACT_COMPILE_KEY] = runner.actor_compile_reports() if runner.actor_compiles_said else None
    return result


def run_bench(cfg: Config, explicit: set, modes: list, seconds: float, warmup: float) -> dict:
    """Measure `modes` of the layout `python -m fastrl.train` would run with these
    options (`explicit`: those the user set) and return the report --json writes."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"--seconds is {seconds:g} but must be a positive number.")
    if not (math.isfinite(warmup) and warmup >= 0):
        raise ConfigError(f"--warmup is {warmup:g} but must be a number, 0 or more.")
    if cfg.num_policies != 1:
        raise ConfigError(f"fastrl.bench measures one policy's pipeline, not --num_policies {cfg.num_policies}; "
                          "drop it, or compare P policies with one by benchmarks/several_policies.py.")
    from fastrl.runtime.runner import prepare_experiment
    from fastrl.tuning import planner

    train_dir = tempfile.mkdtemp(prefix="fastrl-bench-")
    try:
        # Every check the trainer makes (unknown env, bad options) and its plan, before anything runs.
        prepared = prepare_experiment(bench_config(cfg, train_dir, "plan", warmup, seconds), explicit)
        plan, spec, precision = prepared.plan, prepared.spec, prepared.precision
        obs_space, action_space = prepared.obs_space, prepared.action_space
        # Planned once: every mode measures the same layout, and no run profiles again.
        cfg = dataclasses.replace(planner.apply(cfg, plan) if plan else cfg, plan="off")
        report = {"env": cfg.env, "frameskip": spec.frameskip, "modes": list(modes), "seconds": seconds,
                  "warmup": warmup, "machine": machine_info(), "config": cfg.to_dict(),
                  "precision": precision._asdict(), "results": {}}
        if plan:
            report["plan"] = {"description": planner.describe(plan, spec.frameskip), **dataclasses.asdict(plan)}
        results = report["results"]
        limits = [m for m in ("env", "infer") if m in modes]
        runs = [m for m in ("sample", "train") if m in modes]
        # Limits measured half before and half after the runs and averaged: a VM's
        # speed drifts from minute to minute.
        halves = ("", " again") if runs and limits else ("",)
        limit_seconds = seconds / len(halves)
        planned = {f"{m}{h}": limit_seconds + (warmup if m == "env" else 0) for h in halves for m in limits}
        progress = _Progress({**planned, **{m: seconds + warmup for m in runs}})
        measure = functools.partial(_measure_limits, cfg, limits, obs_space, action_space, precision, limit_seconds,
                                    warmup, progress)
        try:
            measured = [measure(halves[0])]
            for mode, learn in (("sample", False), ("train", True)):
                if mode in runs:
                    progress.start(mode)
                    results[mode] = measure_runner(bench_config(cfg, train_dir, mode, warmup, seconds),
                                                   learn, warmup, seconds, progress)
            if len(halves) == 2:
                measured.append(measure(halves[1]))
        finally:
            progress.close()
        _report_limits(results, measured, cfg)
    finally:
        shutil.rmtree(train_dir, ignore_errors=True)
    report["ratios"] = _ratios(results)
    last = next((results[m] for m in ("train", "sample") if m in results), None)
    if last:
        report["bottleneck"] = last["bottleneck"]
    return report


def _measure_limits(cfg: Config, limits: list, obs_space, action_space, precision: Precision, seconds: float,
                    warmup: float, progress: _Progress, label: str) -> tuple:
    """(EnvProfile or None, ModelProfile or None) for the modes in `limits`."""
    env = model = None
    if "env" in limits:
        progress.start("env" + label)
        env = measure_env(cfg, cfg.num_workers, seconds, warmup, progress=progress.at)
    if "infer" in limits:
        progress.start("infer" + label)
        threads = sorted({1, cfg.torch_threads, cfg.learner_threads or cfg.torch_threads})
        model = measure_model(cfg, obs_space, action_space, forward_batch_sizes(cfg), threads,
                              Budget(seconds, progress=progress.at), device=resolve_device(cfg), precision=precision)
    return env, model


def _report_limits(results: dict, measured: list, cfg: Config) -> None:
    """Fill the env and infer results from one or two (before, after) measurements."""
    envs = [env for env, _ in measured if env]
    models = [model for _, model in measured if model]
    env = mean_env_profile(envs) if envs else None
    batch, cores = forward_batch_sizes(cfg)[-1], usable_cores()
    if env:
        results["env"] = env.to_dict()
    if models:
        model = mean_model_profile(models)
        results["infer"] = {**model.to_dict(), "forward_batch": batch,
                            "learner_core_s_per_sample": model.learner_core_s()}
        if env:
            # A compiled step or forward, where the train run kept one, is this eager
            # measurement scaled by the ratio the run timed.
            ratio = _compiled_ratio(results.get("train", {}))
            forward_ratio = _actors_forward_ratio(results.get("train", {}))

            def kept(m):
                if ratio is not None:
                    m = dataclasses.replace(m, train_s_per_sample={
                        t: s * ratio for t, s in m.train_s_per_sample.items()})
                if forward_ratio is not None:
                    m = dataclasses.replace(m, forward_s_per_sample={
                        t: {b: s * forward_ratio for b, s in per_batch.items()}
                        for t, per_batch in m.forward_s_per_sample.items()})
                return m

            bound = compute_bound_limit(env, kept(model), batch, cores)
            if ratio is not None:
                bound["learn_compiled_ratio"] = ratio
            if forward_ratio is not None:
                bound["forward_compiled_ratio"] = forward_ratio
            if len(measured) == 2:
                bound["before_and_after_steps_per_s"] = [
                    compute_bound_limit(e, kept(m), batch, cores)["steps_per_s"] for e, m in measured]
            results["infer"]["compute_bound"] = bound


def _compiled_ratio(train: dict):
    """The train run's compiled over eager step time, if it kept the compiled step."""
    report = train.get("learner_compile")
    if report and report["chosen"] == "compiled" and report.get("ratio"):
        return report["ratio"]
    return None


def _actors_forward_ratio(train: dict):
    """The rollout workers' mean compiled over eager forward time (1.0 for those that
    kept eager), if any kept a compiled forward."""
    reports = train.get(ACT_COMPILE_KEY) or []
    kept = [r["ratio"] if r["chosen"] == "compiled" else 1.0 for r in reports if r.get("ratio")]
    if not kept or all(k == 1.0 for k in kept):
        return None
    return sum(kept) / len(kept)


def _ratios(results: dict) -> dict:
    ratios = {}
    env_fps = results.get("env", {}).get("frames_per_s")
    bound = results.get("infer", {}).get("compute_bound")
    for mode in ("sample", "train"):
        if mode in results and env_fps:
            ratios[f"{mode}_over_env_limit"] = results[mode]["frames_per_s"] / env_fps
    if "train" in results and bound:
        train = results["train"]
        ratios["train_over_compute_bound"] = train["steps_per_s"] / bound["steps_per_s"]
        # The same ratio as a product: the share of cores kept busy, times the limit's
        # core time per step over the run's.
        ratios["train_cores_busy_fraction"] = train["cpu_cores_used"]["by_this_run"] / bound["cores"]
        ratios["limit_over_train_core_s_per_step"] = (sum(bound["core_s_per_step"].values())
                                                      / sum(train["core_s_per_step"].values()))
    return ratios


# --------------------------------------------------------------------------------------
# The printed report

def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def format_report(report: dict) -> str:
    r, m, cfg = report["results"], report["machine"], Config(**report["config"])
    gpu = m["gpu"] or "no GPU"
    lines = [
        f"fastrl bench: {report['env']}, {_count(cfg.num_workers, 'rollout worker', 'rollout workers')} x "
        f"{_count(cfg.num_envs_per_worker, 'env', 'envs')}, inference {cfg.inference}, torch_threads "
        f"{cfg.torch_threads}; {report['seconds']:g} s per mode after {report['warmup']:g} s warm-up",
        f"machine: {m['cpu']}, {m['usable_cores']} usable cores, {gpu}, torch {m['torch']}, python {m['python']}",
    ]
    if "plan" in report:
        lines.append(f"layout chosen by the planner, {report['plan']['description']}")
    lines.append(Precision(**report["precision"]).describe())
    table = []

    def row(mode: str, fps: float, sps: float, note: str) -> None:
        table.append(f"{mode:<8}{fps:>14,.0f}{sps:>15,.0f}   {note}")

    ratios = report["ratios"]
    if "env" in r:
        e = r["env"]
        row("env", e["frames_per_s"], e["steps_per_s"],
            f"env-limit: {_count(e['num_procs'], 'process', 'processes')} x "
            f"{_count(e['envs_per_proc'], 'env', 'envs')}, random actions, no model")
    if "infer" in r and "compute_bound" in r["infer"]:
        b = r["infer"]["compute_bound"]
        row("infer", b["frames_per_s"], b["steps_per_s"], f"compute-bound limit on {b['cores']} cores (see below)")
    if "sample" in r:
        note = f"{ratios['sample_over_env_limit']:.2f} x env-limit" if "sample_over_env_limit" in ratios else ""
        row("sample", r["sample"]["frames_per_s"], r["sample"]["steps_per_s"], note)
    if "train" in r:
        limits = (("train_over_env_limit", "env-limit"), ("train_over_compute_bound", "compute-bound limit"))
        notes = [f"{ratios[k]:.2f} x {name}" for k, name in limits if k in ratios]
        row("train", r["train"]["frames_per_s"], r["train"]["steps_per_s"], ", ".join(notes))
    if table:
        lines += ["", f"{'mode':<8}{'env frames/s':>14}{'agent steps/s':>15}   notes", *table,
                  f"(env frames = agent steps x frameskip {report['frameskip']})"]
    if "plan" in report and "train" in r:
        predicted = report["plan"]["predicted"]["trained_steps_per_s"]
        lines.append(f"train measured {r['train']['throughput']['trained_per_s'] / predicted:.0%} of the plan's "
                     f"predicted {predicted * report['frameskip']:,.0f} env frames/s trained")
    if "limit_over_train_core_s_per_step" in ratios:
        limit_s = sum(r["infer"]["compute_bound"]["core_s_per_step"].values())
        run_s = sum(r["train"]["core_s_per_step"].values())
        lines.append(f"train / compute-bound limit {ratios['train_over_compute_bound']:.2f} = cores kept busy "
                     f"{ratios['train_cores_busy_fraction']:.2f} x core time per agent step, the limit's "
                     f"{_us(limit_s)} over the run's {_us(run_s)} ({ratios['limit_over_train_core_s_per_step']:.2f})")
    if "infer" in r:
        lines += ["", *_compute_lines(r["infer"])]
    for mode in ("train", "sample"):
        if mode in r:
            lines += ["", *_time_lines(mode, r[mode], cfg, m["usable_cores"])]
            break
    return "\n".join(lines)


def _compute_lines(infer: dict) -> list:
    out = ["model compute (infer), wall time per sample:"]
    for threads, per_batch in infer["forward"].items():
        for batch, f in per_batch.items():
            out.append(f"  forward  {threads} thread(s), batch {batch:>6}: {_us(f['s_per_sample']):>10}"
                       f"  ({f['samples_per_s']:,.0f} samples/s)")
    for threads, t in infer["train"].items():
        out.append(f"  fwd+bwd  {threads} thread(s), minibatch {t['minibatch']}: {_us(t['s_per_sample']):>10}"
                   f"  ({t['samples_per_s']:,.0f} samples/s), x {infer['ppo_epochs']} epochs per trained sample")
    if "compute_bound" in infer:
        b = infer["compute_bound"]
        c = b["core_s_per_step"]
        out.append(f"  compute-bound limit = {b['cores']} cores / (env {_us(c['env'])} + forward {_us(c['forward'])}"
                   f" + learn {_us(c['learn'])} per agent step, in core time) = {b['steps_per_s']:,.0f} steps/s")
        if "learn_compiled_ratio" in b:
            out.append(f"  (learn: the eager step timed here x {b['learn_compiled_ratio']:.2f}, the train run's "
                       "compiled step over its eager one)")
        if "forward_compiled_ratio" in b:
            out.append(f"  (forward: the eager forward timed here x {b['forward_compiled_ratio']:.2f}, the train run's "
                       "rollout workers' compiled forward over their eager one)")
        if "before_and_after_steps_per_s" in b:
            before, after = b["before_and_after_steps_per_s"]
            out.append(f"  (each cost: the mean of half a window before the runs, where the limit read {before:,.0f}"
                       f" steps/s, and half after, {after:,.0f})")
    else:
        out.append("  (the compute-bound limit needs the env measurement too: --mode all)")
    return out


def _time_lines(mode: str, res: dict, cfg: Config, cores: int) -> list:
    t = res["throughput"]
    consumer = "learner" if mode == "train" else "sink"
    flow = f"produced by actors {t['produced_per_s']:,.0f} | received by {consumer} {t['received_per_s']:,.0f}"
    if "trained_per_s" in t:
        flow += f" | trained by learner {t['trained_per_s']:,.0f}"
    out = [f"where the time goes ({mode}, {res['window_s']:.1f} s window):", f"  samples/s: {flow}",
           f"  {'component':<14}{'busy':>6}{'wait':>7}{'comm':>7}"]
    for name, f in res["fractions"].items():
        label = f"{name} x{f['count']}" if f["count"] > 1 else name
        cells = "".join(f"{f[k] * 100:>6.0f}%" if k in f else f"{'-':>7}" for k in ("busy", "wait", "comm"))
        out.append(f"  {label:<13}{cells}")
    if "lag" in res:
        lag, st = res["lag"], res["staleness"]
        out.append(f"  policy lag (learner steps): min {lag['min']:.0f}, mean {lag['mean']:.2f}, p90 {lag['p90']:.1f},"
                   f" max {lag['max']:.0f}; staleness: samples {st['mean_age_s']:.3f} s old on average,"
                   f" {st['dropped_fraction']:.1%} dropped past max_policy_lag {cfg.max_policy_lag}")
    elif mode == "train":
        out.append("  policy lag: the learner finished no batch in the window; raise --seconds.")
    cpu = res["cpu_cores_used"]
    out.append(f"  CPU: this run used {cpu['by_this_run']:.2f} cores, other programs {cpu['by_other_programs']:.2f}"
               f" (of {cores} usable)")
    per_step = ", ".join(f"{role} {_us(s)}" for role, s in res["core_s_per_step"].items())
    out.append(f"  core time per agent step: {per_step}")
    if "gpu" in res:
        out += _gpu_lines(res["gpu"])
    if "env_restarts" in res:
        out.append(f"  warning: envs raised and were restarted {res['env_restarts']:.0f} times in the window;"
                   " these rates include the failures.")
    if ACT_COMPILE_KEY in res:
        reports = res[ACT_COMPILE_KEY]
        out.append(f"  rollout workers: {describe_actor_compiles(reports)}" if reports else
                   f"  rollout workers: their compile was not decided within {COMPILE_WAIT_S:.0f} s of the run's "
                   "start, so the window mixes eager and compiled forwards")
    if "learner_compile" in res:
        report, waited = res["learner_compile"], res["compile_waited_s"]
        if report is None:
            out.append(f"  learner: its compile was not decided within {COMPILE_WAIT_S:.0f} s of the run's start, so"
                       " the window mixes eager and compiled steps")
        else:
            out.append(f"  learner: {describe_compile(report)}" + (
                f"; the window began {waited:.0f} s after the warm-up, once that was chosen" if waited > 0 else ""))
    out.append(f"  bottleneck: {res['bottleneck']}")
    return out


def _gpu_lines(g: dict) -> list:
    names = {"learner": "learner's steps", "policy": "policy workers' forwards", "h2d": "batch uploads",
             "d2h": "action copies"}
    shares = ", ".join(f"{names[k]} {v:.0%}" for k, v in g["shares"].items() if v > 0)
    out = [f"  GPU: busy {g['busy']:.0%} of the window ({shares}); {_us(g['s_per_step'])} of GPU time per agent step"
           f" of {_us(g['wall_s_per_step'])} wall"]
    if g["spanned"] > 1.0:
        out.append(f"  GPU: the spans add to {g['spanned']:.0%} of the window: those of different processes overlap,"
                   " each counting the time its kernels queued behind the others', so the GPU itself did less")
    copies = []
    if g["h2d_s_per_batch"] is not None:
        copies.append(f"upload {g['h2d_s_per_batch'] * 1e3:.2f} ms a batch")
    if g["d2h_s_per_forward"] is not None:
        copies.append(f"actions back {g['d2h_s_per_forward'] * 1e3:.3f} ms a forward")
    if copies:
        out.append("  GPU copies: " + ", ".join(copies))
    return out


def main(argv=None) -> int:
    cfg, extra = parse_args(argv, build_bench_parser())
    torch.set_num_threads(1)  # this process only watches the runs; measure_model sets its own threads
    modes = list(MODES) if extra.mode == "all" else [extra.mode]
    reason = extra.json and cannot_write(extra.json)
    if reason:  # asked now, not after minutes of measuring
        print(f"fastrl.bench: error: --json {extra.json} cannot be written ({reason}); choose another path.",
              file=sys.stderr)
        return 2
    try:
        report = run_bench(cfg, extra.explicit, modes, extra.seconds, extra.warmup)
    except ConfigError as err:
        print(f"fastrl.bench: error: {err}", file=sys.stderr)
        return 2
    except (BenchError, ProfilingError) as err:
        print(f"fastrl.bench: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("fastrl.bench: interrupted.", file=sys.stderr)
        return 130
    print(format_report(report))
    if extra.json:
        os.makedirs(os.path.dirname(os.path.abspath(extra.json)), exist_ok=True)
        write_json(extra.json, report, indent=2)
        print(f"wrote {os.path.abspath(extra.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
