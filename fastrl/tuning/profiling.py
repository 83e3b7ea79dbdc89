"""Measuring what this machine can do, as a library: the bench CLI prints these
numbers and the resource planner decides process layouts from them.

- `measure_env`: raw env stepping in N spawned processes, random actions, no model.
- `measure_model`: the model's forward cost per sample at inference batch sizes and
  its learner cost (forward, backward and optimiser step of the real APPO loss) per
  sample, at given torch thread counts.
- `compute_bound_limit`: the rate at which these cores could step the envs and run
  the model's forward and backward passes if nothing ever waited.
- `machine_info`: the CPU, cores, GPU and software versions a result belongs to.
- `cached_costs`: the planner's Costs, profiled in a second or two at start-up and
  cached per machine and setup (`cache_path`), so that only a setup's first run
  pays for it.

The planner adds up the cost of stepping, acting and learning and divides the
cores among them, so every cost it needs comes in core-seconds per sample (threads
x wall seconds): EnvProfile.seconds_per_step, ModelProfile.forward_core_s() and
ModelProfile.learner_core_s(). ModelProfile also keeps the wall times per thread
count it was measured at.
"""
from __future__ import annotations

import hashlib
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
MIN_ROUNDS = 3  # timed rounds of every model measurement at least: a median needs a few


class ProfilingError(RuntimeError):
    """A measurement failed; the message names the process and carries its traceback."""


Progress = Optional[Callable[[float], None]]  # called with the seconds measured so far


# --------------------------------------------------------------------------------------
# Env stepping

@dataclass
class EnvProfile:
    """Raw env stepping measured in `num_procs` processes of `envs_per_proc` envs each.

    steps_per_s and frames_per_s are aggregate over all processes (frames = agent
    steps x frameskip). seconds_per_step is the core-seconds one env step costs:
    the cores in use (min(num_procs, cores)) divided by steps_per_s, which is the
    wall time of one step of one env in one process when the processes do not
    outnumber the cores, and corrects for time-sharing when they do.
    """
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
    """One profile from several measurements of the same layout taken at different
    times: the mean core-seconds per step (what a limit adds up) and the rates that
    follow from it; window_s is the total measured time."""
    first = profiles[0]
    cores_used = first.seconds_per_step * first.steps_per_s  # min(num_procs, usable cores)
    seconds_per_step = statistics.fmean(p.seconds_per_step for p in profiles)
    steps_per_s = cores_used / seconds_per_step
    return replace(
        first, window_s=sum(p.window_s for p in profiles), steps_per_s=steps_per_s,
        frames_per_s=steps_per_s * first.frameskip, seconds_per_step=seconds_per_step,
        seconds_per_frame=seconds_per_step / first.frameskip)


