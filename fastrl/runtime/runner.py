"""The runner: checks the configuration, builds the shared memory and queues, starts, watches and
stops the learner, policy workers and rollout workers, and reports. Under torchrun each rank has its
own runner and children; the runners never talk, their learners do once a batch and hand back the
run's summed counters (`SharedContext.totals`). Rank 0 reports for the run; the others, only faults."""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import json
import math
import os
import queue
import shutil
import signal
import sys
import time
from typing import List, NamedTuple, Optional

import faster_fifo
import faster_fifo_reduction  # noqa: F401  (lets faster-fifo queues travel to spawned children)
import torch
import torch.multiprocessing  # noqa: F401  (registers the reductions that send tensors as shared memory)

from fastrl.algo.distributions import ActionSpec, GaussianSpec, random_allowed_action
from fastrl.algo.model import (
    Precision,
    build_model,
    check_spaces,
    flat_state,
    flat_state_size,
    has_images,
    obs_layout,
    obs_to_tensors,
    resolve_device,
)
from fastrl.algo.model_registry import ModelError
from fastrl.config import (
    EARLIER_DEFAULTS,
    Config,
    ConfigError,
    check_env_and_options,
    config_from_saved,
    describe_origins,
    env_failure,
    env_options,
    save_config,
    validate,
)
from fastrl.cuda.ipc import remove_driver_files
from fastrl.learning import pbt
from fastrl.learning.checkpoint import (
    CheckpointError,
    RefusedCheckpointError,
    UnsafeTorchError,
    checkpoint_dir,
    checkpoint_root,
    load_latest_checkpoint,
)
from fastrl.learning.compiled import COMPILE_KEY, COMPILE_STARTED_KEY, COMPILE_STARTED_LINES, describe_compile
from fastrl.learning.drift import DriftWatch
from fastrl.learning.evaluator import evaluator_main
from fastrl.learning.learner import ALLOCATOR_KEY, BAD_BATCHES_KEY, WEIGHTS_KEY, LearnerStart, learner_main
from fastrl.plumbing import disk_space, machine_load, shm_space
from fastrl.plumbing.buffers import HeldBuffers, TrajectoryBuffers
from fastrl.plumbing.context import SharedContext
from fastrl.plumbing.files import DiskFullError, write_json
from fastrl.plumbing.hyper import SharedHyper
from fastrl.plumbing.params import SharedParams, StopFlag
from fastrl.plumbing.proc import (
    continue_descendants,
    launched_at,
    on_one_core,
    run_child,
    start_process_server,
    usable_cores,
)
from fastrl.plumbing.queue_locks import QueueLockWatch
from fastrl.plumbing.ranks import SOLO, Rank, RunTotals, run_count
from fastrl.plumbing.seeding import process_seed
from fastrl.plumbing.stats_board import StatsBoard, learner_row, per_second
from fastrl.plumbing.timeline import mark
from fastrl.presets import preset_for, preset_for_spaces
from fastrl.runtime.experiment_lock import experiment_locked
from fastrl.runtime.monitor import Monitor, NullMonitor, scalars_from
from fastrl.runtime.population import PopulationDriver
from fastrl.runtime.sink import sink_main
from fastrl.runtime.supervision import WorkerSupervisor
from fastrl.sampling.compiled_act import ACT_COMPILE_KEY, describe_actor_compiles
from fastrl.sampling.policy_worker import policy_worker_main
from fastrl.sampling.rollout_worker import rollout_worker_main
from fastrl.tuning import compiled_costs, layout_memory, planner, profiling
from fastrl.tuning.adapt import ThreadAdapter
from fastrl.tuning.precision import decide_precision

JOIN_TIMEOUT_S = 10.0
PROFILE_SECONDS = 1.5  # the planner's start-up profile; overlaps the process server's imports
# Its bound in wall seconds under any load, which can stretch it many times (benchmarks/startup.py).
PROFILE_CAP_S = 6.0
LEARNER_JOIN_TIMEOUT_S = 60.0  # it may be writing the final checkpoint of a large model
# How long a run that ended normally waits for the evaluation due at its end before abandoning it.
EVAL_FINISH_TIMEOUT_S = 60.0
POLL_S = 0.05
# How often the experiment's disk is checked for the room to end well: a statvfs, and a disk
# fills over minutes, not within a second.
DISK_CHECK_EVERY_S = 1.0
MAX_TRAINED_MARKS = 4096  # reports kept for the steady trained rate; past it, every other one
# A learner's statistics shown per policy beside the run's (policy 0's) full set.
POLICY_STATS = ("entropy", "approx_kl", "explained_variance", "lr")


def learner_name(policy: int) -> str:
    """The process name of policy `policy`'s learner: 'learner' for the first (the
    only one in a run of one policy), 'learner <k>' for the others."""
    return "learner" if policy == 0 else f"learner {policy}"


def is_learner(name: str) -> bool:
    return name == "learner" or name.startswith("learner ")


def exit_cause(exitcode) -> str:
    """How a child ended, in words: 'was killed by SIGKILL' or 'exited with code 1'."""
    if exitcode is not None and exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class TrainedMark(NamedTuple):
    """At a report: the time, this rank's samples trained, and the cores' CPU time."""
    at: float
    trained: float
    cpu: Optional[machine_load.CpuSample]


def longest_stall(marks: List[TrainedMark]) -> float:
    """The longest stretch of consecutive reports over which nothing was trained."""
    stall = longest = 0.0
    for a, b in zip(marks, marks[1:]):
        stall = stall + (b.at - a.at) if b.trained <= a.trained else 0.0
        longest = max(longest, stall)
    return longest


class Failure(NamedTuple):
    """What ended a run: the child's name, why in one clause ("was killed by SIGKILL",
    "raised ValueError: ..."), the text to print, traceback included, and whether a
    restart (--max_restarts) could help: not when the disk is full."""
    who: str
    cause: str
    text: str
    restartable: bool = True


def _child_failure(name: str, tb: str, sentence: str = "") -> Failure:
    """The Failure of a child that sent its traceback: its cause is the traceback's last line,
    or the exception's own sentence where it has one (plumbing.proc.run_child), printed alone."""
    if sentence:
        return Failure(name, f"stopped: {sentence}", f"{name}: {sentence}.", restartable=False)
    last = next((line.strip() for line in reversed(tb.splitlines()) if line.strip()), "an exception")
    return Failure(name, f"raised {last}", f"{name} failed:\n{tb}")


@dataclasses.dataclass
class Earlier:
    """What a run counted before its learner died, added in by the Runner that restarts it so that
    reports count the whole run; not frames, which restart at the checkpoint's count its weights match."""
    learner_restarts: int = 0
    death: str = ""  # which learner died last and why, in one clause: "the learner was killed by SIGKILL"
    worker_restarts: int = 0
    env_restarts: float = 0.0
    trajectories_discarded: float = 0.0
    episodes: int = 0
    returns100: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=100))
    objectives100: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=100))


