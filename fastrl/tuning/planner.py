"""The resource planner: the process layout that trains the most samples/s on this machine with
the policy lag bounded (TianJi's balance of sample production against consumption).

Per agent step, from fastrl.tuning.profiling: env and forward(b) (inference at batch b) in
core-seconds, train[t] in wall seconds on t threads, comm a policy-worker round trip. For W rollout
workers of E envs, P policy workers, C cores, t learner threads, T-step trajectories:
    TR_A (production)   local W / (env + forward(E)); policy workers min(W / env, P / (forward(W*E/(2*P)) + comm))
    TR_L (consumption)  1 / (epochs * train[t]);  TR_C (cores)  C / (env + forward + epochs * t * train[t] + comm)
    trained = min(TR_A, TR_L, TR_C); a sample is at most W * E * T / batch learner steps old.
On a GPU, train and a policy worker's forward are the GPU's wall seconds (that forward takes no
core) and TR_G = 1 / (forward + epochs * train) bounds trained too. N policies are N learners,
each on 1/N of the envs and samples."""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from fastrl.config import DEVICES, INFERENCE_MODES, splits_per_worker
from fastrl.plumbing.files import write_json

# What the planner may choose; every other option stays as configured.
PLANNED = ("num_workers", "num_envs_per_worker", "inference", "num_policy_workers", "learner_threads", "num_buffers",
           "worker_nice")
ENVS_PER_WORKER = (4, 8, 16, 32, 64)
# Within this fraction of the best prediction, fewer processes or less lag win: the model is no finer.
TIE = 0.03
# Each nice step weighs a task about 1.25x less on a contended core (the kernel's sched_prio_to_weight).
NICE_STEP = 1.25
MAX_WORKER_NICE = 10
# The most of its share a cheap learner should be busy, so that no batch queues for it (benchmarks/learning_suite.py).
LEARNER_LOAD = 0.8
# How far the actors' rate must pass the learner's to outpace it: coupled stages at close rates run
# below the slower one's rate (benchmarks/vs_sample_factory.py).
OUTPACE = 1.25
# How much of a core the actors may keep busy beside a learner's extra threads (threads_get_cores).
IDLE_ACTOR_CORES = 0.25
# How near the best a trial mode must come to be run: the model's error differs between the modes
# by more than TIE, so never trying the other mode could cost every later run.
UNTRIED_MARGIN = 0.15
# Below this scale the measured mode missed its model by more than quiet runs of one layout
# differ (benchmarks/plan_after_disturbance.py), so the model may be wrong about the other mode too.
DOUBT_BELOW = 0.8


@dataclass
class Costs:
    cores: int
    env_s: float  # core-seconds per env step
    forward_s: dict  # batch size -> core-seconds per sample of inference
    train_s: dict  # learner threads -> wall seconds per sample of one gradient pass
    comm_s: float = 50e-6  # per sample of a policy-worker round trip
    gpu: bool = False
    device_forward_s: dict = field(default_factory=dict)  # batch size -> GPU wall seconds per sample (gpu only)

    def train(self, threads: int) -> float:
        """Wall seconds per sample of a gradient pass on the measured thread count nearest `threads`."""
        return self.train_s[min(self.train_s, key=lambda t: abs(t - threads))]

    def forward(self, batch: int) -> float:
        """Per-sample inference cost at `batch` on a core, interpolated in log-batch between measured sizes."""
        return _interpolate(self.forward_s, batch)

    def policy_worker_forward(self, batch: int) -> float:
        """Per-sample cost of a policy worker's forward at `batch`: on the GPU if there is one."""
        return _interpolate(self.device_forward_s, batch) if self.gpu else self.forward(batch)