def _step_envs_child(index: int, cfg, warmup: float, seconds: float, ready, go, results) -> None:
    """One measuring process: make the envs, report ready, wait for the common start,
    step with random actions through the warm-up, then count steps over the window."""
    if cfg.pin_workers:
        pin_to_core(index)  # as the rollout worker it stands for
    spec = get_spec(cfg.env)
    envs = []
    agents = cfg.agents_per_game
    count = max(agents, cfg.num_envs_per_worker // agents * agents)  # whole games
    seeds = [env_seed(cfg.seed, index * count + i) for i in range(count)]
    try:
        if agents > 1:  # whole games, each agent an env stepped in two halves, as a rollout worker has them
            envs = make_match_agents(spec, env_options(cfg), seeds, agents, agents)
        else:
            for seed in seeds:
                envs.append(spec.make(seed=seed, **env_options(cfg)))
        for env, seed in zip(envs, seeds):
            env.reset(seed=seed)
            env.action_space.seed(seed)
        ready.put(index)
        go.wait()

        def step_all() -> None:
            if agents > 1:
                for env in envs:
                    env.step_send(env.action_space.sample())
            for env in envs:
                if agents > 1:
                    _, _, terminated, truncated, _ = env.step_receive()
                else:
                    _, _, terminated, truncated, _ = env.step(env.action_space.sample())
                if terminated or truncated:
                    env.reset()

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
    """Step cfg.num_envs_per_worker envs of cfg.env in each of `num_procs` spawned
    processes with random actions (autoreset, no model) for `warmup` then `seconds`
    seconds. All processes start stepping together once every env exists, so env
    creation never counts. Raises ProfilingError (with the child's traceback) if a
    process fails."""
    spec = get_spec(cfg.env)
    # Plain spawn rather than the runner's forkserver: starting that server imports
    # torch and the trainer in the background, which would compete with this
    # measurement for the cores.
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


# --------------------------------------------------------------------------------------
# Model compute

@dataclass
class ModelProfile:
    """The model's compute cost on this machine, per torch thread count.

    forward_s_per_sample[threads][batch]: wall seconds per sample of one inference
    forward (`act` under no_grad) at that batch size.
    train_s_per_sample[threads]: wall seconds per sample of one learner gradient step
    (forward, APPO loss, backward, gradient clipping, Adam) on a minibatch of
    `train_minibatch` samples, the size the learner really steps on
    (batch_size / num_minibatches). Each sample goes through `ppo_epochs` such steps.
    """
    device: str
    threads: list
    forward_batch_sizes: list
    forward_s_per_sample: dict
    train_minibatch: int
    ppo_epochs: int
    train_s_per_sample: dict
    capped: bool = False  # its wall-clock cap cut the timing short (time_interleaved)

    def forward_core_s(self, batch: int) -> float:
        """Core-seconds per sample of a forward at `batch`, at the most core-efficient
        thread count measured (extra threads rarely pay for the cores they take)."""
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
    """One profile from several measurements of the same model and thread counts
    taken at different times: the mean of each per-sample time."""
    first = profiles[0]
    forward = {t: {b: statistics.fmean(p.forward_s_per_sample[t][b] for p in profiles) for b in per}
               for t, per in first.forward_s_per_sample.items()}
    train = {t: statistics.fmean(p.train_s_per_sample[t] for p in profiles) for t in first.train_s_per_sample}
    return replace(first, forward_s_per_sample=forward, train_s_per_sample=train)


def _fake_obs(model, obs_space, lead: tuple, gen: torch.Generator) -> dict:
    """Random observations {key: [*lead, *shape]} in the model's storage dtypes and
    the trainer's buffer layout (so the profile times what training runs)."""
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
    """A learner minibatch of the real shapes: [T+1, B] obs, [T, B] the rest, with the
    actions and behaviour log-probs the model itself would produce on those obs."""
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
        # No truncations: the learner's extra forward on the few truncated
        # observations is negligible next to the unroll.
        "truncated": torch.zeros(T, B, dtype=torch.bool),
        "final_obs": {k: v[:0, 0] for k, v in obs.items()},
        "final_row": torch.full((T, B), -1, dtype=torch.long),
        "valid": torch.ones(T, B),
    }


class Timed(NamedTuple):
    """What time_interleaved measured: the median seconds of one call of each key,
    and whether its wall-clock cap cut the timing short."""
    per_call: dict
    capped: bool


def time_interleaved(calls: dict, seconds: float, min_rounds: int = MIN_ROUNDS, clock=time.perf_counter,
                     tick=None, cap_s: float = math.inf, wall=time.perf_counter) -> Timed:
    """Median seconds (on `clock`) of one call of each of `calls` ({key: (threads,
    fn)}), timed in rounds that call every fn once, until `seconds` have passed and
    at least `min_rounds` rounds were timed, or until `cap_s` seconds on the `wall`
    clock have passed since it began.

    Rounds rather than one block per fn: on a machine that something else may
    disturb for a second, a block-by-block profile can time one batch size in a
    slow second and the next in a quiet one, and the planner, which compares
    layouts through the ratios of these costs, then prefers a layout for a
    reason that was never there (a forward at 32 samples once timed 25% above
    six other profiles and steered doom_battle to 5 processes on 2 cores). In
    rounds a slow second slows every key alike, and the median drops the rounds
    it slowed. `threads` is set with torch.set_num_threads before each call
    (the caller restores its own count); each fn is called WARMUP_CALLS times
    untimed first.

    The cap is what bounds it on a busy machine: warm-up calls and rounds are
    counts of calls, and each call takes longer the less of a core it gets (the
    planner's profile, ~2.6 s on a quiet machine, took 24-30 s on a busy one).
    Past the cap no call starts but a key's first timed one, so that every key
    has a number: it ends within the cap and the first round's calls."""
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
    """The model of `cfg` on random data, ready to time: a learner with its optimizer
    and a minibatch of cfg's shape, and an actor (a copy of the learner's weights)
    with one input per batch size. The actor computes in precision.acting, the
    learner in precision.learning; seeded from cfg.seed, so two benches in
    different precisions time the same weights on the same data. Benchmarks change
    `learner` and `actor` in place (compile a part, swap a method) before timing."""

    def __init__(self, cfg, obs_space, action_space, batch_sizes: Sequence[int], precision: Precision,
                 device: str = "cpu"):
        dev = torch.device(device)
        self.cfg = cfg
        self._sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
        gen = torch.Generator().manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.learner = build_model(cfg, obs_space, action_space, precision.learning)
        minibatch = _fake_minibatch(cfg, self.learner, obs_space, gen)  # made on the CPU, then moved
        self.learner.to(dev)
        self.optimizer = FusedAdam(self.learner.parameters(), lr=cfg.lr, eps=cfg.adam_eps)
        self.minibatch = {k: ({kk: vv.to(dev) for kk, vv in v.items()} if isinstance(v, dict) else v.to(dev))
                          for k, v in minibatch.items()}
        # The forwards run on their own copy, as an actor does: the training steps
        # change the learner's weights every round, and a forward right after one would
        # pay for re-deriving its cached bf16 weights, which an actor does once per
        # parameter update, not once per forward.
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
        """One learner gradient step on the minibatch, as the learner takes most of
        them: without the loss's logging statistics (it reports them once a second)."""
        gradient_step(self.cfg, self.learner, self.optimizer, self.minibatch, self.minibatch["valid"], stats=False)
        self._sync()