class StopRequested(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _StopSignals:
    """SIGINT and SIGTERM for one run: StopRequested where it lands until `looping`, then only noted
    and raised at the loop's next poll, since one raised inside the TensorBoard writer's queue.put
    would leave its thread unwoken and the shutdown hanging on it."""

    def __init__(self):
        self.looping = False
        self._received: list = []
        self._previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in self._previous:
            signal.signal(s, self._on_signal)

    def _on_signal(self, signum, frame):
        if not self.looping:
            raise StopRequested(signum)
        self._received.append(signum)

    def raise_if_received(self) -> None:
        if self._received:
            raise StopRequested(self._received[0])

    def during_shutdown(self, on_signal) -> None:
        """From here on a signal only calls `on_signal()`: a second Ctrl-C must not
        cut the shutdown short, but may skip what can be skipped."""
        for s in self._previous:
            signal.signal(s, lambda _signum, _frame: on_signal())

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def plan_file(cfg: Config, resuming: bool) -> Optional[str]:
    """The plan.json a run with --plan auto or PATH takes instead of planning afresh:
    PATH, or the experiment's own when it resumes; None where it plans."""
    if cfg.plan == "fresh":
        return None
    if cfg.plan != "auto":
        return cfg.plan
    saved = os.path.join(cfg.experiment_dir, "plan.json")
    return saved if resuming and os.path.isfile(saved) else None


def make_plan(cfg: Config, explicit: set, env, resuming: bool, precision: Precision,
              one_thread: Optional[profiling.OneThreadCosts] = None, announce: bool = True) -> Optional[planner.Plan]:
    """--plan off: None; PATH: that plan; auto: the experiment's saved plan when resuming, else one
    from a start-up profile and what earlier runs measured here; fresh: the same, both forgotten
    first. `announce` prints where the plan came from."""
    if cfg.plan == "off":
        return None
    path = plan_file(cfg, resuming)
    if path:
        try:
            plan = planner.load(path)
        except (OSError, ValueError, TypeError) as err:
            raise ConfigError(f"--plan {path} is not a readable plan ({err}); give a plan.json that fastrl wrote, "
                              "or use --plan auto") from None
        if announce:
            print(f"fastrl: using the plan in {path}", flush=True)
        return plan
    fresh = cfg.plan == "fresh"
    if fresh:
        layout_memory.forget(cfg, precision)
        compiled_costs.forget(cfg, precision.learning)
        if announce:
            print("fastrl: --plan fresh: this setup's profile and earlier runs here are forgotten", flush=True)
    costs, cached, busy = profiling.cached_costs(cfg, env, PROFILE_SECONDS, precision, PROFILE_CAP_S, one_thread,
                                                 fresh=fresh)
    if cached and announce:
        print(f"fastrl: planning from this machine's cached profile of this setup on {resolve_device(cfg)}", flush=True)
    if busy and announce:
        print("fastrl: the planner's profile was taken on a busy machine (other programs took the cores, or it hit "
              f"its {PROFILE_CAP_S:.0f}-s cap), so the plan may fit a quiet one less well; it is not cached",
              flush=True)
    ratio = compiled_costs.remembered_ratio(cfg, precision.learning, has_images(env.observation_space))
    if ratio is not None and ratio < 1:  # (1: the step stayed eager there, as profiled)
        costs = compiled_costs.at_ratio(costs, ratio)
        if announce:
            print(f"fastrl: planning for the learner's step at {ratio:.2f}x of its eager cost, as an earlier run "
                  "of this setup on this machine measured it once compiled", flush=True)
    try:
        return planner.choose(costs, cfg, explicit, layout_memory.recall(cfg, precision))
    except ValueError as err:
        raise ConfigError(str(err)) from None


class Placement(NamedTuple):
    """Where a run computes and how: its image encoders' Precision and its Plan (None under --plan off)."""
    precision: Precision
    plan: Optional[planner.Plan]


def compares_devices(cfg: Config, resuming: bool, rank: Rank) -> bool:
    """Whether --device auto (the default, or written out) plans on the GPU and on the CPU to keep
    the faster: only where CUDA is present and a plan is made afresh (a saved plan keeps its
    device), and not under torchrun, whose ranks must compute alike."""
    return (cfg.device == "auto" and torch.cuda.is_available() and cfg.plan != "off"
            and plan_file(cfg, resuming) is None and not rank.distributed)


def place_run(cfg: Config, explicit: set, env, frameskip: int, resuming: bool, rank: Rank) -> Placement:
    """The run's precision and plan. Under --device auto with a GPU here, the plan that predicts more
    trained env frames/s, on the GPU or on the CPU: a small model's learner can run faster on the
    cores than as a GPU's many short kernels (benchmarks/gpu_check.sh's mujoco step measures it)."""
    devices = ("cuda", "cpu") if compares_devices(cfg, resuming, rank) else (cfg.device,)
    placements = {}
    for device in devices:
        on = dataclasses.replace(cfg, device=device)
        # Before the plan, which profiles the model in it; once, for every process of the run.
        precision, one_thread = decide_precision(on, env.observation_space, env.action_space)
        mark("precision decided")
        plan = make_plan(on, explicit, env, resuming=resuming, precision=precision, one_thread=one_thread,
                         announce=rank.main)
        placements[device] = Placement(precision, plan)
    if len(devices) == 1:
        return placements[devices[0]]
    rates = {d: p.plan.predicted["trained_steps_per_s"] for d, p in placements.items()}
    device = max(devices, key=rates.get)  # a tie keeps the GPU, listed first
    if rank.main:
        print(f"fastrl: --device auto: planned {rates['cuda'] * frameskip:,.0f} env frames/s trained on the GPU, "
              f"{rates['cpu'] * frameskip:,.0f} on the CPU; training on the {'GPU' if device == 'cuda' else 'CPU'}",
              flush=True)
    chosen = placements[device]
    return chosen._replace(plan=dataclasses.replace(chosen.plan, device=device))


# Observations the fresh models' normaliser starts from, from the run's first env under random actions.
NORMALIZER_SEED_STEPS = 64


def first_observations(env, steps: int) -> dict:
    """{key: [steps, ...]} of the observations `env` shows under random actions from
    its next reset (reset again at each episode's end)."""
    obs, _ = env.reset()
    seen = []
    for _ in range(steps):
        seen.append({k: v.clone() for k, v in obs_to_tensors(obs, env.observation_space).items()})
        obs, _, terminated, truncated, _ = env.step(random_allowed_action(env.action_space, obs))
        if terminated or truncated:
            obs, _ = env.reset()
    return {k: torch.stack([o[k] for o in seen]) for k in seen[0]}


@dataclasses.dataclass
class PreparedRun:
    """A run checked and decided before any process starts: its Config with presets and plan applied,
    the env's spaces, the models (from checkpoints where it resumes) and where each option came from."""
    cfg: Config
    plan: Optional[planner.Plan]
    spec: object
    obs_space: object
    action_space: object
    precision: Precision
    models: list  # one per policy
    states: list  # each policy's checkpoint state, None where it starts afresh
    paths: list
    origins: dict  # option -> "given" (command line or --config), "env preset", "saved run", "spaces preset", "plan"


def prepare_experiment(cfg: Config, explicit: set, rank: Rank = SOLO) -> PreparedRun:
    """Everything that can refuse the run, then precision, plan and models, in start-up order. Nothing
    is written before the last check, so a refused run leaves the experiment as it was. cfg.precision
    stays as given, so that a resumed run decides auto again on its own machine. Under torchrun
    each rank plans for its share of the machine, rank 0 alone deletes old checkpoints, and --restart
    holds for the launch only, so that ranks torchrun restarts resume instead of starting over."""
    origins = dict.fromkeys(explicit, "given")
    origins.update({k: "env preset" for k in preset_for(cfg.env) if k not in explicit})
    if cfg.restart and rank.restarts:
        cfg = dataclasses.replace(cfg, restart=False)
    cfg = _saved_options(cfg, explicit, origins, announce=rank.main)
    spec = check_env_and_options(cfg, writes=rank.main)
    _check_experiment(cfg, rank)
    states, paths = zip(*[_latest_checkpoint(cfg, k) for k in range(cfg.num_policies)])
    cfg = _earlier_defaults(cfg, states[0], paths[0], explicit, origins)
    shm_free = shm_space.free_bytes()
    env = _spec_env(cfg, spec)
    try:
        obs_space, action_space = env.observation_space, env.action_space
        try:
            check_spaces(obs_space, action_space)
        except ValueError as err:
            raise ConfigError(f"{cfg.env}: {err}") from None
        try:  # a user's encoder that does not fit is refused here, not as a traceback in a child
            if cfg.model:
                build_model(cfg, obs_space, action_space)
        except ModelError as err:
            raise ConfigError(str(err)) from None
        cfg = _spaces_presets(cfg, obs_space, action_space, explicit, origins, rank)
        seed_obs = _normaliser_seed(cfg, env, states)
        precision, plan = place_run(cfg, explicit, env, spec.frameskip, resuming=states[0] is not None, rank=rank)
        mark("plan made")
        # What the one env, made, reset and stepped by now, holds in shared memory (a ViZDoom game's screens).
        shm_per_env = max(0, shm_free - (shm_space.free_bytes() or shm_free)) if shm_free is not None else 0
    finally:
        env.close()
    mark("spec env closed")
    cfg = _apply_plan(cfg, plan, explicit, origins, rank)
    models = _build_models(cfg, obs_space, action_space, states, paths, seed_obs)
    _check_shared_memory(cfg, obs_space, action_space, models, shm_free, shm_per_env)
    ckpt_root = checkpoint_root(cfg)
    if rank.main:
        freed = disk_space.folder_bytes(ckpt_root) if cfg.restart else 0
        why = disk_space.shortfall_at_start(cfg.experiment_dir, disk_need(cfg, models), freed)
        if why:
            raise ConfigError(why)
    if cfg.restart and rank.main and os.path.isdir(ckpt_root):
        shutil.rmtree(ckpt_root)
    defaults = Config(env=cfg.env)
    origins = {k: v for k, v in sorted(origins.items()) if getattr(cfg, k) != getattr(defaults, k, None)}
    return PreparedRun(cfg, plan, spec, obs_space, action_space, precision, models, list(states), list(paths),
                       origins)


# What says which experiment this is and how to start it: never taken from its config.json.
LAUNCH_OPTIONS = ("env", "experiment", "train_dir", "restart", "plan")


def _saved_options(cfg: Config, explicit: set, origins: dict, announce: bool) -> Config:
    """A resumed run's options: those its config.json saved, with the ones given on
    this command line over them, each change said in one line. A run that starts
    afresh (--restart, or no checkpoint yet) takes the command line as it is."""
    saved_path = os.path.join(cfg.experiment_dir, "config.json")
    ckpt_root = checkpoint_root(cfg)
    if cfg.restart or not os.path.isfile(saved_path) or not (os.path.isdir(ckpt_root) and os.listdir(ckpt_root)):
        return cfg
    try:
        with open(saved_path) as fh:
            saved = config_from_saved(json.load(fh))
    except (OSError, ValueError, TypeError, AttributeError) as err:
        raise ConfigError(f"{saved_path} is not a config fastrl wrote ({err}); fix it, or pass --restart to start "
                          "over.") from None
    given = set(explicit) | set(LAUNCH_OPTIONS)
    merged = dataclasses.replace(saved, **{k: getattr(cfg, k) for k in given})
    origins.update({f.name: "saved run" for f in dataclasses.fields(Config) if f.name not in given})
    changed = [f"{k} {getattr(saved, k)} -> {getattr(merged, k)}" for k in sorted(explicit)
               if k not in LAUNCH_OPTIONS and getattr(saved, k) != getattr(merged, k)]
    if announce:
        print(f"fastrl: resuming with the options {saved_path} saved"
              + (f"; changed on this command line: {', '.join(changed)}" if changed else ""), flush=True)
    return merged


def _check_experiment(cfg: Config, rank: Rank) -> None:
    """Refuse what no run of this experiment folder can do, before reading it."""
    if rank.distributed and cfg.num_policies > 1:
        raise ConfigError(f"--num_policies {cfg.num_policies} is not supported under torchrun yet; train several "
                          "policies on one machine without torchrun, or one policy with it.")
    if cfg.lr_schedule == "linear" and _clock_per_rank(cfg, rank):
        raise ConfigError("--lr_schedule linear cannot decay over --train_for_seconds under torchrun, as each rank "
                          "keeps its own clock and their steps would differ; give --train_for_env_frames alone.")
    ckpt_root = checkpoint_root(cfg)
    if os.path.lexists(ckpt_root) and not os.path.isdir(ckpt_root):
        raise ConfigError(f"{ckpt_root} is not a folder, but the experiment keeps its checkpoints there; "
                          "move it away or choose another --experiment.")
    if not cfg.restart:
        _check_policy_count(cfg, ckpt_root)


def _earlier_defaults(cfg: Config, state: Optional[dict], path: Optional[str], explicit: set,
                      origins: dict) -> Config:
    """cfg for resuming from policy 0's checkpoint `state`: the same env, and the
    values of options whose default changed since that checkpoint was written."""
    if state is None:
        return cfg
    if state.get("env") != cfg.env:
        raise ConfigError(
            f"The checkpoint {path} was trained on {state.get('env')}, not {cfg.env}; "
            "pass --restart to start over or choose another --experiment.")
    older = {k: v for k, v in EARLIER_DEFAULTS.items() if k not in state.get("config", {}) and k not in explicit}
    origins.update(dict.fromkeys(older, "saved run"))
    return dataclasses.replace(cfg, **older)


def disk_need(cfg: Config, models: list) -> int:
    """Bytes the run must be able to write to its experiment's disk before it ends (plumbing.disk_space)."""
    return disk_space.bytes_needed(models, evaluates=cfg.eval_every_frames > 0)


def _check_shared_memory(cfg: Config, obs_space, action_space, models: list, free, per_env: int) -> None:
    """Refuse, before anything is written, a run whose buffers and envs cannot fit /dev/shm."""
    action_spec = ActionSpec.from_space(action_space)
    need = shm_space.SharedMemoryNeed(
        buffers=TrajectoryBuffers.bytes_needed(cfg.total_buffers, cfg.rollout, cfg.envs_per_split,
                                               obs_layout(obs_space), action_spec.action_dim, action_spec.dtype,
                                               models[0].rnn_state_size),
        envs=cfg.num_workers * cfg.num_envs_per_worker // cfg.agents_per_game, per_env=per_env,
        weights=sum(4 * flat_state_size(model) for model in models))
    why = shm_space.shortfall(need, free)
    if why:
        raise ConfigError(why)


def _spec_env(cfg: Config, spec):
    """The one env start-up opens, for its spaces and the planner's timing; with pinned workers it is
    made on the core the planner times it on, so that its engine's process sits where a worker's would."""
    with on_one_core(cfg.pin_workers):
        try:
            env = spec.make(seed=cfg.seed, **env_options(cfg))
        except Exception as err:  # noqa: BLE001 - the env's own failure, whatever it is (see env_failure)
            raise ConfigError(env_failure(cfg.env, err)) from None
    mark("spec env made")
    return env


def _clock_per_rank(cfg: Config, rank: Rank) -> bool:
    """Whether the run's time budget is kept on each torchrun rank's own clock, so that a rate
    decayed over it would step differently on each: no budget a linear rate can use."""
    return rank.distributed and bool(cfg.train_for_seconds)


def _spaces_presets(cfg: Config, obs_space, action_space, explicit: set, origins: dict, rank: Rank) -> Config:
    """cfg with the defaults the env's spaces bring (fastrl.presets), checked against them. A resumed
    run keeps the values it saved, given or preset, even where a preset has changed since."""
    budgeted = bool(cfg.train_for_env_frames or cfg.train_for_seconds) and not _clock_per_rank(cfg, rank)
    from_spaces = {k: v for k, v in preset_for_spaces(cfg.env, obs_space, action_space, budgeted).items()
                   if k not in explicit and origins.get(k) != "saved run"}
    origins.update(dict.fromkeys(from_spaces, "spaces preset"))
    cfg = dataclasses.replace(cfg, **from_spaces)
    if cfg.exploration_loss == "symmetric_kl" and ActionSpec.from_space(action_space).is_continuous:
        raise ConfigError(f"--exploration_loss symmetric_kl needs discrete actions, but {cfg.env} has "
                          f"{action_space}; use --exploration_loss entropy.")
    return cfg


def _normaliser_seed(cfg: Config, env, states) -> Optional[dict]:
    """Observations a fresh model's normaliser starts from, lest the first policy see every pixel
    clipped to one value; None where no policy starts afresh or the env cannot step."""
    if not cfg.normalize_obs or all(state is not None for state in states):
        return None
    try:
        return first_observations(env, NORMALIZER_SEED_STEPS)
    except Exception:  # noqa: BLE001 - an env that fails to step is the rollout workers' to report
        return None


def _apply_plan(cfg: Config, plan: Optional[planner.Plan], explicit: set, origins: dict, rank: Rank) -> Config:
    if plan is None:
        return cfg
    origins.update({k: "plan" for k in plan.options() if k not in explicit})
    cfg = planner.apply(cfg, plan)
    try:
        validate(cfg, writes=rank.main)
    except ConfigError as err:
        raise ConfigError(f"The plan does not fit these options: {err}") from None
    return cfg


def _build_models(cfg: Config, obs_space, action_space, states, paths, seed_obs: Optional[dict]) -> list:
    """One model per policy, each with its own initial weights (the generator moves
    on), loaded from its checkpoint where it has one."""
    torch.manual_seed(cfg.seed)
    models = [build_model(cfg, obs_space, action_space) for _ in range(cfg.num_policies)]
    for model, state, path in zip(models, states, paths):
        if state is None:
            if seed_obs is not None:
                model.update_normalizer(seed_obs)
            continue
        try:
            model.load_state_dict(state["model"])
        except (RuntimeError, KeyError) as err:
            first = str(err).strip().splitlines()[0]
            raise ConfigError(
                f"The checkpoint {path} does not fit this model ({first}); use the same model options "
                "as when it was trained, or pass --restart to start over.") from None
    return models


def _latest_checkpoint(cfg: Config, policy: int):
    """(state, path) of policy `policy`'s newest good checkpoint, (None, None) when it
    has none or the run restarts; a refused or damaged one is a ConfigError."""
    if cfg.restart:
        return None, None
    try:
        return load_latest_checkpoint(checkpoint_dir(cfg, policy))
    except UnsafeTorchError as err:
        raise ConfigError(str(err)) from None
    except RefusedCheckpointError as err:
        raise ConfigError(f"{err}; fastrl writes no such file, so delete it or pass --restart to start over.") from None
    except CheckpointError as err:  # every checkpoint is damaged
        raise ConfigError(f"{err}; pass --restart to start over.") from None


def _check_policy_count(cfg: Config, ckpt_root: str) -> None:
    """Refuse to resume an experiment with another number of policies, which would otherwise start
    afresh beside the checkpoints in other policies' folders without a word."""
    if not os.path.isdir(ckpt_root):
        return
    names = os.listdir(ckpt_root)
    folders = sorted(n for n in names if n.startswith("policy_") and os.path.isdir(os.path.join(ckpt_root, n)))
    single = any(n.startswith("checkpoint_") for n in names)
    trained = len(folders) if folders else (1 if single else None)
    if trained is not None and trained != cfg.num_policies:
        what = "1 policy" if trained == 1 else f"{trained} policies"
        raise ConfigError(f"The experiment {cfg.experiment_dir} trained {what}; pass --num_policies {trained} "
                          f"to resume it, or --restart to start over with {cfg.num_policies}.")


def shared_options(cfg: Config) -> dict:
    """The options every rank must share, for the learners to compare before they train together:
    all but each rank's planned layout."""
    own = set(planner.PLANNED) | {"torch_threads"}
    return {k: v for k, v in cfg.to_dict().items() if k not in own}


class Runner:
    """One run of one rank. learn=False swaps the learner for a sink that frees trajectories untouched,
    to measure sampling alone; `explicit`: the options the user set, which the planner keeps;
    `earlier`: what the run counted before its learner died, when this Runner restarts it."""

    def __init__(self, cfg: Config, learn: bool = True, explicit: Optional[set] = None,
                 earlier: Optional[Earlier] = None, rank: Rank = SOLO):
        self.learn, self.rank = learn, rank
        # Times count from the command's launch: a time to a score includes the start-up a user waits through.
        self.launched = launched_at()  # also the learners' (LearnerStart), for --lr_schedule linear
        self.earlier = earlier or Earlier()
        prepared = prepare_experiment(cfg, explicit or set(), rank)
        cfg, self.plan, self.spec, self.precision = prepared.cfg, prepared.plan, prepared.spec, prepared.precision
        self.obs_space, self.action_space, self.resume_paths = prepared.obs_space, prepared.action_space, prepared.paths
        self.origins, models, states = prepared.origins, prepared.models, prepared.states
        self.resume_path, state = self.resume_paths[0], states[0]  # policy 0's stands for the run
        # Only a plan made here may be corrected by this run's rate: a file's may be another machine's.
        self.plan_made_here = self.plan is not None and plan_file(cfg, resuming=state is not None) is None
        self.cfg = cfg
        if rank.main:
            os.makedirs(cfg.experiment_dir, exist_ok=True)
            save_config(cfg, os.path.join(cfg.experiment_dir, "config.json"), self.origins)
        if self.plan is not None and rank.main:
            planner.save(self.plan, cfg.experiment_dir)
            self.say(planner.describe(self.plan, self.spec.frameskip))
        if self.resume_path is not None and not self.earlier.learner_restarts:  # a restart says where itself
            self.say(f"resuming from {self.resume_path} ({int(state.get('env_frames', 0)):,} env frames)")
        self.device = resolve_device(cfg)
        if rank.distributed and self.device == "cuda":  # a GPU of its own for each rank, where there are enough
            self.device = f"cuda:{rank.local_rank % torch.cuda.device_count()}"
        self.versions0 = [int(s["version"]) if s else 0 for s in states]
        self.frames_offset = int(state.get("env_frames", 0)) if state else 0
        self.mp = start_process_server()  # torch.multiprocessing is imported: tensors pickle as shared memory
        self.adapt = cfg.adapt and "learner_threads" not in (explicit or set())
        self.adapter = ThreadAdapter(None, cfg.num_workers, usable_cores(), cfg.learner_threads or cfg.torch_threads)
        self.disk_need = disk_need(cfg, models)
        self.ctx = self._build_context(models)
        mark("shared context built")
        self.adapter.board = self.ctx.board
        self.processes: list = []
        self.child_pids: list = []  # every child ever started, replaced ones too
        self.spawned: collections.Counter = collections.Counter()  # name -> processes started under it
        self.error_queue = faster_fifo.Queue(max_size_bytes=1_000_000)
        self.returns100 = self.earlier.returns100
        self.objectives100 = self.earlier.objectives100
        # Each policy's own: what the status line and PBT judge them by.
        self.policy_returns100 = [collections.deque(maxlen=100) for _ in range(cfg.num_policies)]
        self.policy_objectives100 = [collections.deque(maxlen=100) for _ in range(cfg.num_policies)]
        self.population = PopulationDriver(cfg, self.ctx.hyper, self.say) if cfg.with_pbt and self.learn else None
        self.episodes = self.earlier.episodes
        self.learner_death: Optional[str] = None  # which learner died and why, when that ended this run
        self._said_errors: set = set()  # error sentences said, each once
        self._disk_checked_at = 0.0
        self.reached_reward_at: Optional[float] = None
        # The mean that crossed --stop_at_reward, which episodes ending during shutdown still move.
        self.reached_reward_mean: Optional[float] = None
        self.metrics: dict = {}
        self.policy_metrics: dict = {}  # policy -> its learner's latest statistics, policies 1 and up
        # (worker, policy) -> its forward's compile report, said once every rollout worker has reported.
        self.actor_compiles: dict = {}
        self.actor_compiles_said = False
        action_spec = ActionSpec.from_space(self.action_space)
        self.drift = DriftWatch(cfg.exploration_loss,
                                gaussian_dims=action_spec.action_dim if isinstance(action_spec, GaussianSpec) else 0,
                                lr_schedule=cfg.lr_schedule, target_kl=cfg.target_kl,
                                evaluating=cfg.eval_every_frames > 0)
        self.eval_queue = faster_fifo.Queue(max_size_bytes=100_000)
        self.eval_abandon = StopFlag()  # the evaluator's own stop: ctx.stop lets it finish the evaluation due
        self.evaluator: Optional[object] = None
        self.last_eval: Optional[dict] = None
        self.rollout_processes: dict = {}
        self.policy_processes: dict = {}
        self.learner_processes: dict = {}  # policy -> its learner
        self.training_since: Optional[float] = None
        self.first_batch_s: Optional[float] = None  # seconds from the command's launch to training_since
        self._window = (0.0, 0, 0.0)  # (seconds, env frames, samples trained) at the last report
        self._last_report = 0.0
        self._trained_marks: List[TrainedMark] = []
        self.compiled_at = 0.0  # when the last compile report (learner's or an actor's) came in
        self._stopped_at: Optional[TrainedMark] = None
        self._cpu_at_start = machine_load.sample()  # what the cores had done before this run
        self.supervisor = WorkerSupervisor(self, cfg.worker_timeout_seconds, cfg.max_worker_restarts)

    def _build_context(self, models: list) -> SharedContext:
        cfg = self.cfg
        action_spec = ActionSpec.from_space(self.action_space)
        buffers = TrajectoryBuffers(cfg.total_buffers, cfg.rollout, cfg.envs_per_split, obs_layout(self.obs_space),
                                    action_spec.action_dim, action_spec.dtype, models[0].rnn_state_size)
        params = [SharedParams(flat_state_size(model), self.device) for model in models]
        for p, model, version in zip(params, models, self.versions0):
            p.publish(flat_state(model), version)
        rows = ["runner"] + [learner_row(k) for k in range(cfg.num_policies)] \
            + [f"policy_{i}" for i in range(self._num_policy_workers())] \
            + [f"rollout_{i}" for i in range(cfg.num_workers)]
        free_queue = faster_fifo.Queue(max_size_bytes=1_000_000)
        free_queue.put_many(list(range(cfg.total_buffers)), block=False)  # empty and sized for them all
        return SharedContext(
            obs_space=self.obs_space, action_space=self.action_space, action_spec=action_spec,
            buffers=buffers, params=params, board=StatsBoard(rows), stop=StopFlag(),
            free_queue=free_queue,
            traj_queues=[faster_fifo.Queue(max_size_bytes=1_000_000) for _ in range(cfg.num_policies)],
            episode_queue=faster_fifo.Queue(max_size_bytes=5_000_000),
            metrics_queue=faster_fifo.Queue(max_size_bytes=1_000_000),
            request_queue=faster_fifo.Queue(max_size_bytes=1_000_000),
            response_queues=[faster_fifo.Queue(max_size_bytes=100_000) for _ in range(cfg.num_workers)],
            rnn_states=[torch.zeros(cfg.num_splits, cfg.envs_per_split, model.rnn_state_size).share_memory_()
                        for _ in range(cfg.num_workers)] if cfg.inference == "policy_worker" else [],
            inference_epoch=torch.zeros(1, dtype=torch.int64).share_memory_(),
            held_buffers=HeldBuffers(cfg.num_workers, cfg.num_splits),
            learner_threads=self.adapter.target,
            first_handed=torch.zeros(cfg.num_workers, dtype=torch.int8).share_memory_(),
            precision=self.precision,
            totals=RunTotals() if self.rank.distributed else None,
            hyper=SharedHyper(cfg.num_policies, pbt.HYPERPARAMETERS) if cfg.with_pbt else None,
        )

    def queues(self) -> dict:
        """Every queue of the run, by the name the lock watch gives it."""
        ctx = self.ctx
        trajectories = {("trajectory" if k == 0 else f"trajectory {k}"): q for k, q in enumerate(ctx.traj_queues)}
        return {"free-buffer": ctx.free_queue, **trajectories, "episode": ctx.episode_queue,
                "metrics": ctx.metrics_queue, "request": ctx.request_queue, "error": self.error_queue,
                "evaluation": self.eval_queue, **{f"response {i}": q for i, q in enumerate(ctx.response_queues)}}

    def _num_policy_workers(self) -> int:
        return self.cfg.num_policy_workers if self.cfg.inference == "policy_worker" else 0

    def say(self, text: str, incident: bool = False) -> None:
        """A line for the user. Rank 0 speaks for the run; another rank prints only an
        incident (a restarted worker), on stderr and named by its rank."""
        if not self.rank.distributed:
            print(f"fastrl: {text}", flush=True)
        elif self.rank.main:
            print(f"fastrl: {'rank 0: ' if incident else ''}{text}", flush=True)
        elif incident:
            print(f"fastrl: {self.rank.name()}: {text}", file=sys.stderr, flush=True)

    def _tag(self) -> str:
        """'fastrl: ' or, in a multi-rank run, 'fastrl: rank 1: ': how errors begin."""
        return f"fastrl: {self.rank.name()}: " if self.rank.distributed else "fastrl: "

    def _spawn(self, name: str, target, *args, threads: int = 0):
        seed = process_seed(self.cfg.seed, name, self.frames_offset, self.spawned[name], self.rank.rank)
        self.spawned[name] += 1
        p = self.mp.Process(target=run_child, name=name, daemon=False,
                            args=(name, threads or self.cfg.torch_threads, seed, self.error_queue, target, *args))
        p.start()
        self.processes.append(p)
        self.child_pids.append(p.pid)
        return p

    def start(self) -> None:
        cfg, ctx = self.cfg, self.ctx
        if self.learn:
            memory = compiled_costs.memory(cfg, self.precision.learning)
            for k in range(cfg.num_policies):
                start = LearnerStart(self.resume_paths[k], self.frames_offset, k, self.rank, shared_options(cfg),
                                     memory, self.launched)
                self.learner_processes[k] = self._spawn(learner_name(k), learner_main, cfg, ctx, self.device, start,
                                                        self.device_params(), threads=cfg.learner_threads)
        else:
            self._spawn("sink", sink_main, cfg, ctx)
        for i in range(self._num_policy_workers()):
            self.policy_processes[i] = self._spawn(f"policy-worker {i}", policy_worker_main, cfg, i, ctx, self.device,
                                                   self.device_params())
        for i in range(cfg.num_workers):
            self.rollout_processes[i] = self._spawn(f"rollout-worker {i}", rollout_worker_main, cfg, i, ctx)
        if cfg.eval_every_frames > 0 and self.learn and self.rank.main:
            self.evaluator = self._spawn("evaluator", evaluator_main, cfg, ctx, self.eval_queue, self.eval_abandon,
                                         self.frames_offset)
        mark("children spawned")

    def device_params(self) -> Optional[list]:
        """Each policy's weights on the GPU, for the children that compute there (None
        on a CPU run); the shared context carries only their host copy."""
        copies = [p.on_device for p in self.ctx.params]
        return None if copies[0] is None else copies

    def replace_rollout_worker(self, dead, index: int) -> None:
        self.processes.remove(dead)
        self.rollout_processes[index] = self._spawn(f"rollout-worker {index}", rollout_worker_main,
                                                    self.cfg, index, self.ctx)

    def replace_policy_workers(self) -> None:
        """Start a new policy worker in each slot; the old ones must be dead."""
        for i, dead in self.policy_processes.items():
            self.processes.remove(dead)
            self.policy_processes[i] = self._spawn(f"policy-worker {i}", policy_worker_main, self.cfg, i, self.ctx,
                                                   self.device, self.device_params())

    def stop_children(self, finish_evaluation: bool = False) -> list:
        """Ask everyone to stop, wait, then escalate; returns the names that had to be killed. With
        `finish_evaluation` the evaluator may first play the evaluation due. Every descendant is
        continued first: a SIGSTOPped child (chaos test, debugger) would heed neither the stop flag
        nor SIGTERM, and only SIGKILL, too late for the learner's final checkpoint, would reach it."""
        if not finish_evaluation:
            self.eval_abandon.set()
        self.ctx.stop.set()
        continue_descendants()
        # Only a learner that writes the final checkpoint gets the long wait: another rank's, stuck in a
        # collective with a dead rank, would hold this rank past torchrun's patience.
        saves = self.rank.main
        deadline = {p: time.time() + (LEARNER_JOIN_TIMEOUT_S if is_learner(p.name) and saves else JOIN_TIMEOUT_S)
                    for p in self.processes}
        for p in self.processes:
            if p is not self.evaluator:
                p.join(max(0.0, deadline[p] - time.time()))
        if self.evaluator is not None:
            self._wait_for_evaluator()
        killed = []
        for p in self.processes:
            if p.is_alive():
                p.terminate()  # SIGTERM: the child unwinds through its finally blocks and closes its envs
                p.join(3.0)
            if p.is_alive():
                p.kill()
                p.join(3.0)
                killed.append(p.name)
        if torch.device(self.device).type == "cuda":
            torch.cuda.ipc_collect()  # the device memory the children have let go of
            remove_driver_files(self.child_pids)  # their CUDA IPC files (fastrl.cuda.ipc); they are gone
        return killed

    def _wait_for_evaluator(self) -> None:
        """Let the evaluator finish its last evaluation (unless abandoned), then ask it to leave."""
        evaluator = self.evaluator
        evaluator.join(1.0)
        if evaluator.is_alive() and not self.eval_abandon.is_set():
            self.say(f"finishing the evaluation due (up to {EVAL_FINISH_TIMEOUT_S:.0f} s; Ctrl-C skips it)")
            evaluator.join(EVAL_FINISH_TIMEOUT_S)
        self.eval_abandon.set()
        evaluator.join(JOIN_TIMEOUT_S)

    def count(self, field: str) -> float:
        """A counter of this run (fastrl.plumbing.ranks.SUMMED): every rank's in a
        multi-rank run, as of its learner's latest agreement with the others."""
        return run_count(self.ctx.board, self.ctx.totals, field)

    def env_frames(self) -> int:
        """Env frames stepped in this run (every rank's), from its start."""
        return int(self.count("env_frames"))

    def _drain(self, start: float, monitor) -> None:
        """Take in what the children reported: episodes, learner metrics, evaluations."""
        while True:
            try:
                batches = self.ctx.episode_queue.get_many(block=False)
            except queue.Empty:
                break
            for batch in batches:
                for ret, _length, objective, policy in batch:
                    self.episodes += 1
                    if not math.isfinite(ret):  # a NaN reward's episode: counted, but no mean can take it
                        continue
                    self.returns100.append(ret)
                    self.policy_returns100[policy].append(ret)
                    if math.isfinite(objective):
                        self.objectives100.append(objective)
                        self.policy_objectives100[policy].append(objective)
        self.ctx.board.row("runner").set("episodes", self.episodes)
        if self.reached_reward_at is None and self.cfg.stop_at_reward is not None:
            # With several policies, the best one's: their episodes mixed would judge none of them.
            windows = [self.returns100] if self.cfg.num_policies == 1 else self.policy_returns100
            full = [sum(w) / len(w) for w in windows if len(w) == w.maxlen]
            if full and max(full) >= self.cfg.stop_at_reward:
                self.reached_reward_at = time.time() - start
                self.reached_reward_mean = max(full)
        try:
            for m in self.ctx.metrics_queue.get_many(block=False):
                if ACT_COMPILE_KEY in m:
                    self.compiled_at = time.time()
                    self._actor_compiled(m[ACT_COMPILE_KEY])
                    continue
                if m.get("policy", 0) != 0:
                    self.policy_metrics[m["policy"]] = m  # policy 0's stand for the run, as in a run of one
                    continue
                self.metrics.update(m)
                if ALLOCATOR_KEY in m:
                    self.say(f"the learner's caching allocator is off: {m[ALLOCATOR_KEY]}; it uses torch's own, "
                             "slower here (pass --learner_allocator system to skip the attempt)")
                if COMPILE_STARTED_KEY in m:
                    self.say(COMPILE_STARTED_LINES[m[COMPILE_STARTED_KEY]])
                if COMPILE_KEY in m:
                    self.compiled_at = time.time()
                    self.say(describe_compile(m[COMPILE_KEY]))
                    if self.rank.main:
                        self._remember_compile(m[COMPILE_KEY])
        except queue.Empty:
            pass
        try:
            evaluations = self.eval_queue.get_many(block=False)
        except queue.Empty:
            evaluations = []
        for ev in evaluations:
            self.last_eval = ev
            monitor.log(ev["env_frames"], time.time() - start, {k: v for k, v in ev.items() if k.startswith("eval/")})
            self.say(f"evaluation at {ev['env_frames']:,} frames (policy version {ev['version']}): "
                     f"return {ev['eval/return']:.2f} over {self.cfg.eval_episodes} deterministic episodes")
            if "warning" in ev:
                self.say(f"warning: {ev['warning']}")

    def _remember_compile(self, report: dict) -> None:
        """Keep the learner's compile judgement for the next run, unless other
        programs took the cores while it timed its steps."""
        foreign = machine_load.foreign_cores(self._cpu_at_start, machine_load.sample())
        if machine_load.disturbed(foreign, usable_cores()):
            self.say(f"the compile's timing is not kept for the next run: other programs took {foreign:.2f} of "
                     f"the {usable_cores()} cores while it was measured")
            return
        compiled_costs.remember(self.cfg, self.precision.learning, report)

    def _actor_compiled(self, report: dict) -> None:
        self.actor_compiles[report["worker"], report["policy"]] = report
        workers = {worker for worker, _ in self.actor_compiles}
        if not self.actor_compiles_said and workers >= set(range(self.cfg.num_workers)):
            self.actor_compiles_said = True
            self.say(describe_actor_compiles(self.actor_compile_reports()))

    def actor_compile_reports(self) -> list:
        """The rollout workers' compile reports so far, by worker and policy."""
        return [self.actor_compiles[k] for k in sorted(self.actor_compiles)]

    def mean_return(self) -> float:
        return sum(self.returns100) / len(self.returns100) if self.returns100 else float("nan")

    def _check_children(self) -> Optional[Failure]:
        """The failure that must end the run, or None. Rollout and policy workers
        killed by a signal or hung are restarted instead."""
        try:
            return _child_failure(*self.error_queue.get(block=False))
        except queue.Empty:
            pass
        for index, p in list(self.rollout_processes.items()):
            failure = self.supervisor.check(p, index)
            if failure:
                return Failure(f"rollout-worker {index}", failure, failure)
        failure = self.supervisor.check_policy_workers()
        if failure:
            return Failure("policy workers", failure, failure)
        hung = self.supervisor.check_learners()
        if hung:
            name, cause = hung
            return Failure(name, cause, f"{name} {cause}.")
        for p in self.processes:
            if not p.is_alive() and not self.supervisor.will_restart(p):
                time.sleep(0.2)  # its traceback may still be on its way
                try:
                    return _child_failure(*self.error_queue.get(block=False))
                except queue.Empty:
                    cause = exit_cause(p.exitcode)
                    return Failure(p.name, cause, f"{p.name} (pid {p.pid}) {cause} and left no traceback.")
        return None

    def restarts_left(self) -> int:
        return self.cfg.max_restarts - self.earlier.learner_restarts

    def _should_stop(self, elapsed: float) -> Optional[str]:
        """Why the run should end now, or None. Rank 0 decides for every rank (its learner carries the
        decision to theirs), on every rank's frames."""
        cfg = self.cfg
        if not self.rank.main:
            return None
        if cfg.train_for_env_frames and self.env_frames() + self.frames_offset >= cfg.train_for_env_frames:
            return f"reached {cfg.train_for_env_frames:,} env frames"
        if cfg.train_for_seconds and elapsed >= cfg.train_for_seconds:
            return f"trained for {cfg.train_for_seconds:g} s"
        if self.reached_reward_at is not None:
            return f"mean return of the last 100 episodes reached {cfg.stop_at_reward:g}"
        return None

    def startup_line(self) -> str:
        """What is being trained, how, and where it goes. Under torchrun the counts
        are per rank, and the figures for all ranks stand beside them."""
        cfg = self.cfg
        how = (f"inference {cfg.inference} on {self.device}, {self.precision.describe()}; "
               f"experiment in {cfg.experiment_dir}")
        if not self.rank.distributed:
            return f"training {cfg.env} with {cfg.num_workers} rollout workers x {cfg.num_envs_per_worker} envs, {how}"
        n = self.rank.world_size
        return (f"training {cfg.env} on {n} ranks, each with its own {cfg.num_workers} rollout workers x "
                f"{cfg.num_envs_per_worker} envs (rank 0's plan; every rank plans for its share of its machine) "
                f"and batches of {cfg.batch_size:,} samples: {n * cfg.batch_size:,} samples per gradient step in all; "
                f"{how}")

    def status_line(self, elapsed: float, window: tuple) -> str:
        t0, frames0, trained0 = window
        b = self.ctx.board
        frames, trained = self.env_frames(), self.count("samples_trained")
        fps = per_second(frames - frames0, elapsed - t0)
        lag = f"{b.get('learner', 'lag_min'):.0f}/{b.get('learner', 'lag_mean'):.1f}/{b.get('learner', 'lag_max'):.0f}"
        line = (f"[{elapsed:7.1f}s] frames {frames + self.frames_offset:,} | {fps:,.0f} fps (env frames/s)"
                f" | trained {per_second(trained - trained0, elapsed - t0):,.0f} samples/s | lag min/mean/max {lag}"
                f" | return(100) {self.mean_return():.2f} | episodes {int(self.count('episodes')):,}")
        if self.objectives100:
            line += f" | objective(100) {sum(self.objectives100) / len(self.objectives100):.2f}"
        if self.cfg.num_policies > 1:
            line += " | by policy " + " / ".join(_mean_text(q) for q in self.policy_objective_or_return())
        if self.metrics.get(BAD_BATCHES_KEY):
            line += f" | bad batches dropped {self.metrics[BAD_BATCHES_KEY]:,}"
        return line + self._progress(elapsed, fps)

    def policy_objective_or_return(self) -> list:
        """Each policy's last 100 true objectives where its env reports them, else its
        last 100 returns: what the policies are compared by."""
        return [o if o else r for o, r in zip(self.policy_objectives100, self.policy_returns100)]

    def policy_scalars(self) -> dict:
        """Each policy's own figures for TensorBoard and W&B, with several policies."""
        out = {}
        for k, (returns, objectives) in enumerate(zip(self.policy_returns100, self.policy_objectives100)):
            row = learner_row(k)
            if returns:
                out[f"policy_{k}/return_100"] = _mean(returns)
            if objectives:
                out[f"policy_{k}/objective_100"] = _mean(objectives)
            out[f"policy_{k}/learner_steps"] = self.ctx.board.get(row, "learner_steps")
            out[f"policy_{k}/samples_trained"] = self.ctx.board.get(row, "samples_trained")
            out[f"policy_{k}/lag_mean"] = self.ctx.board.get(row, "lag_mean")
            stats = self.metrics if k == 0 else self.policy_metrics.get(k, {})
            out.update({f"policy_{k}/{name}": stats[name] for name in POLICY_STATS if name in stats})
        return out

    def _progress(self, elapsed: float, fps: float) -> str:
        """' | [####......] 40% ETA 1m05s' toward the frame or time budget (whichever is
        nearer to done), or '' when training has no budget."""
        cfg, frames = self.cfg, self.env_frames() + self.frames_offset
        fractions = cfg.budget_done(frames, elapsed)
        if not fractions:
            return ""
        nearer = max(fractions, key=fractions.get)
        if nearer == "frames":
            eta = max(cfg.train_for_env_frames - frames, 0) / fps if fps > 0 else math.inf
        else:
            eta = max(cfg.train_for_seconds - elapsed, 0.0)
        done = min(fractions[nearer], 1.0)
        bar = "#" * int(10 * done) + "." * (10 - int(10 * done))
        eta_text = "?" if math.isinf(eta) else f"{int(eta // 60)}m{int(eta % 60):02d}s"
        return f" | [{bar}] {done:.0%} ETA {eta_text}"

    def run(self, observer=None) -> int:
        """Train until a stop condition, a failure or a signal; return the exit code. `observer(runner,
        elapsed_seconds)` is called at every poll (the bench takes its measurement windows there)."""
        cfg = self.cfg
        monitor = (Monitor(cfg, cfg.experiment_dir, resume_frames=self.frames_offset) if self.rank.main
                   else NullMonitor())
        start = self.launched
        exit_code, reason = 0, None
        signals = _StopSignals()
        locks = QueueLockWatch(self.queues(), lambda text: self.say(text, incident=True), cfg.worker_timeout_seconds)
        locks.start()
        try:
            self.start()
            self.say(self.startup_line())
            if self.origins and self.rank.main:
                self.say(f"options off their defaults, by source: {describe_origins(self.cfg, self.origins)}")
            signals.looping = True
            while True:
                signals.raise_if_received()
                time.sleep(POLL_S)
                outcome = self._poll(start, monitor, observer)
                if outcome:
                    exit_code, reason = outcome
                    break
        except (StopRequested, KeyboardInterrupt) as stop:
            signum = getattr(stop, "signum", signal.SIGINT)
            reason = f"stopped by {signal.Signals(signum).name}"
            exit_code = 128 + int(signum)
        except DiskFullError as err:  # TensorBoard's writes: the checkpoints' disk is full too
            exit_code, reason = self._say_disk_full(err, 0), "stopped, as the disk is full"
        finally:
            if self.training_since is not None:
                self._stopped_at = self._mark_now()  # the shutdown that follows trains nothing: not measured
            signals.during_shutdown(self.eval_abandon.set)  # Ctrl-C skips the last evaluation, nothing else
            killed = self.stop_children(finish_evaluation=reason is not None and exit_code == 0)
            exit_code = self._say_late_failures(exit_code)
            try:
                self._drain(start, monitor)
                if self.rank.main and math.isfinite(self.mean_return()):
                    # Episodes the last drain brought end the curve too: a short run may have had no report.
                    last = {"train/return_mean_100": self.mean_return(),
                            "train/episodes": float(self.count("episodes"))}
                    monitor.log(self.env_frames() + self.frames_offset, time.time() - start, last)
            except DiskFullError as err:
                exit_code = self._say_disk_full(err, exit_code)
            locks.stop()
            signals.restore()
            try:
                monitor.close(exit_code)
            except DiskFullError as err:
                exit_code = self._say_disk_full(err, exit_code)
        return self._finish(time.time() - start, reason, killed, exit_code)

    def _say_error_once(self, text: str) -> None:
        """`error: text.` on stderr, unless this run said it already (a full disk meets several writes)."""
        if text not in self._said_errors:
            self._said_errors.add(text)
            print(f"{self._tag()}error: {text}.", file=sys.stderr, flush=True)

    def _say_disk_full(self, err: DiskFullError, exit_code: int) -> int:
        """Say once that a write found the disk full; the run's exit code from here on (1 unless it had one)."""
        self._say_error_once(str(err))
        return exit_code or 1

    def _say_late_failures(self, exit_code: int) -> int:
        """What the children reported as they stopped: a learner's final checkpoint that could not be
        written is said, and fails a run that would have succeeded; a restart would not help it."""
        while True:
            try:
                name, tb, sentence = self.error_queue.get(block=False)
            except queue.Empty:
                return exit_code
            if sentence:
                self._say_error_once(f"{name}: {sentence}")
                exit_code = exit_code or 1
            elif is_learner(name):
                print(f"{self._tag()}{name} failed as it stopped:\n{tb.rstrip()}", file=sys.stderr, flush=True)
                exit_code = exit_code or 1

    def _poll(self, start: float, monitor, observer) -> Optional[tuple]:
        """One look at the run: take in what the children sent, check on them, report
        when a report is due. Returns (exit code, reason) when the run should end."""
        elapsed = time.time() - start
        if self.training_since is None and self.ctx.board.get("learner", "samples_trained") > 0:
            self._note_first_batch(start)  # before the messages the first batch brought
        self._drain(start, monitor)
        if self.ctx.totals is not None and self.ctx.totals.stop_requested():
            # Checked before the children: the learner leaves once the ranks agreed to stop.
            return 0, "the ranks agreed to stop (another rank's budget, goal, signal or failure)"
        if self.rank.main and time.time() - self._disk_checked_at >= DISK_CHECK_EVERY_S:
            self._disk_checked_at = time.time()
            short = disk_space.shortfall_now(self.cfg.experiment_dir, self.disk_need)
            if short:
                print(f"{self._tag()}error: {short}.", file=sys.stderr, flush=True)
                return 1, "stopped, as the disk is nearly full"
        failure = self._check_children()
        if failure:
            then = "stopping the run"
            if is_learner(failure.who) and failure.restartable:
                who = "the learner" if self.cfg.num_policies == 1 else failure.who
                self.learner_death = f"{who} {failure.cause}"
                if self.restarts_left() > 0:
                    then = "stopping the run to restart it from its newest good checkpoint"
                elif self.cfg.max_restarts:
                    then += f", as the {self.cfg.max_restarts} restarts --max_restarts allows are used up"
            print(f"{self._tag()}{failure.text.rstrip()}\n{self._tag()}{then}.", file=sys.stderr, flush=True)
            return 1, failure.text.splitlines()[0].rstrip(":.")
        if observer is not None:
            observer(self, elapsed)
        reason = self._should_stop(elapsed)
        if reason or elapsed - self._last_report >= self.cfg.status_every_seconds:
            self._report(elapsed, monitor)
        return (0, reason) if reason else None

    def _note_first_batch(self, start: float) -> None:
        """Note when training began, and say how long start-up took."""
        self.training_since = time.time()
        self.first_batch_s = self.training_since - start
        mark("first batch seen")
        self.say(f"first batch trained {self.first_batch_s:.1f} s after launch")

    def _report(self, elapsed: float, monitor) -> None:
        """The status line and its scalars, drift warnings (rank 0), and the thread
        adapter's turn, which judges the window since the last report (every rank)."""
        frames = self.env_frames() + self.frames_offset
        if self.population is not None:
            steps_per_policy = frames / self.spec.frameskip / self.cfg.num_policies
            events = self.population.update(steps_per_policy, [_mean(q) for q in self.policy_objective_or_return()])
            for e in events:  # a replaced policy is judged from here on by its new weights' episodes
                self.policy_returns100[e["policy"]].clear()
                self.policy_objectives100[e["policy"]].clear()
            monitor.log(frames, elapsed, self.population.scalars())
        if self.cfg.num_policies > 1 and self.rank.main:
            monitor.log(frames, elapsed, self.policy_scalars())
        if self.rank.main:
            line = self.status_line(elapsed, self._window)
            print(line, flush=True)
            monitor.log(frames, elapsed, scalars_from(
                board=self.ctx.board, metrics=self.metrics, returns=self.returns100, objectives=self.objectives100,
                episodes=self.count("episodes"), elapsed=elapsed, window=self._window,
                frames=self.env_frames(), trained=self.count("samples_trained")), status=line)
            # One policy's full 100-episode window: several policies' returns make no one curve.
            full_window = self.cfg.num_policies == 1 and len(self.returns100) == self.returns100.maxlen
            for warning in self.drift.check(self.metrics, self.returns100 if full_window else None):
                self.say(f"warning: {warning}")
        self._window = (elapsed, self.env_frames(), self.count("samples_trained"))
        self._last_report = elapsed
        if self.training_since is not None:
            self._trained_marks.append(self._mark_now())
            if len(self._trained_marks) > MAX_TRAINED_MARKS:  # a long run: every other one, half the resolution
                self._trained_marks = self._trained_marks[1::2]
        change = self.adapter.update(time.time()) if self.adapt and self.training_since else None
        if change:
            self.say(change)
            monitor.log(frames, elapsed, {"plan/learner_threads": float(self.adapter.threads)}, status=change)

    def _finish(self, wall: float, reason: str, killed: list, exit_code: int) -> int:
        """After the shutdown: summary.json and the closing lines (rank 0), and, but
        for a failed run, the rate it trained at for the next run's plan. Returns the
        run's exit code: 1 for a summary that the full disk kept from being written."""
        failed = 0 < exit_code < 128
        if self.rank.main:
            try:
                self.write_summary(wall)
            except DiskFullError as err:
                exit_code = self._say_disk_full(err, exit_code)
                # An earlier run's summary would pass for this run's.
                with contextlib.suppress(FileNotFoundError):
                    os.remove(os.path.join(self.cfg.experiment_dir, "summary.json"))
            self.say(f"{reason}; {self.env_frames() + self.frames_offset:,} env frames in {wall:.1f} s"
                     f" ({per_second(self.env_frames(), wall):,.0f} fps), mean return(100) {self.mean_return():.2f}")
            trained = self.steady_trained_steps_per_s()
            if self.plan is not None and trained:
                # The status line sums every rank; the plan, and this rate, are rank 0's own.
                whose = "rank 0: " if self.rank.distributed else ""
                self.say(whose + planner.measured_next_to_predicted(self.plan, trained, self.spec.frameskip))
                if self.plan_made_here and not failed:
                    self.say(self._remember_layout(trained))
            digests = self.metrics.get(WEIGHTS_KEY)
            if digests and len(set(digests)) > 1:
                print(f"{self._tag()}error: the ranks ended with different weights ({', '.join(digests)}); "
                      "please report this as a fastrl bug.", file=sys.stderr, flush=True)
        if killed:
            print(f"{self._tag()}had to kill {', '.join(killed)} after they ignored the stop request.", file=sys.stderr)
        return exit_code

    def _mark_now(self) -> TrainedMark:
        return TrainedMark(time.time(), self.ctx.board.total("samples_trained", "learner"), machine_load.sample())

    def steady_window(self) -> List[TrainedMark]:
        """The marks of the training's second half so far, from the last one before its midpoint to now:
        the steady state the plan predicts, past the ramp (compiles, first batches) of the first half."""
        now = self._stopped_at or self._mark_now()
        opening = TrainedMark(self.training_since, 0.0, None)
        marks = self._trained_marks
        half = self.training_since + (now.at - self.training_since) / 2
        before = [i for i, m in enumerate(marks) if m.at <= half]
        if before:
            opening, marks = marks[before[-1]], marks[before[-1] + 1:]
        return [opening, *marks, now]

    def steady_trained_steps_per_s(self) -> float:
        """Agent steps trained per second over the steady window, by this rank."""
        if self.training_since is None:
            return 0.0
        window = self.steady_window()
        return per_second(window[-1].trained - window[0].trained, window[-1].at - window[0].at)

    def _remember_layout(self, trained: float) -> str:
        """Keep this run's trained rate against the model's prediction for the next
        plan, if the run measured its layout; the closing line's words on it."""
        window = self.steady_window()
        foreign = machine_load.foreign_cores(window[0].cpu, window[-1].cpu)
        seconds, samples = window[-1].at - window[0].at, window[-1].trained - window[0].trained
        run = layout_memory.RunWindow(
            seconds=seconds, foreign_cores=foreign, cores=usable_cores(),
            step_s=seconds * self.cfg.batch_size / samples if samples > 0 else math.inf,
            longest_stall_s=longest_stall(window),
            restarts=int(self.supervisor.total_restarts + self.count("env_restarts") + self.earlier.learner_restarts),
            policies=self.cfg.num_policies, compiling=self.compiled_at > window[0].at)
        why = layout_memory.why_not_a_measure(run)
        if why:
            return f"this rate is not kept for the next plan: {why}"
        p = self.plan.predicted
        layout_memory.remember(self.cfg, self.precision, self.plan.inference,
                               p.get("model_trained_steps_per_s", p["trained_steps_per_s"]), trained)
        return "this rate is kept for the next plan of this setup"

    def measured_trained_steps_per_s(self) -> float:
        """Agent steps trained per second since training began (start-up excluded), by
        this rank: the plan it is compared with is this rank's."""
        if self.training_since is None:
            return 0.0
        # Every policy's learner (rows 'learner', 'learner_1', ...) of this rank.
        return per_second(self.ctx.board.total("samples_trained", "learner"), time.time() - self.training_since)

    def write_summary(self, wall: float) -> None:
        summary = {
            "env": self.cfg.env,
            "env_frames": self.env_frames() + self.frames_offset,
            "env_frames_this_run": self.env_frames(),
            "wall_seconds": wall,
            "fps": per_second(self.env_frames(), wall),
            "mean_return_100": self.mean_return() if self.returns100 else None,
            "mean_objective_100": sum(self.objectives100) / len(self.objectives100) if self.objectives100 else None,
            "episodes": int(self.count("episodes")),
            "reached_reward_at_seconds": self.reached_reward_at,
            "reached_reward_mean_100": self.reached_reward_mean,
            "first_batch_s": self.first_batch_s,
            "samples_trained": self.count("samples_trained"),
            "samples_dropped": self.count("samples_dropped"),
            "learner_steps": self.ctx.board.get("learner", "learner_steps"),
            "env_restarts": self.earlier.env_restarts + self.count("env_restarts"),
            "trajectories_discarded": self.earlier.trajectories_discarded + self.count("trajectories_discarded"),
            "last_eval": self.last_eval,
            "plan": dataclasses.asdict(self.plan) if self.plan else None,
            "measured_trained_frames_per_s": self.measured_trained_steps_per_s() * self.spec.frameskip,
            "steady_trained_frames_per_s": self.steady_trained_steps_per_s() * self.spec.frameskip,
            "nonfinite_skips": self.ctx.board.get("learner", "nonfinite_skips"),
            "bad_batches_dropped": self.metrics.get(BAD_BATCHES_KEY, 0),
            "kl_stops": self.ctx.board.get("learner", "kl_stops"),
            "gradient_steps": self.ctx.board.get("learner", "gradient_steps"),
            "worker_restarts": self.earlier.worker_restarts + self.supervisor.total_restarts,
            "learner_restarts": self.earlier.learner_restarts,
            COMPILE_KEY: self.metrics.get(COMPILE_KEY),
            ACT_COMPILE_KEY: self.actor_compile_reports() or None,
        }
        if self.cfg.num_policies > 1:
            summary["policies"] = [
                {"policy": k, "mean_return_100": _mean(r), "mean_objective_100": _mean(o),
                 "learner_steps": self.ctx.board.get(learner_row(k), "learner_steps"),
                 "samples_trained": self.ctx.board.get(learner_row(k), "samples_trained"),
                 "hyperparameters": self.population.population.hyper[k] if self.population else None}
                for k, (r, o) in enumerate(zip(self.policy_returns100, self.policy_objectives100))]
        if self.rank.distributed:
            summary["ranks"] = {
                "world_size": self.rank.world_size,
                # Seconds rank 0's learner spent in collectives, waiting for slower ranks included.
                "learner_sync_seconds": self.ctx.board.get("learner", "sync_s"),
                WEIGHTS_KEY: self.metrics.get(WEIGHTS_KEY),
            }
        # Strict JSON: a NaN or inf (say a rate over no time) is written as null.
        write_json(os.path.join(self.cfg.experiment_dir, "summary.json"), _finite_or_null(summary), indent=2,
                   allow_nan=False)

    def carry(self) -> Earlier:
        """What this run counted, for the Runner that restarts it after its learner died."""
        return Earlier(
            learner_restarts=self.earlier.learner_restarts + 1, death=self.learner_death,
            worker_restarts=self.earlier.worker_restarts + self.supervisor.total_restarts,
            env_restarts=self.earlier.env_restarts + self.count("env_restarts"),
            trajectories_discarded=self.earlier.trajectories_discarded + self.count("trajectories_discarded"),
            episodes=self.episodes, returns100=self.returns100, objectives100=self.objectives100)


def _mean(values) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _finite_or_null(value):
    """`value` (JSON data) with every NaN and inf float in it replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def _mean_text(values) -> str:
    return f"{sum(values) / len(values):.2f}" if values else "-"


def train(cfg: Config, explicit: set, rank: Rank = SOLO) -> int:
    """Train as `python -m fastrl.train` does and return its exit code. With --max_restarts, a run
    whose learner died starts again, every process anew, from the newest good checkpoint: the workers'
    buffers and the published weights are newer than the restored learner, so only a whole restart is
    consistent. Under torchrun, where ranks step in lockstep, torchrun's own --max_restarts does it.
    The experiment's lock (runtime/experiment_lock.py) is held throughout, restarts included."""
    with experiment_locked(cfg.experiment_dir, hold=rank.main):
        if rank.distributed:
            return Runner(cfg, explicit=explicit, rank=rank).run()
        return _train_restarting(cfg, explicit)


def _train_restarting(cfg: Config, explicit: set) -> int:
    """train() on one machine: a new Runner each time --max_restarts restarts the run."""
    earlier = Earlier()
    while True:
        runner = _restarted_runner(cfg, explicit, earlier)
        if runner is None:
            return 130
        code = runner.run()
        if runner.learner_death is None or runner.restarts_left() <= 0:
            return code
        earlier = runner.carry()
        # The dead run's shared memory (buffers, queues) is freed only once its
        # objects are, and the Runner and its supervisor point at each other.
        del runner
        gc.collect()
        cfg = dataclasses.replace(cfg, restart=False)  # --restart would delete the checkpoint to restart from


def _restarted_runner(cfg: Config, explicit: set, earlier: Earlier) -> Optional[Runner]:
    """A Runner for the first run, or for a restart (then saying from where), or None
    when Ctrl-C came while a restart was being prepared."""
    if not earlier.learner_restarts:
        return Runner(cfg, explicit=explicit)
    try:
        runner = Runner(cfg, explicit=explicit, earlier=earlier)
    except KeyboardInterrupt:
        print("fastrl: interrupted while restarting the run; its checkpoints are kept.", file=sys.stderr)
        return None
    if runner.resume_path is None:
        where = "the start, as the learner died before it wrote a checkpoint"
    elif cfg.num_policies == 1:
        where = f"checkpoint {runner.resume_path} (frames {runner.frames_offset:,})"
    else:
        where = f"each policy's newest checkpoint (policy 0's: {runner.resume_path}, frames {runner.frames_offset:,})"
    print(f"fastrl: {earlier.death}; restarted the run from {where}, restart {earlier.learner_restarts} "
          f"of {cfg.max_restarts} (--max_restarts).", flush=True)
    return runner