def _interpolate(per_sample: dict, batch: int) -> float:
    sizes = sorted(per_sample)
    if batch <= sizes[0]:
        return per_sample[sizes[0]]
    if batch >= sizes[-1]:
        return per_sample[sizes[-1]]
    for lo, hi in zip(sizes, sizes[1:]):
        if lo <= batch <= hi:
            w = (math.log(batch) - math.log(lo)) / (math.log(hi) - math.log(lo))
            return per_sample[lo] * (1 - w) + per_sample[hi] * w
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
    # cpu or cuda where --device auto had both to choose from; auto leaves --device as it is.
    device: str = "auto"

    def options(self) -> dict:
        return {k: getattr(self, k) for k in PLANNED + (("device",) if self.device != "auto" else ())}

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """The plan in `text`; ValueError naming the first entry a hand edit broke."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"it holds a {type(data).__name__}, not a plan's mapping")
        kinds = {f.name: {"int": int, "str": str, "dict": dict}[f.type] for f in dataclasses.fields(cls)}
        for name, value in data.items():
            if name not in kinds:
                raise ValueError(f"it has an entry {name!r} no plan has")
            if not isinstance(value, kinds[name]) or isinstance(value, bool):
                raise ValueError(f"its {name} is {value!r}, not a{'n' if kinds[name] is int else ''} "
                                 f"{kinds[name].__name__}")
        missing = [name for name in PLANNED if name not in data and name != "worker_nice"]
        if missing:
            raise ValueError(f"it has no {missing[0]}")
        if data["inference"] not in INFERENCE_MODES:
            raise ValueError(f"its inference is {data['inference']!r}, not one of {', '.join(INFERENCE_MODES)}")
        if data.get("device", "auto") not in DEVICES:
            raise ValueError(f"its device is {data['device']!r}, not one of {', '.join(DEVICES)}")
        for name in PLANNED:
            if name not in ("inference", "worker_nice") and data[name] < 1:
                raise ValueError(f"its {name} is {data[name]}, not a count of at least 1")
        return cls(**data)


class Layout(NamedTuple):
    """The processes of one candidate layout."""
    workers: int
    envs: int
    inference: str
    policy_workers: int = 1
    learner_threads: int = 1


class Workload(NamedTuple):
    """What the run asks of any layout; `ahead` 0: sampling and learning take turns, -1: unbounded."""
    epochs: int = 1
    rollout: int = 32
    batch: int = 1024
    policies: int = 1
    agents: int = 1
    ahead: int = -1

    @classmethod
    def of(cls, cfg) -> "Workload":
        return cls(cfg.ppo_epochs, cfg.rollout, cfg.batch_size, cfg.num_policies, cfg.agents_per_game,
                   cfg.max_batches_ahead)


class Candidate(NamedTuple):
    predicted: dict
    layout: Layout


def _inference_costs(costs: Costs, layout: Layout, work: Workload) -> tuple:
    """(forward, comm) per sample: a local worker acts on one split of its envs (one policy's or
    agent's share) at a time; a policy worker batches one split of every worker over P."""
    split = max(1, layout.envs // splits_per_worker(layout.inference, work.policies, work.agents))
    if layout.inference == "local":
        return costs.forward(split), 0.0
    return costs.policy_worker_forward(max(split, layout.workers * split // layout.policy_workers)), costs.comm_s


def core_s_per_step(costs: Costs, layout: Layout, work: Workload) -> tuple:
    """(the actors', the learner's) core-seconds per agent step of one layout. A GPU policy
    worker's forward takes no core: it sleeps on a CUDA event (sampling/inference.py)."""
    forward, comm = _inference_costs(costs, layout, work)
    if costs.gpu and layout.inference == "policy_worker":
        forward = 0.0
    threads = layout.learner_threads
    return costs.env_s + forward + comm, threads * work.epochs * costs.train(threads)


def predict(costs: Costs, layout: Layout, work: Workload) -> dict:
    """Predicted rates (agent steps/s, all policies together) and lag of one layout (module doc)."""
    workers, envs, inference, policy_workers, threads = layout
    policies, ahead = work.policies, work.ahead
    forward, comm = _inference_costs(costs, layout, work)
    if inference == "local":
        production = workers / (costs.env_s + forward)
        processes = workers + policies
    else:
        production = min(workers / costs.env_s, policy_workers / (forward + comm))
        processes = workers + policy_workers + policies
    learn_wall = work.epochs * costs.train(threads)
    consumption = policies / learn_wall
    actors, learn = core_s_per_step(costs, layout, work)
    cores = costs.cores / (actors + learn)
    trained = min(production, consumption, cores)
    splits = splits_per_worker(inference, policies, work.agents)
    lag = workers * envs * work.rollout / (policies * work.batch) + 1
    if ahead >= 0 and splits == 1:
        lag = min(lag, ahead)
    elif ahead >= 0:
        # A worker's other splits each hold a buffer beyond the bound while it waits for a freed one.
        lag = min(lag, ahead + 1 + workers * (splits - 1) * work.rollout * (envs // splits) / (policies * work.batch))
    slowest = trained
    if ahead == 0:
        # Turns: a batch is sampled, then learned from, each with the cores to itself.
        sampling = min(production, costs.cores / actors)
        trained = 1.0 / (1.0 / sampling + 1.0 / consumption)
        cores = trained  # not a bound of its own: the two never compete for the cores
        slowest = min(production, consumption)
    gpu, gpu_bound = {}, False
    if costs.gpu:
        # One GPU runs every forward and learner step in turn; an eager learner's step counts whole
        # though its host leaves the GPU idle between kernels, so the bound errs low.
        device = 1.0 / ((forward if inference == "policy_worker" else 0.0) + learn_wall)
        gpu = {"gpu_steps_per_s": device}
        if device < trained:
            trained = slowest = device
            gpu_bound = True
    if gpu_bound:
        bottleneck = "gpu"
    elif slowest == consumption:
        bottleneck = "learner"
    elif slowest == production:
        bottleneck = "inference" if inference == "policy_worker" and production < workers / costs.env_s else "env"
    else:  # every core is busy: name the part that takes most of them
        shares = {"env": costs.env_s, "inference": actors - costs.env_s, "learner": learn}
        bottleneck = max(shares, key=shares.get)
    return {
        "production_steps_per_s": production,
        "consumption_steps_per_s": consumption,
        "cores_steps_per_s": cores,
        "trained_steps_per_s": trained,
        "lag_max_learner_steps": lag,
        "processes": processes,
        "bottleneck": bottleneck,
        "policies": policies,
        "schedule": "turns" if ahead == 0 else "overlapped",
        **gpu,
    }


def every_thread_has_a_core(costs: Costs, layout: Layout, work: Workload) -> bool:
    """Whether the layout's busy processes and learner threads fit the cores one each."""
    pw = layout.policy_workers if layout.inference == "policy_worker" else 0
    return layout.workers + pw + work.policies * layout.learner_threads <= costs.cores


def threads_get_cores(costs: Costs, predicted: dict, layout: Layout, work: Workload) -> bool:
    """Whether each learner thread past the first finds a core the actors, at the `predicted` rate,
    leave idle: a parallel region ends with its slowest thread, and one sharing a busy worker's
    core waits out its time slice, which the quiet profile cannot see."""
    if layout.learner_threads == 1 or work.ahead == 0 or every_thread_has_a_core(costs, layout, work):
        return True
    actors, _ = core_s_per_step(costs, layout, work)
    actors_busy = predicted["trained_steps_per_s"] * actors
    return actors_busy <= costs.cores - work.policies * layout.learner_threads + IDLE_ACTOR_CORES


def worker_nice(costs: Costs, layout: Layout, work: Workload) -> int:
    """The least rollout-worker niceness at which Linux's fair share gives the learner the share
    C * learn / (actors + learn) of the cores that `predict` assumes; at equal weights a learner
    short of it holds up the workers. 0 when every process has a core, or in turns."""
    pw = layout.policy_workers if layout.inference == "policy_worker" else 0
    learners = work.policies * layout.learner_threads
    if every_thread_has_a_core(costs, layout, work) or work.ahead == 0:
        return 0
    actors, learn = core_s_per_step(costs, layout, work)
    need = costs.cores * learn / (actors + learn)
    if learn <= actors and need / LEARNER_LOAD <= learners:
        need /= LEARNER_LOAD  # a cheap learner, idle at times: room, so that no batch waits for it
    need = min(learners, need)
    for nice in range(MAX_WORKER_NICE + 1):
        weight = NICE_STEP ** -nice  # the learners' threads and policy workers weigh 1 each
        share = costs.cores * learners / (learners + pw + layout.workers * weight)
        if share >= need:
            return nice
    return MAX_WORKER_NICE


@dataclass(frozen=True)
class Recall:
    """Earlier runs' factor on each measured mode's predictions, the modes due a retry, and whether
    enough runs were kept that a mode none of them measured is worth a try anyway (layout_memory)."""
    scales: dict = field(default_factory=dict)
    due: frozenset = frozenset()
    untried_due: bool = False


def scaled(predicted: dict, scale: float) -> dict:
    """`predicted` with the trained rate at `scale` of the model's, which is kept beside it."""
    return {**predicted, "trained_steps_per_s": predicted["trained_steps_per_s"] * scale,
            "model_trained_steps_per_s": predicted["trained_steps_per_s"], "measured_scale": scale}


def _candidates(costs: Costs, cfg, explicit: set) -> list:
    def allowed(name, values):
        return [getattr(cfg, name)] if name in explicit else values

    work = Workload.of(cfg)
    # Setting the policy workers' count or batching asks for policy workers.
    inference_options = (["policy_worker"] if explicit & {"num_policy_workers", "inference_batch_wait_ms"}
                         else list(INFERENCE_MODES))
    candidates = []
    max_workers = max(1, 2 * costs.cores)
    for inference in allowed("inference", inference_options):
        for workers in allowed("num_workers", list(range(1, max_workers + 1))):
            for envs in allowed("num_envs_per_worker", list(ENVS_PER_WORKER)):
                splits = splits_per_worker(inference, work.policies, work.agents)
                if envs % splits or cfg.batch_size % (cfg.rollout * envs // splits):
                    continue
                if cfg.max_batches_ahead >= 0 and workers * splits > dataclasses.replace(
                        cfg, num_workers=workers, num_envs_per_worker=envs, inference=inference,
                        num_buffers=0).total_buffers:
                    continue  # some workers would never hold a buffer while the others sample
                policy_options = [1] if inference == "local" else allowed(
                    "num_policy_workers", list(range(1, max(1, costs.cores) + 1)))
                for policy_workers in policy_options:
                    thread_options = ([cfg.learner_threads or cfg.torch_threads] if "learner_threads" in explicit
                                      else sorted(t for t in costs.train_s if t <= costs.cores))
                    for threads in thread_options:
                        layout = Layout(workers, envs, inference, policy_workers, threads)
                        p = predict(costs, layout, work)
                        if cfg.max_policy_lag and p["lag_max_learner_steps"] > cfg.max_policy_lag:
                            continue
                        if "learner_threads" not in explicit and not threads_get_cores(costs, p, layout, work):
                            continue
                        candidates.append(Candidate(p, layout))
    if not candidates:
        raise ValueError(
            f"no layout keeps the policy lag under --max_policy_lag {cfg.max_policy_lag} with batch {cfg.batch_size}; "
            "raise --max_policy_lag or --batch_size, or set the layout by hand")
    return candidates


def _best(candidates: list, costs: Costs, cfg) -> Candidate:
    """The candidate to run: within TIE of the best prediction, one whose actors outpace its learner
    (surplus actors block on free buffers, a starved learner wastes the costliest step), then the
    fewest processes and threads, the configured defaults, the least lag."""
    best = max(c.predicted["trained_steps_per_s"] for c in candidates)
    good = [c for c in candidates if c.predicted["trained_steps_per_s"] >= (1 - TIE) * best]

    def departures(c: Candidate) -> int:
        return ((c.layout.workers != cfg.num_workers) + (c.layout.envs != cfg.num_envs_per_worker)
                + (c.layout.inference != cfg.inference))

    def starves_learner(c: Candidate) -> bool:
        p = c.predicted
        if p["production_steps_per_s"] >= OUTPACE * p["consumption_steps_per_s"]:
            return False
        actors, learn = core_s_per_step(costs, c.layout, Workload.of(cfg))
        return p["production_steps_per_s"] <= p["cores_steps_per_s"] or learn > actors

    def preference(c: Candidate) -> tuple:
        return (starves_learner(c), c.predicted["processes"], c.layout.learner_threads, departures(c),
                c.predicted["lag_max_learner_steps"], -c.predicted["trained_steps_per_s"])

    return min(good, key=preference)


def _remembered(candidates: list, memory: Recall) -> list:
    """The candidates at their mode's measured scale; a mode unmeasured or due a retry is a trial
    at the median of the others' scales, since the profile's own errors weigh on every mode."""
    settled = {m: s for m, s in memory.scales.items() if m not in memory.due}
    borrowed = statistics.median(settled.values()) if settled else 1.0
    out = []
    for c in candidates:
        mode = c.layout.inference
        if mode in settled:
            p = scaled(c.predicted, settled[mode])
        else:
            p = {**scaled(c.predicted, borrowed), "untried" if mode not in memory.scales else "retry": True}
        out.append(c._replace(predicted=p))
    return out


def _is_trial(c: Candidate) -> bool:
    return bool(c.predicted.get("untried") or c.predicted.get("retry"))


def _worth_a_trial(c: Candidate, memory: Recall) -> bool:
    """Whether a trial mode near the best is run now: one due a retry; one never measured once
    enough runs passed, or at once when the measured mode fell far short of its model. A run
    that measured near its model gives no reason to spend the next one on a trial."""
    p = c.predicted
    return bool(p.get("retry") or (p.get("untried") and (memory.untried_due or p["measured_scale"] < DOUBT_BELOW)))


def choose(costs: Costs, cfg, explicit: set, memory: Optional[Recall] = None) -> Plan:
    """The best layout for `cfg` on these costs, keeping the options in `explicit` as the user set them.
    A trial mode within UNTRIED_MARGIN of the best is chosen, to be measured."""
    candidates = _candidates(costs, cfg, explicit)
    c = model_pick = _best(candidates, costs, cfg)
    if memory is not None and memory.scales:
        remembered = _remembered(candidates, memory)
        c = _best(remembered, costs, cfg)
        trials = [x for x in remembered if _worth_a_trial(x, memory)]
        if trials and not _is_trial(c):
            best = max(x.predicted["trained_steps_per_s"] for x in remembered)
            top = max(x.predicted["trained_steps_per_s"] for x in trials)
            if top >= (1 - UNTRIED_MARGIN) * best:
                c = _best([x for x in trials if x.predicted["trained_steps_per_s"] >= (1 - TIE) * top], costs, cfg)
        if c.layout != model_pick.layout:
            c.predicted["model_pick"] = {"layout": _describe_layout(model_pick.layout),
                                         "trained_steps_per_s": model_pick.predicted["trained_steps_per_s"]}
    chosen = c.layout
    # The pool a run of this layout gets by default (Config.total_buffers), unless the user set one.
    buffers = cfg.num_buffers if "num_buffers" in explicit else dataclasses.replace(
        cfg, num_workers=chosen.workers, num_envs_per_worker=chosen.envs, inference=chosen.inference,
        num_buffers=0).total_buffers
    nice = cfg.worker_nice if "worker_nice" in explicit else worker_nice(costs, chosen, Workload.of(cfg))
    return Plan(num_workers=chosen.workers, num_envs_per_worker=chosen.envs, inference=chosen.inference,
                num_policy_workers=chosen.policy_workers if chosen.inference == "policy_worker"
                else cfg.num_policy_workers,
                learner_threads=chosen.learner_threads, num_buffers=buffers, worker_nice=nice, predicted=c.predicted)


def _describe_layout(layout: Layout) -> str:
    return (f"{layout.workers} rollout worker(s) x {layout.envs} envs, inference {layout.inference}"
            + (f" ({layout.policy_workers} policy worker(s))" if layout.inference == "policy_worker" else ""))


def apply(cfg, plan: Plan):
    return dataclasses.replace(cfg, **plan.options())


def describe(plan: Plan, frameskip: int) -> str:
    p = plan.predicted
    layout = _describe_layout(Layout(plan.num_workers, plan.num_envs_per_worker, plan.inference,
                                     plan.num_policy_workers))
    nice = f", workers at nice {plan.worker_nice}" if plan.worker_nice else ""
    cores = ("sampling and learning in turns" if p.get("schedule") == "turns"
             else f"cores {p['cores_steps_per_s'] * frameskip:,.0f}")
    if "gpu_steps_per_s" in p:
        cores += f", GPU {p['gpu_steps_per_s'] * frameskip:,.0f}"
    model = (f"(production {p['production_steps_per_s'] * frameskip:,.0f}, "
             f"consumption {p['consumption_steps_per_s'] * frameskip:,.0f}, {cores}; {p['bottleneck']}-bound)")
    if "measured_scale" in p:
        if p.get("untried"):
            runs = (f"earlier runs of the other inference mode trained here (none here has measured {plan.inference} "
                    "inference yet)")
        elif p.get("retry"):
            runs = (f"earlier runs of the other inference mode trained here ({plan.inference} inference is tried "
                    "again: its runs here are old)")
        else:
            runs = f"earlier runs with {plan.inference} inference trained here"
        model = (f": the model's {p['model_trained_steps_per_s'] * frameskip:,.0f} {model} at "
                 f"{p['measured_scale']:.2f}x, as {runs};")
        if "model_pick" in p:
            pick = p["model_pick"]
            model += (f" the model alone would run {pick['layout']} at "
                      f"{pick['trained_steps_per_s'] * frameskip:,.0f};")
    else:
        model = f" {model},"
    return (f"plan: {layout}, learner on {plan.learner_threads} thread(s){nice}, {plan.num_buffers} buffers; "
            f"predicted {p['trained_steps_per_s'] * frameskip:,.0f} env frames/s trained{model} "
            f"policy lag <= {p['lag_max_learner_steps']:.1f} learner steps" + _per_policy(p, frameskip))


def _per_policy(p: dict, frameskip: int) -> str:
    """With several policies, what each gets and what bounds it, in plain words."""
    n = p.get("policies", 1)
    if n == 1:
        return ""
    each = p["trained_steps_per_s"] * frameskip / n
    if p["cores_steps_per_s"] <= min(p["production_steps_per_s"], p["consumption_steps_per_s"]):
        why = f"the cores are the limit: the {n} learners share them with the actors"
    elif p["consumption_steps_per_s"] <= p["production_steps_per_s"]:
        why = "each policy's learner is its limit"
    else:
        why = "the actors are the limit"
    return f"; {n} policies, each trained at ~{each:,.0f} env frames/s ({why})"


def save(plan: Plan, experiment_dir: str) -> str:
    path = os.path.join(experiment_dir, "plan.json")
    write_json(path, dataclasses.asdict(plan), indent=2)
    return path


def load(path: str) -> Plan:
    with open(path) as fh:
        return Plan.from_json(fh.read())


def measured_next_to_predicted(plan: Optional[Plan], trained_steps_per_s: float, frameskip: int) -> str:
    if plan is None:
        return ""
    predicted = plan.predicted["trained_steps_per_s"] * frameskip
    measured = trained_steps_per_s * frameskip
    return (f"planned {predicted:,.0f} env frames/s trained, measured {measured:,.0f} in the second half of the "
            f"training ({measured / predicted:.0%})")