def model_calls(cfg, obs_space, action_space, batch_sizes: Sequence[int], precision: Precision,
                device: str = "cpu") -> tuple:
    """A ModelBench's calls: ({batch: one inference forward at that size}, one learner
    gradient step, the samples that step trains on)."""
    bench = ModelBench(cfg, obs_space, action_space, batch_sizes, precision, device)
    return ({b: bench.forward_call(b) for b in batch_sizes}, bench.train,
            bench.minibatch["rewards"].numel())


def measure_model(cfg, obs_space, action_space, batch_sizes: Sequence[int], threads: Sequence[int],
                  seconds: float, device: str = "cpu", progress: Progress = None,
                  forward_threads: Optional[Sequence[int]] = None, *, precision: Precision,
                  cap_s: float = math.inf) -> ModelProfile:
    """Time the model of `cfg` in `precision` on random data (model_calls): a forward
    at every size in `batch_sizes` with torch.set_num_threads(t) for each t in
    `forward_threads` (default: `threads`), and a learner gradient step on one
    minibatch for each t in `threads`, interleaved (time_interleaved) over about
    `seconds`, and `cap_s` wall seconds at most. Runs in this process and restores
    its thread count."""
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


# --------------------------------------------------------------------------------------
# The limit both imply

def compute_bound_limit(env: EnvProfile, model: ModelProfile, forward_batch: int, cores: int) -> dict:
    """The agent steps/s `cores` cores could sustain if every core only computed.

    Every agent step costs one env step, one forward (at `forward_batch`) and the
    learner's share of training on it (ppo_epochs gradient passes), each in
    core-seconds; with C cores the limit is C / (env + forward + learn). It ignores
    communication and assumes perfect packing, so it is an upper bound that a
    trainer can approach but not pass. On a GPU the model's share runs beside the
    cores, and the limit this formula gives is too low.
    """
    per_step = {"env": env.seconds_per_step, "forward": model.forward_core_s(forward_batch),
                "learn": model.learner_core_s()}
    steps_per_s = cores / sum(per_step.values())
    return {"cores": cores, "forward_batch": forward_batch, "core_s_per_step": per_step,
            "steps_per_s": steps_per_s, "frames_per_s": steps_per_s * env.frameskip}


