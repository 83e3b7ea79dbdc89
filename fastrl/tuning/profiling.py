"""What this machine can do: env stepping, the model's forward and learner costs, the compute-bound
limit, and the planner's Costs, profiled at start-up and cached per machine and setup. Every cost
the planner adds up is in core-seconds per sample (threads x wall seconds)."""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import math
import multiprocessing
import os
import platform
import queue
import statistics
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, NamedTuple, Optional, Sequence

import gymnasium as gym
import psutil
import torch

import fastrl
from fastrl import envs
from fastrl.algo.distributions import random_allowed_action
from fastrl.algo.model import Precision, build_model, obs_zeros, resolve_device
from fastrl.config import env_options
from fastrl.envs.registry import get_spec
from fastrl.learning.adam import FusedAdam
from fastrl.learning.learner import gradient_step
from fastrl.plumbing import machine_load
from fastrl.plumbing.caching_allocator import learner_memory
from fastrl.plumbing.files import user_cache, write_json
from fastrl.plumbing.proc import on_one_core, pin_to_core, run_child, usable_cores
from fastrl.plumbing.seeding import env_seed
from fastrl.sampling.env_split import make_match_agents
from fastrl.tuning.planner import Costs

ENV_START_TIMEOUT_S = 300.0  # creating many ViZDoom games can take minutes on a busy machine
ENV_FINISH_SLACK_S = 60.0  # one round of stepping every env may overrun the window
JOIN_TIMEOUT_S = 10.0
POLL_S = 0.1
WARMUP_CALLS = 2  # untimed calls before each model measurement: first calls allocate
MIN_ROUNDS = 3


class ProfilingError(RuntimeError):
    """A measurement failed; the message names the process and carries its traceback."""


Progress = Optional[Callable[[float], None]]


@dataclass
class EnvProfile:
    """Raw env stepping in `num_procs` processes of `envs_per_proc` envs. Rates are totals over the
    processes; seconds_per_step is core-seconds a step: the cores in use over steps_per_s, which
    corrects for time-sharing when the processes outnumber the cores."""
    env: str
    num_procs: int
    envs_per_proc: int
    frameskip: int
    window_s: float
    steps_per_s: float
    frames_per_s: float
    seconds_per_step: float
    seconds_per_frame: float

    def to_dict(self) -> dict:
        return asdict(self)


def mean_env_profile(profiles: Sequence[EnvProfile]) -> EnvProfile:
    """One profile from several of the same layout: the mean core-seconds per step and its rates."""
    first = profiles[0]
    cores_used = first.seconds_per_step * first.steps_per_s
    seconds_per_step = statistics.fmean(p.seconds_per_step for p in profiles)
    steps_per_s = cores_used / seconds_per_step
    return replace(
        first, window_s=sum(p.window_s for p in profiles), steps_per_s=steps_per_s,
        frames_per_s=steps_per_s * first.frameskip, seconds_per_step=seconds_per_step,
        seconds_per_frame=seconds_per_step / first.frameskip)


