"""The resource planner: choose the process layout that maximises trained
samples/s on this machine, with the policy lag bounded (TianJi's balance of
sample production against consumption).

The cost model, per agent step, in core-seconds measured by fastrl.profiling:
    env      one env step (no model)
    forward  one sample of inference at a given batch size
    train    one sample of one learner gradient pass (times ppo_epochs), in wall
             seconds per thread count t; its core cost is t times that
    comm     one policy-worker round trip per request (queues + copies), per sample
Rates it predicts, in agent steps/s, for W rollout workers of E envs:
    TR_A (production)   local:        W / (env + forward(E))
                        policy_worker: min(W / env, P / (forward(W*E/2) + comm))
    TR_L (consumption)  1 / (epochs * train[t])                  t = learner threads
    TR_C (the cores)    C / (env + forward + epochs * t * train[t] + comm)
    trained = min(TR_A, TR_L, TR_C)
TR_C is the limit when every process wants a core (processes > cores): then the
layout only decides how little is wasted, and the workers' niceness (worker_nice)
lets the kernel give the learner the share of the cores TR_C assumes. Lag: a
trajectory of T steps takes T * W * E / trained seconds to fill while the
learner takes trained / batch steps per second, so a sample is W * E * T / batch
learner steps old at most.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Optional

from fastrl.proc import on_one_core

# What the planner may choose; every other option stays as configured.
PLANNED = ("num_workers", "num_envs_per_worker", "inference", "num_policy_workers", "learner_threads", "num_buffers",
           "worker_nice")
ENVS_PER_WORKER = (4, 8, 16, 32, 64)
# A layout within this fraction of the best prediction wins if it uses fewer
# processes or less lag: the model is not accurate to better than that.
TIE = 0.03
# Linux weighs a task's claim on a contended core by its niceness, each step
# about 1.25x less (the kernel's sched_prio_to_weight table).
NICE_STEP = 1.25
MAX_WORKER_NICE = 10


@dataclass
class Costs:
    cores: int
    env_s: float  # core-seconds per env step
    forward_s: dict  # batch size -> core-seconds per sample of inference
    train_s: dict  # learner threads -> wall seconds per sample of one gradient pass
    comm_s: float = 50e-6  # per sample of a policy-worker round trip
    gpu: bool = False

    def train(self, threads: int) -> float:
        """Wall seconds per sample of a gradient pass on `threads` threads (the
        nearest measured thread count when that one was not measured)."""
        return self.train_s[min(self.train_s, key=lambda t: abs(t - threads))]

    def forward(self, batch: int) -> float:
        """Per-sample inference cost at `batch`, interpolated in log-batch between
        measured sizes (held flat outside them)."""
        sizes = sorted(self.forward_s)
        if batch <= sizes[0]:
            return self.forward_s[sizes[0]]
        if batch >= sizes[-1]:
            return self.forward_s[sizes[-1]]
        import math

        for lo, hi in zip(sizes, sizes[1:]):
            if lo <= batch <= hi:
                w = (math.log(batch) - math.log(lo)) / (math.log(hi) - math.log(lo))
                return self.forward_s[lo] * (1 - w) + self.forward_s[hi] * w
        raise AssertionError("unreachable")


@dataclass
class Plan:
    num_workers: int
    num_envs_per_worker: int
    inference: str
    num_policy_workers: int
    learner_threads: int
    num_buffers: int
    worker_nice: int = 0  # (plans saved before it existed read as 0)
    predicted: dict = field(default_factory=dict)  # production/consumption/trained steps/s, lag, bottleneck

    def options(self) -> dict:
        return {k: getattr(self, k) for k in PLANNED}

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls(**json.loads(text))


def _inference_costs(costs: Costs, workers: int, envs: int, inference: str) -> tuple:
    """(forward, comm) per sample: a local worker acts on its own envs; a policy
    worker batches about one split of every worker."""
    if inference == "local":
        return costs.forward(envs), 0.0
    return costs.forward(max(1, workers * envs // 2)), costs.comm_s


def predict(costs: Costs, workers: int, envs: int, inference: str, policy_workers: int, learner_threads: int,
            epochs: int, rollout: int, batch: int) -> dict:
    """Predicted rates (agent steps/s) and lag of one layout; see the module doc."""
    forward, comm = _inference_costs(costs, workers, envs, inference)
    if inference == "local":
        production = workers / (costs.env_s + forward)
        processes = workers + 1
    else:
        production = min(workers / costs.env_s, policy_workers / (forward + comm))
        processes = workers + policy_workers + 1
    learn_wall = epochs * costs.train(learner_threads)
    consumption = 1.0 / learn_wall
    cores = costs.cores / (costs.env_s + forward + comm + learner_threads * learn_wall)
    trained = min(production, consumption, cores)
    if trained == consumption:
        bottleneck = "learner"
    elif trained == production:
        bottleneck = "inference" if inference == "policy_worker" and production < workers / costs.env_s else "env"
    else:  # every core is busy: name the part that takes most of them
        shares = {"env": costs.env_s, "inference": forward + comm, "learner": learner_threads * learn_wall}
        bottleneck = max(shares, key=shares.get)
    return {
        "production_steps_per_s": production,
        "consumption_steps_per_s": consumption,
        "cores_steps_per_s": cores,
        "trained_steps_per_s": trained,
        "lag_max_learner_steps": workers * envs * rollout / batch + 1,
        "processes": processes,
        "bottleneck": bottleneck,
    }


def worker_nice(costs: Costs, workers: int, envs: int, inference: str, policy_workers: int, learner_threads: int,
                epochs: int) -> int:
    """The least niceness of the rollout workers at which Linux's fair share gives
    the learner the part of the cores the cost model has it need.

    The rates `predict` gives assume the cores are packed perfectly: the learner
    computes a share C * learn / (actors + learn) of them. The kernel does not
    know that share. When more processes want to run than there are cores, it
    gives each a part in proportion to its weight, so at equal weights the
    learner gets C / (runnable processes): on doom_battle, 2 workers and the
    learner on 2 cores, 0.67 of a core where it needs 0.86. It then holds up the
    workers, they block on free buffers, and part of a core idles meanwhile.
    Lowering the workers' weight moves the share, and a worker that still wants
    less than it is allowed loses nothing. Returns 0 when every process has a
    core of its own."""
    pw = policy_workers if inference == "policy_worker" else 0
    if workers + pw + learner_threads <= costs.cores:
        return 0
    forward, comm = _inference_costs(costs, workers, envs, inference)
    learn = learner_threads * epochs * costs.train(learner_threads)
    need = min(learner_threads, costs.cores * learn / (costs.env_s + forward + comm + learn))
    for nice in range(MAX_WORKER_NICE + 1):
        weight = NICE_STEP ** -nice  # the learner's threads and policy workers weigh 1 each
        share = costs.cores * learner_threads / (learner_threads + pw + workers * weight)
        if share >= need:
            return nice
    return MAX_WORKER_NICE


def choose(costs: Costs, cfg, explicit: set) -> Plan:
    """The best layout for `cfg` on these costs. Options in `explicit` (set by the
    user) are kept as they are; lag must stay within cfg.max_policy_lag."""
    def allowed(name, values):
        return [getattr(cfg, name)] if name in explicit else values

    splits_of = {"local": 1, "policy_worker": 2}
    candidates = []
    max_workers = max(1, 2 * costs.cores)
    for inference in allowed("inference", ["local", "policy_worker"]):
        for workers in allowed("num_workers", list(range(1, max_workers + 1))):
            for envs in allowed("num_envs_per_worker", list(ENVS_PER_WORKER)):
                per_buffer = cfg.rollout * envs // splits_of[inference]
                if envs % splits_of[inference] or cfg.batch_size % per_buffer:
                    continue
                policy_options = [1] if inference == "local" else allowed(
                    "num_policy_workers", list(range(1, max(1, costs.cores) + 1)))
                for policy_workers in policy_options:
                    thread_options = ([cfg.learner_threads or cfg.torch_threads] if "learner_threads" in explicit
                                      else sorted(t for t in costs.train_s if t <= costs.cores))
                    for threads in thread_options:
                        p = predict(costs, workers, envs, inference, policy_workers, threads, cfg.ppo_epochs,
                                    cfg.rollout, cfg.batch_size)
                        if cfg.max_policy_lag and p["lag_max_learner_steps"] > cfg.max_policy_lag:
                            continue
                        candidates.append((p, workers, envs, inference, policy_workers, threads))
    if not candidates:
        raise ValueError(
            f"no layout keeps the policy lag under --max_policy_lag {cfg.max_policy_lag} with batch {cfg.batch_size}; "
            "raise --max_policy_lag or --batch_size, or set the layout by hand")
    best = max(p["trained_steps_per_s"] for p, *_ in candidates)
    good = [c for c in candidates if c[0]["trained_steps_per_s"] >= (1 - TIE) * best]

    def departures(c) -> int:  # how many choices differ from the configured defaults
        return (c[1] != cfg.num_workers) + (c[2] != cfg.num_envs_per_worker) + (c[3] != cfg.inference)

    def starves_learner(c) -> bool:
        return c[0]["production_steps_per_s"] < c[0]["consumption_steps_per_s"]

    # Among near-best layouts: first those whose actors outpace the learner. Two
    # coupled stages run below the slower one's rate when their rates are close,
    # and a surplus of actors costs little (they block on free buffers and give
    # up their core) while a starved learner wastes the step that costs most:
    # doom_battle's 1 worker x 32 envs was predicted 3% below 2 x 16 and
    # measured 4-12% below it, with a third of a core idle. Then fewest
    # processes and threads, the configured defaults (hand-picked for learning,
    # not only speed), least lag.
    p, workers, envs, inference, policy_workers, threads = min(
        good, key=lambda c: (starves_learner(c), c[0]["processes"], c[5], departures(c),
                             c[0]["lag_max_learner_steps"], -c[0]["trained_steps_per_s"]))
    splits = splits_of[inference]
    per_buffer = cfg.rollout * envs // splits
    buffers = cfg.num_buffers if "num_buffers" in explicit else workers * splits + 2 * (cfg.batch_size // per_buffer)
    nice = cfg.worker_nice if "worker_nice" in explicit else worker_nice(
        costs, workers, envs, inference, policy_workers, threads, cfg.ppo_epochs)
    return Plan(num_workers=workers, num_envs_per_worker=envs, inference=inference,
                num_policy_workers=policy_workers if inference == "policy_worker" else cfg.num_policy_workers,
                learner_threads=threads, num_buffers=buffers, worker_nice=nice, predicted=p)


def apply(cfg, plan: Plan):
    return dataclasses.replace(cfg, **plan.options())


def describe(plan: Plan, frameskip: int) -> str:
    p = plan.predicted
    layout = (f"{plan.num_workers} rollout worker(s) x {plan.num_envs_per_worker} envs, inference {plan.inference}"
              + (f" ({plan.num_policy_workers} policy worker(s))" if plan.inference == "policy_worker" else ""))
    nice = f", workers at nice {plan.worker_nice}" if plan.worker_nice else ""
    return (f"plan: {layout}, learner on {plan.learner_threads} thread(s){nice}, {plan.num_buffers} buffers; predicted {p['trained_steps_per_s'] * frameskip:,.0f} "
            f"env frames/s trained (production {p['production_steps_per_s'] * frameskip:,.0f}, consumption "
            f"{p['consumption_steps_per_s'] * frameskip:,.0f}, cores {p['cores_steps_per_s'] * frameskip:,.0f}; "
            f"{p['bottleneck']}-bound), policy lag <= {p['lag_max_learner_steps']:.1f} learner steps")


def save(plan: Plan, experiment_dir: str) -> str:
    path = os.path.join(experiment_dir, "plan.json")
    with open(path + ".tmp", "w") as fh:
        fh.write(plan.to_json())
    os.replace(path + ".tmp", path)
    return path


def load(path: str) -> Plan:
    with open(path) as fh:
        return Plan.from_json(fh.read())


def measured_next_to_predicted(plan: Optional[Plan], trained_steps_per_s: float, frameskip: int) -> str:
    if plan is None:
        return ""
    predicted = plan.predicted["trained_steps_per_s"] * frameskip
    measured = trained_steps_per_s * frameskip
    return f"planned {predicted:,.0f} env frames/s trained, measured {measured:,.0f} ({measured / predicted:.0%})"


# ---------------------------------------------------------------------------------------
# Profiling at start-up

FORWARD_BATCHES = (4, 8, 16, 32, 64, 128)
# What a rollout worker adds to a bare env step: the action conversion, the
# shared-memory writes and the episode bookkeeping (~4 us measured on CartPole).
WORKER_OVERHEAD_S = 4e-6
PROFILE_TRAJECTORIES = 8  # the learner is timed on this many trajectories: enough for a stable per-sample cost
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


def profile_costs(cfg, env, obs_space, action_space, seconds: float) -> Costs:
    """Measure this machine's costs in about `seconds` (plus torch's one-off warm-up
    on first use, ~1.5 s, and at least a few rounds of the model): a third stepping
    `env`, the rest timing the model on random data, inference at several batch
    sizes on one thread (actors run one) and a learner gradient pass on 1 and 2
    threads, interleaved."""
    from fastrl.profiling import measure_model, usable_cores

    cores = usable_cores()
    with on_one_core(cfg.pin_workers):  # where the runner made `env` when workers are pinned
        env_s = time_env_steps(env, seconds / 3) + WORKER_OVERHEAD_S
    small = dataclasses.replace(cfg, batch_size=cfg.rollout * PROFILE_TRAJECTORIES, num_minibatches=1)
    threads = [1, 2] if cores >= 2 else [1]
    model = measure_model(small, obs_space, action_space, FORWARD_BATCHES, threads, seconds * 2 / 3,
                          forward_threads=[1])
    return Costs(cores=cores, env_s=env_s, forward_s=dict(model.forward_s_per_sample[1]),
                 train_s=dict(model.train_s_per_sample))


def _source_digest() -> str:
    """A hash of fastrl's and its envs' Python sources. A code change can change every
    cost (a faster encoder, a cheaper env step), and a profile timed on the old code
    would steer the plan wrong for as long as it is cached; re-profiling takes seconds."""
    import hashlib

    import envs

    roots = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(envs.__file__)))
    paths = sorted(os.path.join(folder, name) for root in roots for folder, _, files in os.walk(root)
                   for name in files if name.endswith(".py"))
    digest = hashlib.sha1()
    for path in paths:
        with open(path, "rb") as fh:
            digest.update(os.path.basename(path).encode() + fh.read())
    return digest.hexdigest()


def cached_costs(cfg, env, seconds: float) -> tuple:
    """profile_costs, remembered per machine, torch version, fastrl source, env, model
    options and worker pinning under ~/.cache/fastrl (XDG_CACHE_HOME), so only a machine's first
    run of a setup pays for the profile. Returns (costs, whether it came from the cache).
    A cached profile can be stale if the machine's load changed: --plan auto after
    deleting the file, or the bench CLI, measures afresh."""
    import hashlib

    import torch

    from fastrl.profiling import machine_info

    setup_keys = ("env", "hidden_sizes", "activation", "use_rnn", "rnn_size", "separate_critic", "normalize_obs", "precision",
                  "rollout", "ppo_epochs", "doom_measurements", "doom_hud", "doom_scenario", "pin_workers")
    key = json.dumps({"machine": machine_info()["cpu"], "cores": os.cpu_count(), "torch": torch.__version__,
                      "code": _source_digest(), **{k: getattr(cfg, k) for k in setup_keys}}, sort_keys=True)
    root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastrl", "profiles")
    path = os.path.join(root, hashlib.sha1(key.encode()).hexdigest()[:16] + ".json")
    try:
        with open(path) as fh:
            data = json.load(fh)
        data["forward_s"] = {int(k): v for k, v in data["forward_s"].items()}
        data["train_s"] = {int(k): v for k, v in data["train_s"].items()}
        return Costs(**data), True
    except (OSError, ValueError, TypeError, KeyError):
        pass
    costs = profile_costs(cfg, env, env.observation_space, env.action_space, seconds)
    try:
        os.makedirs(root, exist_ok=True)
        with open(path + ".tmp", "w") as fh:
            json.dump(dataclasses.asdict(costs), fh)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # no cache dir: the next run profiles again, nothing worse
    return costs, False