# The vector extensions that decide which precision and kernels are fastest, best first.
VECTOR_EXTENSIONS = ("amx_bf16", "avx512_bf16", "avx512f", "avx2")


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's name (x86's model name, or an ARM board's Hardware or Model line),
    and on x86 its family, model and best vector extension: a cloud VM's CPU is
    often named by its brand alone, and one brand name covers generations with and
    without bf16, which rank bf16 and fp32 the opposite way. Measurements cached
    under the name must not cross."""
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
    """What a measurement belongs to: CPU model, cores, memory, GPU (None without one),
    and the versions of torch, Python and the OS."""
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


# --------------------------------------------------------------------------------------
# The planner's costs, measured at start-up and cached

FORWARD_BATCHES = (4, 8, 16, 32, 64, 128)
# A GPU policy worker batches every worker's half split: tens to a thousand rows.
DEVICE_FORWARD_BATCHES = (16, 64, 256, 1024)
# What a rollout worker adds to a bare env step: the action conversion, the
# shared-memory writes and the episode bookkeeping (~4 us measured on CartPole).
WORKER_OVERHEAD_S = 4e-6
# The learner's step is timed on this many trajectories (256 samples at rollout
# 32), since a Doom minibatch of 1024 takes a second a step. A smaller step
# understates bf16's gain, as the costs it does not change (Adam, the GRU's loop
# over time) weigh more in it. --precision auto times the step on as many, so that
# the profile can take its timings (OneThreadCosts).
PROFILE_TRAJECTORIES = 8
ENV_CHUNKS = 4  # timed slices of the env profile, of which the median counts
MIN_STEPS_PER_CHUNK = 10


def time_env_steps(env, seconds: float, chunks: int = ENV_CHUNKS, clock=time.perf_counter) -> float:
    """Core-seconds per agent step of `env` with random actions, stepped here: the
    median over `chunks` equal slices of `seconds`, after one more slice untimed.

    The untimed slice lets a fresh game settle; the median keeps a slice that
    shared its core with something else (the process server importing torch
    beside the trainer's own start) from moving the plan.
    An env that raises is timed on the steps it took: its failures are the rollout
    workers' to handle (they re-create it, or stop the run naming it), not a reason
    to die here with a bare traceback before any worker starts."""
    slice_s = seconds / (chunks + 1)
    per_step, steps, start = [], 0, clock()  # per_step[0] is the settling slice
    try:
        env.reset()
        while len(per_step) <= chunks:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            steps += 1
            if terminated or truncated:
                env.reset()
            elapsed = clock() - start
            if elapsed >= slice_s and steps >= MIN_STEPS_PER_CHUNK:
                per_step.append(elapsed / steps)
                steps, start = 0, clock()
    except Exception:
        per_step.append((clock() - start) / max(steps, 1))
    return statistics.median(per_step[1:] or per_step)


@dataclass
class OneThreadCosts:
    """The model's costs on one thread in one arithmetic, seconds per sample, as the
    profile would time them: a forward at each of FORWARD_BATCHES ({batch: s}) and
    a learner gradient step on PROFILE_TRAJECTORIES trajectories. --precision auto
    times these in fp32 and bf16 before the profile (fastrl.tuning.precision), and
    the profile takes the chosen arithmetic's rather than time the same calls again.
    `capped`: their timing hit its wall-clock cap (a busy machine)."""
    forward_s: dict
    train_s: float
    capped: bool


def profile_costs(cfg, env, obs_space, action_space, seconds: float, precision: Precision, cap_s: float,
                  one_thread: Optional[OneThreadCosts] = None) -> tuple:
    """Measure this machine's costs in about `seconds` (plus torch's one-off warm-up
    on first use, ~1.5 s, and at least a few rounds of the model): a third stepping
    `env`, the rest timing the model in the run's `precision` on random data,
    inference at several batch sizes on one thread (actors run one) and a learner
    gradient pass on 1 and 2 threads, interleaved. Given the model's `one_thread`
    costs, timed already, it takes those and times only the learner's pass on 1
    and 2 threads, for a third of `seconds`: the two-thread cost is the given
    one-thread cost at the speed-up these rounds measure (the comment below says
    why). --precision auto times in CPU seconds (measure_precision
    says why), which on a quiet core are the wall seconds this would time, and on
    a busy one are nearer to what the model costs a core of its own. Where the run
    computes on a GPU, the learner's step (at the run's minibatch) and the policy
    workers' forwards are timed on it instead, for another third of `seconds`.

    Returns (Costs, whether its wall-clock cap cut it short). `cap_s` bounds it,
    in wall seconds, whatever the load (time_interleaved says how far)."""
    start = time.perf_counter()
    cores = usable_cores()
    with on_one_core(cfg.pin_workers):  # where the runner made `env` when workers are pinned
        env_s = time_env_steps(env, seconds / 3) + WORKER_OVERHEAD_S
    small = replace(cfg, batch_size=cfg.rollout * PROFILE_TRAJECTORIES, num_minibatches=1)
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
        model = measure_model(small, obs_space, action_space, batches, threads, model_seconds,
                              forward_threads=[1] if batches else [], precision=precision,
                              cap_s=cap_s - (time.perf_counter() - start))
        forward_s.update(model.forward_s_per_sample.get(1, {}))
        measured = model.train_s_per_sample
        if one_thread is not None:
            # The precision's timing and this one are seconds apart, and this VM's
            # speed moves by a third between such moments (the same one-thread step
            # timed 947 us a sample in one and 697 in the next): a two-thread time
            # from one over a one-thread time from the other read a 2.4x speed-up
            # from the second thread, where the same rounds measure 1.5-1.8x, and the
            # plan gave doom_battle's learner two threads on two busy cores. So only
            # the speed-up crosses over, and every model cost keeps the precision's
            # level; the price is the one-thread step timed twice, ~1 s of a cold profile.
            # (The speed-up first: x / x is exactly 1, so the one-thread cost stays the
            # precision's to the bit, which a product before the division only nearly kept.)
            measured = {t: one_thread.train_s * (s / measured[1]) for t, s in measured.items()}
        train_s.update(measured)
        capped = capped or model.capped
    if not on_gpu:
        return Costs(cores=cores, env_s=env_s, forward_s=forward_s, train_s=train_s), capped
    # The GPU's costs at the run's own minibatch: a GPU step costs much the same at
    # 256 samples as at 1024 (its kernels are short and launched one by one), so a
    # small step would overstate the cost per sample several times.
    gpu = measure_model(cfg, obs_space, action_space, DEVICE_FORWARD_BATCHES, [1], seconds / 3, device="cuda",
                        precision=precision, cap_s=cap_s - (time.perf_counter() - start))
    return Costs(cores=cores, env_s=env_s, forward_s=forward_s, train_s=gpu.train_s_per_sample, gpu=True,
                 device_forward_s=gpu.forward_s_per_sample[1]), capped or gpu.capped


def _source_digest() -> str:
    """A hash of fastrl's and its envs' Python sources. A code change can change every
    cost (a faster encoder, a cheaper env step), and a profile timed on the old code
    would steer the plan wrong for as long as it is cached; re-profiling takes seconds."""
    # Installed, envs/ lies inside fastrl/; in a source checkout beside it. The set
    # reads a file once either way.
    roots = (os.path.dirname(os.path.abspath(fastrl.__file__)), os.path.dirname(os.path.abspath(envs.__file__)))
    paths = sorted({os.path.join(folder, name) for root in roots for folder, _, files in os.walk(root)
                    for name in files if name.endswith(".py")})
    digest = hashlib.sha1()
    for path in paths:
        with open(path, "rb") as fh:
            digest.update(os.path.basename(path).encode() + fh.read())
    return digest.hexdigest()


# The options that shape the model and so its cost; a measurement cached for one
# setup must not be reused for another.
MODEL_OPTIONS = ("hidden_sizes", "activation", "use_rnn", "rnn_size", "separate_critic", "normalize_obs", "rollout",
                 "learner_allocator")


def cache_path(setup: dict) -> str:
    """Where a measurement of `setup` (a JSON-ready dict naming what was measured)
    is cached: ~/.cache/fastrl/profiles (XDG_CACHE_HOME), one file per machine,
    torch version, fastrl source and setup, so that only a machine's first run of a
    setup pays for measuring it."""
    key = json.dumps({"machine": machine_info()["cpu"], "cores": os.cpu_count(), "torch": torch.__version__,
                      "code": _source_digest(), **setup}, sort_keys=True)
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


# The options that set what the profile measures: the model's, the env's and the
# learner's passes over a sample.
PROFILED_OPTIONS = (*MODEL_OPTIONS, "env", "ppo_epochs", "doom_measurements", "doom_hud", "doom_scenario",
                    "doom_agents", "pin_workers")


def _where(cfg, precision: Precision) -> dict:
    # The cores this process may use are part of the setup: a profile taken on the whole
    # machine would plan a torchrun rank (or a taskset run) on its share for all of it.
    return {"precision": [precision.acting, precision.learning], "usable_cores": usable_cores(),
            "device": torch.device(resolve_device(cfg)).type}


def setup_cache_path(kind: str, cfg, precision: Precision, options: Sequence[str] = PROFILED_OPTIONS) -> str:
    """cache_path of a measurement `kind` of cfg's setup (its `options`), in the run's
    precision, on the cores and device it may use."""
    return cache_path({kind: {k: getattr(cfg, k) for k in options}, **_where(cfg, precision)})


def cached_costs(cfg, env, seconds: float, precision: Precision, cap_s: float,
                 one_thread: Optional[OneThreadCosts] = None, fresh: bool = False) -> tuple:
    """profile_costs, remembered per machine and setup (cache_path: the env, model
    options, the run's precision and worker pinning). Returns (costs, whether they
    came from the cache, whether it was taken on a busy machine). `fresh` measures
    again whatever is cached. A profile taken on a busy machine (it hit its cap, or
    other programs took the cores) is not cached: every later run would plan from it."""
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
    busy = capped or machine_load.disturbed(machine_load.foreign_cores(before, machine_load.sample()), usable_cores())
    if not busy:
        write_cache(path, asdict(costs))
    return costs, False, busy