def _step_envs_child(index: int, cfg, warmup: float, seconds: float, ready, go, results) -> None:
    """One measuring process: make the envs, wait for the common start, warm up, count steps."""
    if cfg.pin_workers:
        pin_to_core(index)  # as the rollout worker it stands for
    spec = get_spec(cfg.env)
    envs = []
    agents = cfg.agents_per_game
    count = max(agents, cfg.num_envs_per_worker // agents * agents)  # whole games
    seeds = [env_seed(cfg.seed, index * count + i) for i in range(count)]
    try:
        if agents > 1:  # each agent an env stepped in two halves, as a rollout worker has them
            envs = make_match_agents(spec, env_options(cfg), seeds, agents, agents)
        else:
            for seed in seeds:
                envs.append(spec.make(seed=seed, **env_options(cfg)))
        last_obs = []  # each env's, for the actions its action mask allows
        for env, seed in zip(envs, seeds):
            last_obs.append(env.reset(seed=seed)[0])
            env.action_space.seed(seed)
        ready.put(index)
        go.wait()

        def step_all() -> None:
            if agents > 1:
                for env in envs:
                    env.step_send(env.action_space.sample())
            for i, env in enumerate(envs):
                if agents > 1:
                    _, _, terminated, truncated, _ = env.step_receive()
                else:
                    last_obs[i], _, terminated, truncated, _ = env.step(
                        random_allowed_action(env.action_space, last_obs[i]))
                if terminated or truncated:
                    last_obs[i] = env.reset()[0]

        end = time.perf_counter() + warmup
        while time.perf_counter() < end:
            step_all()
        steps, start = 0, time.perf_counter()
        end = start + seconds
        while time.perf_counter() < end:
            step_all()
            steps += len(envs)
        results.put((index, steps, time.perf_counter() - start))
    finally:
        for env in envs:
            try:
                env.close()
            except Exception:
                pass  # closing the others matters more than this one's complaint


def measure_env(cfg, num_procs: int, seconds: float, warmup: float, progress: Progress = None) -> EnvProfile:
    """Env stepping of cfg's envs in `num_procs` spawned processes, random actions, no model; all
    start together once every env exists. Raises ProfilingError with a failed child's traceback."""
    spec = get_spec(cfg.env)
    # Not the runner's forkserver: starting it imports torch beside the measurement, on its cores.
    mp = multiprocessing.get_context("spawn")
    ready, results, errors, go = mp.Queue(), mp.Queue(), mp.Queue(), mp.Event()
    procs = [mp.Process(target=run_child, name=f"env-bench {i}",
                        args=(f"env-bench {i}", 1, None, errors, _step_envs_child,
                              i, cfg, warmup, seconds, ready, go, results))
             for i in range(num_procs)]
    for p in procs:
        p.start()
    try:
        _collect(procs, ready, errors, num_procs, ENV_START_TIMEOUT_S, "create its envs")
        go.set()
        start = time.time()
        report = (lambda: progress(time.time() - start)) if progress else None
        done = _collect(procs, results, errors, num_procs, warmup + seconds + ENV_FINISH_SLACK_S, "finish stepping",
                        report)
    finally:
        _stop(procs)
    steps_per_s = sum(steps / elapsed for _, steps, elapsed in done)
    seconds_per_step = min(num_procs, usable_cores()) / steps_per_s
    return EnvProfile(
        env=cfg.env, num_procs=num_procs, envs_per_proc=cfg.num_envs_per_worker, frameskip=spec.frameskip,
        window_s=sum(elapsed for _, _, elapsed in done) / len(done),
        steps_per_s=steps_per_s, frames_per_s=steps_per_s * spec.frameskip,
        seconds_per_step=seconds_per_step, seconds_per_frame=seconds_per_step / spec.frameskip)


def _collect(procs, source, errors, count: int, timeout: float, what: str, tick=None) -> list:
    """`count` messages from `source`, failing fast on a child's error or death."""
    got, deadline = [], time.time() + timeout
    while len(got) < count:
        try:
            name, tb = errors.get_nowait()
            raise ProfilingError(f"{name} failed while measuring env stepping:\n{tb}")
        except queue.Empty:
            pass
        try:
            got.append(source.get(timeout=POLL_S))
            continue
        except queue.Empty:
            pass
        if tick:
            tick()
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead:
            time.sleep(0.5)  # give its traceback time to arrive, then report it
            try:
                name, tb = errors.get_nowait()
            except queue.Empty:
                name, tb = dead[0].name, f"exit code {dead[0].exitcode}, no traceback"
            raise ProfilingError(f"{name} failed while measuring env stepping:\n{tb}")
        if time.time() > deadline:
            raise ProfilingError(f"an env-bench process did not {what} within {timeout:.0f} s; "
                               "check that the env can be created and stepped on its own.")
    return got


def _stop(procs) -> None:
    for p in procs:
        p.join(JOIN_TIMEOUT_S)
    for p in procs:
        if p.is_alive():
            p.terminate()  # SIGTERM unwinds the child through its finally: envs (and games) close
            p.join(JOIN_TIMEOUT_S)
        if p.is_alive():
            p.kill()
            p.join()


@dataclass
class ModelProfile:
    """The model's wall seconds per sample on this machine: forward_s_per_sample[threads][batch] of an
    inference forward, train_s_per_sample[threads] of a learner gradient step (loss, backward, Adam)
    on `train_minibatch` samples; each sample takes `ppo_epochs` such steps."""
    device: str
    threads: list
    forward_batch_sizes: list
    forward_s_per_sample: dict
    train_minibatch: int
    ppo_epochs: int
    train_s_per_sample: dict
    capped: bool = False  # its wall-clock cap cut the timing short (time_interleaved)

    def forward_core_s(self, batch: int) -> float:
        """Core-seconds per sample of a forward at `batch`, at the most core-efficient thread count."""
        return min(t * per[batch] for t, per in self.forward_s_per_sample.items())

    def learner_core_s(self) -> float:
        """Core-seconds the learner spends per sample it trains on (all its epochs)."""
        return self.ppo_epochs * min(t * s for t, s in self.train_s_per_sample.items())

    def to_dict(self) -> dict:
        """JSON-ready: thread counts and batch sizes become string keys, with samples/s."""
        return {
            "device": self.device,
            "ppo_epochs": self.ppo_epochs,
            "forward": {str(t): {str(b): {"s_per_sample": s, "samples_per_s": 1.0 / s} for b, s in per.items()}
                        for t, per in self.forward_s_per_sample.items()},
            "train": {str(t): {"minibatch": self.train_minibatch, "s_per_sample": s, "samples_per_s": 1.0 / s}
                      for t, s in self.train_s_per_sample.items()},
        }


def mean_model_profile(profiles: Sequence[ModelProfile]) -> ModelProfile:
    """One profile from several of the same model and thread counts: each per-sample time's mean."""
    first = profiles[0]
    forward = {t: {b: statistics.fmean(p.forward_s_per_sample[t][b] for p in profiles) for b in per}
               for t, per in first.forward_s_per_sample.items()}
    train = {t: statistics.fmean(p.train_s_per_sample[t] for p in profiles) for t in first.train_s_per_sample}
    return replace(first, forward_s_per_sample=forward, train_s_per_sample=train)


def _fake_obs(model, obs_space, lead: tuple, gen: torch.Generator) -> dict:
    """Random observations {key: [*lead, *shape]} in the trainer's buffer layout and dtypes."""
    obs = {}
    for key, (shape, dtype) in model.layout.items():
        size = (*lead, *shape)
        if dtype == torch.uint8:
            values = torch.randint(0, 256, size, dtype=torch.uint8, generator=gen)
        elif dtype == torch.int64:  # a Discrete observation: stay inside its values
            space = obs_space[key] if isinstance(obs_space, gym.spaces.Dict) else obs_space
            values = torch.randint(int(space.start), int(space.start + space.n), size, generator=gen)
        else:
            values = torch.randn(size, generator=gen)
        obs[key] = obs_zeros(lead, shape, dtype).copy_(values)
    return obs


def _fake_minibatch(cfg, model, obs_space, gen: torch.Generator) -> dict:
    """A learner minibatch of the real shapes, with the actions and log-probs the model gives its obs."""
    T, B = cfg.rollout, cfg.batch_size // cfg.rollout // cfg.num_minibatches
    obs = _fake_obs(model, obs_space, (T + 1, B), gen)
    with torch.no_grad():
        out = model.act({k: v[:-1].flatten(0, 1) for k, v in obs.items()}, torch.zeros(T * B, model.rnn_state_size))
    return {
        "obs": obs,
        "rnn_state0": torch.zeros(B, model.rnn_state_size),
        "episode_start": torch.rand(T + 1, B, generator=gen) < 0.02,
        "actions": out.actions.view(T, B, -1),
        "behaviour_logp": out.logp.view(T, B),
        "behaviour_value": out.values.view(T, B),
        "rewards": torch.randn(T, B, generator=gen),
        "terminated": (torch.rand(T, B, generator=gen) < 0.01),
        # No truncations: the extra forward on the few truncated observations is negligible.
        "truncated": torch.zeros(T, B, dtype=torch.bool),
        "final_obs": {k: v[:0, 0] for k, v in obs.items()},
        "final_row": torch.full((T, B), -1, dtype=torch.long),
        "valid": torch.ones(T, B),
    }


class Timed(NamedTuple):
    """time_interleaved's median seconds a call per key, and whether its wall-clock cap cut it short."""
    per_call: dict
    capped: bool


def time_interleaved(calls: dict, seconds: float, min_rounds: int = MIN_ROUNDS, clock=time.perf_counter,
                     tick=None, cap_s: float = math.inf, wall=time.perf_counter) -> Timed:
    """Median seconds (on `clock`) a call of each of `calls` ({key: (threads, fn)}; the caller restores
    torch's threads): WARMUP_CALLS untimed, then a call a round for `seconds` and `min_rounds`, so a slow
    second slows every key alike and the median drops it, where key by key it would skew the planner's
    ratios. Past `cap_s` wall seconds only a key's first timed call starts, so every key has a number."""
    wall_start = wall()

    def past_cap() -> bool:
        return wall() - wall_start >= cap_s

    cut = False
    for threads, fn in calls.values():
        torch.set_num_threads(threads)
        for _ in range(WARMUP_CALLS):
            if past_cap():
                cut = True
                break
            fn()
    times = {key: [] for key in calls}
    start = clock()
    while True:
        for key, (threads, fn) in calls.items():
            if times[key] and past_cap():
                return Timed({key: statistics.median(ts) for key, ts in times.items()}, True)
            torch.set_num_threads(threads)
            t0 = clock()
            fn()
            times[key].append(clock() - t0)
        elapsed = clock() - start
        if tick:
            tick(elapsed)
        if elapsed >= seconds and len(times[next(iter(times))]) >= min_rounds:
            return Timed({key: statistics.median(ts) for key, ts in times.items()}, cut)


class ModelBench:
    """The model of `cfg` on random data, ready to time: a learner, its optimizer and a minibatch, and
    an actor copy with an input per batch size; seeded, so precisions time the same weights and data."""

    def __init__(self, cfg, obs_space, action_space, batch_sizes: Sequence[int], precision: Precision,
                 device: str = "cpu"):
        dev = torch.device(device)
        self.cfg = cfg
        self._sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        gen = torch.Generator().manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.learner = build_model(cfg, obs_space, action_space, precision.learning)
        minibatch = _fake_minibatch(cfg, self.learner, obs_space, gen)
        self.learner.to(dev)
        self.optimizer = FusedAdam(self.learner.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.minibatch = {k: ({kk: vv.to(dev) for kk, vv in v.items()} if isinstance(v, dict) else v.to(dev))
                          for k, v in minibatch.items()}
        # Forwards on their own copy, as an actor's: after each training step the learner's would
        # re-derive its cached bf16 weights, which an actor does once an update, not once a forward.
        self.actor = build_model(cfg, obs_space, action_space, precision.acting).to(dev)
        self.actor.load_state_dict(self.learner.state_dict())
        self.actor.eval()
        self.inputs = {b: ({k: v.to(dev) for k, v in _fake_obs(self.learner, obs_space, (b,), gen).items()},
                           torch.zeros(b, self.learner.rnn_state_size, device=dev)) for b in batch_sizes}
        self.learner.train()

    def forward_call(self, batch: int) -> Callable[[], None]:
        """One inference forward of the actor at `batch` samples."""
        obs, rnn = self.inputs[batch]

        def call():
            with torch.no_grad():
                self.actor.act(obs, rnn)
            self._sync()
        return call

    def train(self) -> None:
        """One learner gradient step, without the loss statistics most steps skip."""
        gradient_step(self.cfg, self.learner, self.optimizer, self.minibatch, self.minibatch["valid"], stats=False)
        self._sync()


def model_calls(cfg, obs_space, action_space, batch_sizes: Sequence[int], precision: Precision,
                device: str = "cpu") -> tuple:
    """({batch: an inference forward}, a learner gradient step, the samples it trains on)."""
    bench = ModelBench(cfg, obs_space, action_space, batch_sizes, precision, device)
    return ({b: bench.forward_call(b) for b in batch_sizes}, bench.train,
            bench.minibatch["rewards"].numel())


class Budget(NamedTuple):
    """How long a measurement times for, the wall seconds it may take whatever the
    load, and what it reports its progress to."""
    seconds: float
    cap_s: float = math.inf
    progress: Progress = None


def measure_model(cfg, obs_space, action_space, batch_sizes: Sequence[int], threads: Sequence[int],
                  budget: Budget, device: str = "cpu", forward_threads: Optional[Sequence[int]] = None, *,
                  precision: Precision) -> ModelProfile:
    """Time the model of `cfg` on random data: forwards at `batch_sizes` on `forward_threads` (default
    `threads`) and a learner step on `threads`, interleaved within the `budget`."""
    seconds, cap_s, progress = budget
    with learner_memory(cfg.learner_allocator, device):
        forwards, train, samples = model_calls(cfg, obs_space, action_space, batch_sizes, precision, device)
        forward_threads = list(threads if forward_threads is None else forward_threads)
        calls = {("forward", t, b): (t, fn) for t in forward_threads for b, fn in forwards.items()}
        calls.update({("train", t, None): (t, train) for t in threads})
        previous = torch.get_num_threads()
        try:
            timed = time_interleaved(calls, seconds, tick=(lambda e: progress(min(seconds, e))) if progress else None,
                                     cap_s=cap_s)
        finally:
            torch.set_num_threads(previous)
    per_call = timed.per_call
    forward_s = {t: {b: per_call[("forward", t, b)] / b for b in forwards} for t in forward_threads}
    train_s = {t: per_call[("train", t, None)] / samples for t in threads}
    return ModelProfile(device=str(torch.device(device)), threads=list(threads), forward_batch_sizes=list(batch_sizes),
                        forward_s_per_sample=forward_s, train_minibatch=samples,
                        ppo_epochs=cfg.ppo_epochs, train_s_per_sample=train_s, capped=timed.capped)


def compute_bound_limit(env: EnvProfile, model: ModelProfile, forward_batch: int, cores: int) -> dict:
    """The agent steps/s `cores` cores could sustain if every core only computed, C / (env + forward +
    learn) in core-seconds: an upper bound on a CPU, too low where a GPU runs the model beside them."""
    per_step = {"env": env.seconds_per_step, "forward": model.forward_core_s(forward_batch),
                "learn": model.learner_core_s()}
    steps_per_s = cores / sum(per_step.values())
    return {"cores": cores, "forward_batch": forward_batch, "core_s_per_step": per_step,
            "steps_per_s": steps_per_s, "frames_per_s": steps_per_s * env.frameskip}


# The vector extensions that decide which precision and kernels are fastest, best first.
VECTOR_EXTENSIONS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's name, with x86's family, model and best vector extension: one brand name covers
    generations with and without bf16, and measurements cached under the name must not cross."""
    fields: dict = {}
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())  # the first processor's, on x86
    except OSError:
        pass
    name = next((fields[k] for k in ("model name", "Hardware", "Model") if fields.get(k)), None)
    if name is None:
        return platform.processor() or platform.machine() or "unknown"
    if "cpu family" in fields:
        flags = set(fields.get("flags", "").split())
        best = next((e for e in VECTOR_EXTENSIONS if e in flags), "no avx2")
        name += f" (family {fields['cpu family']} model {fields.get('model', '?')}, {best})"
    return name


def machine_info() -> dict:
    """What a measurement belongs to: CPU, cores, memory, GPU, and torch, Python and OS versions."""
    info = {
        "cpu": cpu_model(),
        "logical_cores": os.cpu_count() or 1,
        "usable_cores": usable_cores(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    physical = psutil.cpu_count(logical=False)
    if physical:
        info["physical_cores"] = physical
    return info


FORWARD_BATCHES = (4, 8, 16, 32, 64, 128)
# A GPU policy worker batches every worker's half split: tens to a thousand rows.
DEVICE_FORWARD_BATCHES = (16, 64, 256, 1024)
# What a rollout worker adds to a bare env step: action conversion, shared-memory writes, bookkeeping.
WORKER_OVERHEAD_S = 4e-6
# Trajectories the learner's step is timed on at most: a full Doom minibatch takes about a second, and
# a smaller step understates bf16's gain. --precision auto times as many, for the profile to reuse.
PROFILE_TRAJECTORIES = 8
ENV_CHUNKS = 4  # timed slices of the env profile, of which the median counts
MIN_STEPS_PER_CHUNK = 10


def timed_trajectories(cfg) -> int:
    """Trajectories a CPU learner step is timed on: the run's own minibatch, up to PROFILE_TRAJECTORIES.
    A step's fixed cost (Adam over every weight, autograd's bookkeeping) outweighs a small MLP's work
    per sample, so a step on 64 samples costs several times more per sample than one on 256."""
    return max(1, min(PROFILE_TRAJECTORIES, cfg.batch_size // cfg.rollout // cfg.num_minibatches))


def learner_timing_cfg(cfg):
    """`cfg` with one minibatch of timed_trajectories(cfg), the learner step a CPU profile times."""
    return replace(cfg, batch_size=cfg.rollout * timed_trajectories(cfg), num_minibatches=1)


def time_env_steps(env, seconds: float, chunks: int = ENV_CHUNKS, clock=time.perf_counter) -> float:
    """Core-seconds per agent step of `env`: the median over `chunks` slices of `seconds`, after an
    untimed one for a fresh game to settle. An env that raises is timed on the steps it took: its
    failures are the rollout workers' to handle, with a clearer message than a traceback here."""
    slice_s = seconds / (chunks + 1)
    per_step, steps, start = [], 0, clock()  # per_step[0] is the settling slice
    try:
        obs, _ = env.reset()
        while len(per_step) <= chunks:
            obs, _, terminated, truncated, _ = env.step(random_allowed_action(env.action_space, obs))
            steps += 1
            if terminated or truncated:
                obs, _ = env.reset()
            elapsed = clock() - start
            if elapsed >= slice_s and steps >= MIN_STEPS_PER_CHUNK:
                per_step.append(elapsed / steps)
                steps, start = 0, clock()
    except Exception:
        per_step.append((clock() - start) / max(steps, 1))
    return statistics.median(per_step[1:] or per_step)


@dataclass
class OneThreadCosts:
    """The model's one-thread seconds per sample, as the profile would time them, from --precision auto's
    timings (fastrl.tuning.precision), so that the profile need not time the same calls again."""
    forward_s: dict
    train_s: float
    capped: bool


def profile_costs(cfg, env, obs_space, action_space, seconds: float, precision: Precision, cap_s: float,
                  one_thread: Optional[OneThreadCosts] = None) -> tuple:
    """(Costs, capped): this machine's costs in about `seconds`, `cap_s` wall seconds at most: a third
    stepping `env`, the rest timing forwards on one thread and the learner on 1 and 2 (given
    `one_thread`, only its speed-up). On a GPU the learner and policy workers are timed there."""
    start = time.perf_counter()
    cores = usable_cores()
    with on_one_core(cfg.pin_workers):  # where the runner made `env` when workers are pinned
        env_s = time_env_steps(env, seconds / 3) + WORKER_OVERHEAD_S
    small = learner_timing_cfg(cfg)
    threads = [1, 2] if cores >= 2 else [1]
    forward_s, train_s, capped = {}, {}, False
    batches, model_seconds = FORWARD_BATCHES, seconds * 2 / 3
    if one_thread is not None:
        forward_s, train_s, capped = dict(one_thread.forward_s), {1: one_thread.train_s}, one_thread.capped
        batches, threads, model_seconds = (), threads if len(threads) > 1 else [], seconds / 3
    on_gpu = torch.device(resolve_device(cfg)).type == "cuda"
    if on_gpu:
        threads = []  # the learner's step is timed on the GPU below
    if threads or batches:
        model = measure_model(small, obs_space, action_space, batches, threads,
                              Budget(model_seconds, cap_s - (time.perf_counter() - start)),
                              forward_threads=[1] if batches else [], precision=precision)
        forward_s.update(model.forward_s_per_sample.get(1, {}))
        measured = model.train_s_per_sample
        if one_thread is not None:
            # A machine's speed can move between the precision's timing and this one, so only the
            # speed-up crosses over, taken first so that the one-thread cost stays the precision's to the bit.
            measured = {t: one_thread.train_s * (s / measured[1]) for t, s in measured.items()}
        train_s.update(measured)
        capped = capped or model.capped
    if not on_gpu:
        return Costs(cores=cores, env_s=env_s, forward_s=forward_s, train_s=train_s), capped
    # At the run's own minibatch: a GPU step of short kernels costs much the same at 256 samples as
    # at 1024, so a small step would overstate the cost per sample.
    gpu = measure_model(cfg, obs_space, action_space, DEVICE_FORWARD_BATCHES, [1],
                        Budget(seconds / 3, cap_s - (time.perf_counter() - start)), device="cuda", precision=precision)
    return Costs(cores=cores, env_s=env_s, forward_s=forward_s, train_s=gpu.train_s_per_sample, gpu=True,
                 device_forward_s=gpu.forward_s_per_sample[1]), capped or gpu.capped


def _source_digest() -> str:
    """A hash of fastrl's and its envs' Python sources: a code change can change every cost."""
    # Installed, envs/ lies inside fastrl/, in a checkout beside it: the set reads a file once.
    roots = (os.path.dirname(os.path.abspath(fastrl.__file__)), os.path.dirname(os.path.abspath(envs.__file__)))
    paths = sorted({os.path.join(folder, name) for root in roots for folder, _, files in os.walk(root)
                    for name in files if name.endswith(".py")})
    digest = hashlib.sha1()
    for path in paths:
        with open(path, "rb") as fh:
            digest.update(os.path.basename(path).encode() + fh.read())
    return digest.hexdigest()


def _user_code_digest(modules: str) -> str:
    """A hash of the sources of --modules, the user's envs and models: changing them changes the
    costs as much as a change to fastrl's own code."""
    digest = hashlib.sha1()
    for reference in (m.strip() for m in modules.split(",") if m.strip()):
        path = reference
        if not reference.endswith(".py"):
            spec = importlib.util.find_spec(reference)
            path = spec.origin if spec is not None and spec.origin else ""
        digest.update(reference.encode())
        with contextlib.suppress(OSError):
            with open(path, "rb") as fh:
                digest.update(fh.read())
    return digest.hexdigest()


# The options that shape the model and so its cost.
MODEL_OPTIONS = ("hidden_sizes", "activation", "use_rnn", "rnn_size", "separate_critic", "normalize_obs", "rollout",
                 "learner_allocator", "model")


def cache_path(setup: dict, modules: str = "") -> str:
    """The cache file of a measurement of `setup` (a JSON-ready dict), one per machine, torch
    version, fastrl source, the source of the user's `modules` (--modules) and setup, under
    ~/.cache/fastrl/profiles."""
    code = {"code": _source_digest(), **({"user_code": _user_code_digest(modules)} if modules else {})}
    key = json.dumps({"machine": machine_info()["cpu"], "cores": os.cpu_count(), "torch": torch.__version__,
                      **code, **setup}, sort_keys=True)
    return os.path.join(user_cache("profiles"), hashlib.sha1(key.encode()).hexdigest()[:16] + ".json")


def read_cache(path: str) -> dict:
    """The dict a run kept at `path` (a cache_path), or {} where there is none to read."""
    try:
        with open(path) as fh:
            kept = json.load(fh)
        return kept if isinstance(kept, dict) else {}
    except (OSError, ValueError):
        return {}


def write_cache(path: str, data: dict) -> None:
    """Keep `data` at `path` (a cache_path) for the next run, if the cache can be written."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json(path, data)
    except OSError:
        pass  # no cache dir: the next run measures again, nothing worse


# The options that set what the profile measures.
PROFILED_OPTIONS = (*MODEL_OPTIONS, "env", "env_option", "ppo_epochs", "doom_measurements", "doom_hud", "doom_scenario",
                    "doom_agents", "pin_workers")


def _where(cfg, precision: Precision) -> dict:
    # The usable cores too: a whole machine's profile would plan a torchrun or taskset run on its share.
    return {"precision": [precision.acting, precision.learning], "usable_cores": usable_cores(),
            "device": torch.device(resolve_device(cfg)).type}


def setup_cache_path(kind: str, cfg, precision: Precision, options: Sequence[str] = PROFILED_OPTIONS) -> str:
    """cache_path of a measurement `kind` of cfg's `options`, precision, usable cores and device."""
    return cache_path({kind: {k: getattr(cfg, k) for k in options}, "learner_trajectories": timed_trajectories(cfg),
                       **_where(cfg, precision)}, cfg.modules)


def cached_costs(cfg, env, seconds: float, precision: Precision, cap_s: float,
                 one_thread: Optional[OneThreadCosts] = None, fresh: bool = False) -> tuple:
    """(profile_costs' Costs, whether cached, whether taken on a busy machine); a busy profile is not
    cached, as every later run would plan from it."""
    path = setup_cache_path("costs", cfg, precision)
    try:
        if fresh:
            raise FileNotFoundError(path)
        with open(path) as fh:
            data = json.load(fh)
        for key in ("forward_s", "train_s", "device_forward_s"):
            data[key] = {int(k): v for k, v in data.get(key, {}).items()}
        return Costs(**data), True, False
    except (OSError, ValueError, TypeError, KeyError):
        pass
    before = machine_load.sample()
    costs, capped = profile_costs(cfg, env, env.observation_space, env.action_space, seconds, precision, cap_s,
                                  one_thread)
    busy = capped or machine_load.disturbed_since(before)
    if not busy:
        write_cache(path, asdict(costs))
    return costs, False, busy
