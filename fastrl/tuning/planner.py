"""The resource planner: choose the process layout that maximises trained
samples/s on this machine, with the policy lag bounded (TianJi's balance of
sample production against consumption).

The cost model, per agent step, in core-seconds measured by fastrl.tuning.profiling:
    env      one env step (no model)
    forward  one sample of inference at a given batch size
    train    one sample of one learner gradient pass (times ppo_epochs), in wall
             seconds per thread count t; its core cost is t times that
    comm     one policy-worker round trip per request (queues + copies), per sample
Rates it predicts, in agent steps/s, for W rollout workers of E envs:
    TR_A (production)   local:        W / (env + forward(E))
                        policy_worker: min(W / env, P / (forward(W*E/(2*P)) + comm))
    TR_L (consumption)  1 / (epochs * train[t])                  t = learner threads
                        (t > 1 only where the actors leave it cores: threads_get_cores)
    TR_C (the cores)    C / (env + forward + epochs * t * train[t] + comm)
    trained = min(TR_A, TR_L, TR_C)
(P policy workers share the requests, so each one's batch is about a split of
every worker over P.)
On a GPU (Costs.gpu) the learner's train cost and a policy worker's forward are
the GPU's wall seconds, timed on it. The learner keeps one core busy for as long
(its host launches the kernels one by one), so the formulas hold with learner
threads at 1; a policy worker sleeps while its forward runs, so TR_C counts only
its round trip (comm); local actors keep their CPU forward cost. And one GPU runs
all of it in turn: TR_G = 1 / (forward(W*E/(2*P)) + epochs * train) bounds trained.
TR_C is the limit when every process wants a core (processes > cores): then the
layout only decides how little is wasted, and the workers' niceness (worker_nice)
lets the kernel give the learner the share of the cores TR_C assumes. Lag: a
trajectory of T steps takes T * W * E / trained seconds to fill while the
learner takes trained / batch steps per second, so a sample is W * E * T / batch
learner steps old at most.

With N policies (--num_policies) there are N learners, each on its own 1/N of the
samples: TR_L is N times one learner's (if the cores allow, which TR_C says), a
worker has max(its splits, N) env groups, each forward acts for one of them (E / N
envs locally, W * E / N at a policy worker), and the lag counts the W * E / N envs
of one policy. N learners are N more busy processes: on a machine with few cores TR_C
is then the limit, and the plan line says what each policy gets.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from fastrl.config import splits_per_worker
from fastrl.plumbing.files import write_json

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
# The most of its fair share a cheap learner (one whose step costs less core time
# than the actors' part of a sample) may need before the workers give way: a
# learner busy whenever a batch waits lets batches queue and the policy lag rise.
# A costly learner is busy at any share and gets only what it needs
# (benchmarks/learning_suite.py measures the lag and time to score).
LEARNER_LOAD = 0.8
# How far the actors' predicted rate must pass the learner's for them to count as
# outpacing it: two coupled stages run below the slower one's rate when their rates
# are close, by more than the model sees (benchmarks/vs_sample_factory.py).
OUTPACE = 1.25
# How much of a core the actors may keep busy beside a learner's extra threads
# (threads_get_cores): a margin; every measured layout past it trained slower.
IDLE_ACTOR_CORES = 0.25
# How close to the best prediction a trial mode (one no run here has measured, or
# one due a retry) must come to be run: the model's error differs between the modes
# by more than its ties, so never trying the other mode can cost every later run.
UNTRIED_MARGIN = 0.15


@dataclass
class Costs:
    cores: int
    env_s: float  # core-seconds per env step
    forward_s: dict  # batch size -> core-seconds per sample of inference
    train_s: dict  # learner threads -> wall seconds per sample of one gradient pass
    comm_s: float = 50e-6  # per sample of a policy-worker round trip
    gpu: bool = False  # the learner and policy workers compute on a GPU; train_s is its wall time
    device_forward_s: dict = field(default_factory=dict)  # batch size -> GPU wall seconds per sample (gpu only)

    def train(self, threads: int) -> float:
        """Wall seconds per sample of a gradient pass on `threads` threads (the
        nearest measured thread count when that one was not measured)."""
        return self.train_s[min(self.train_s, key=lambda t: abs(t - threads))]

    def forward(self, batch: int) -> float:
        """Per-sample inference cost at `batch` on a core, interpolated in log-batch
        between measured sizes (held flat outside them)."""
        return _interpolate(self.forward_s, batch)

    def policy_worker_forward(self, batch: int) -> float:
        """Per-sample cost of a policy worker's forward at `batch`: on the GPU where
        there is one, else on a core."""
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

    def options(self) -> dict:
        return {k: getattr(self, k) for k in PLANNED}

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls(**json.loads(text))


class Layout(NamedTuple):
    """The processes of one candidate: W rollout workers of E envs, where inference
    runs, how many policy workers, the learner's threads."""
    workers: int
    envs: int
    inference: str  # "local" or "policy_worker"
    policy_workers: int = 1
    learner_threads: int = 1


class Workload(NamedTuple):
    """What the run asks of any layout: learner passes a sample, steps a trajectory,
    samples a batch, policies, learning agents a game, and Config.max_batches_ahead
    (0: sampling and learning take turns; -1: unbounded)."""
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
    """One layout `choose` considers, with its prediction."""
    predicted: dict  # as `predict` returns it
    layout: Layout


def _inference_costs(costs: Costs, layout: Layout, work: Workload) -> tuple:
    """(forward, comm) per sample: a local worker acts on one split of its envs at a
    time; a policy worker batches about one split of every worker, the requests
    spread over the policy workers. With several policies a split is one policy's
    share, and each forward one policy's; with several agents in a game, one agent's."""
    split = max(1, layout.envs // splits_per_worker(layout.inference, work.policies, work.agents))
    if layout.inference == "local":
        return costs.forward(split), 0.0
    return costs.policy_worker_forward(max(split, layout.workers * split // layout.policy_workers)), costs.comm_s


def core_s_per_step(costs: Costs, layout: Layout, work: Workload) -> tuple:
    """(the actors', the learner's) core-seconds per agent step of one layout: an env
    step with its forward and round trip, and the learner's passes on all its threads.
    A GPU policy worker's forward takes no core: it sleeps on a CUDA event while the
    GPU runs it (sampling/inference.py), its host work being the round trip."""
    forward, comm = _inference_costs(costs, layout, work)
    if costs.gpu and layout.inference == "policy_worker":
        forward = 0.0
    threads = layout.learner_threads
    return costs.env_s + forward + comm, threads * work.epochs * costs.train(threads)


def predict(costs: Costs, layout: Layout, work: Workload) -> dict:
    """Predicted rates (agent steps/s, all policies together) and lag of one layout;
    see the module doc."""
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
        # A worker's other splits keep a buffer each beyond the bound (Config.total_buffers),
        # held while the worker waits its turn for a freed one.
        lag = min(lag, ahead + 1 + workers * (splits - 1) * work.rollout * (envs // splits) / (policies * work.batch))
    slowest = trained
    if ahead == 0:
        # Turns: a batch is sampled, then learned from, each with the cores to itself;
        # the slower of the two holds the larger share of the time.
        sampling = min(production, costs.cores / actors)
        trained = 1.0 / (1.0 / sampling + 1.0 / consumption)
        cores = trained  # not a bound of its own: the two never compete for the cores
        slowest = min(production, consumption)
    gpu, gpu_bound = {}, False
    if costs.gpu:
        # One GPU runs every policy worker's forwards and every learner's steps, one
        # CUDA context at a time, however many processes feed it. Each learner's step
        # counts whole, though an eager one leaves the GPU idle while its host
        # launches kernels: the bound errs low.
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
        # "turns": sampling and learning alternate (--max_batches_ahead 0); else they overlap.
        "schedule": "turns" if ahead == 0 else "overlapped",
        **gpu,
    }


def every_thread_has_a_core(costs: Costs, layout: Layout, work: Workload) -> bool:
    """Whether the layout's busy processes and learner threads fit the cores one each."""
    pw = layout.policy_workers if layout.inference == "policy_worker" else 0
    return layout.workers + pw + work.policies * layout.learner_threads <= costs.cores


def threads_get_cores(costs: Costs, predicted: dict, layout: Layout, work: Workload) -> bool:
    """Whether a learner on its threads would find a core for each of them, with the
    actors computing at the `predicted` rate (predict's) beside it, or not beside it
    at all: where sampling and learning take turns (`ahead` 0), the workers wait
    while the learner trains.

    A parallel region ends when its slowest thread does, and a thread on a core that
    a busy worker holds waits out the worker's time slice, region after region. The
    quiet profile cannot see that, so beyond the first, a learner thread needs a core
    the actors leave idle, give or take IDLE_ACTOR_CORES."""
    if layout.learner_threads == 1 or work.ahead == 0 or every_thread_has_a_core(costs, layout, work):
        return True
    actors, _ = core_s_per_step(costs, layout, work)
    actors_busy = predicted["trained_steps_per_s"] * actors  # cores the actors keep busy
    return actors_busy <= costs.cores - work.policies * layout.learner_threads + IDLE_ACTOR_CORES


def worker_nice(costs: Costs, layout: Layout, work: Workload) -> int:
    """The least niceness of the rollout workers at which Linux's fair share gives
    the learner the part of the cores the cost model has it need, with room to
    spare (LEARNER_LOAD).

    The rates `predict` gives assume the cores are packed perfectly: the learner
    computes a share C * learn / (actors + learn) of them. The kernel does not know
    that share: with more runnable processes than cores it gives each a part in
    proportion to its weight, and a learner short of its share holds up the workers
    while part of a core idles. Lowering the workers' weight moves the share, and a
    worker that wants less than it is allowed loses nothing. Returns 0 when every
    process has a core of its own, or when sampling and learning take turns."""
    pw = layout.policy_workers if layout.inference == "policy_worker" else 0
    learners = work.policies * layout.learner_threads  # threads of all the learners
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
    """What earlier runs of a setup tell the plan (fastrl.tuning.layout_memory):
    {inference mode: factor on its predictions} for the modes runs measured here, and
    the modes ruled out long enough to be tried again."""
    scales: dict = field(default_factory=dict)
    due: frozenset = frozenset()


def scaled(predicted: dict, scale: float) -> dict:
    """`predicted` (as `predict` returns it) with the trained rate at `scale` of the
    model's, as earlier runs measured it here; the model's own rate kept beside it."""
    return {**predicted, "trained_steps_per_s": predicted["trained_steps_per_s"] * scale,
            "model_trained_steps_per_s": predicted["trained_steps_per_s"], "measured_scale": scale}


def _candidates(costs: Costs, cfg, explicit: set) -> list:
    """Every layout `cfg` allows on these costs, with the model's prediction."""
    def allowed(name, values):
        return [getattr(cfg, name)] if name in explicit else values

    work = Workload.of(cfg)
    # Setting the policy workers' count or batching asks for policy workers.
    inference_options = (["policy_worker"] if explicit & {"num_policy_workers", "inference_batch_wait_ms"}
                         else ["local", "policy_worker"])
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
    """The candidate to run: among those within TIE of the best prediction, the one
    whose actors outpace its learner, then the fewest processes and threads, the
    configured defaults, the least lag.

    Two coupled stages run below the slower one's rate when their rates are close,
    and surplus actors cost little (they block on free buffers) while a starved
    learner wastes the costliest step; where the cores are the limit, a worker more
    only adds lag (benchmarks/vs_sample_factory.py and learning_suite.py measure both)."""
    best = max(c.predicted["trained_steps_per_s"] for c in candidates)
    good = [c for c in candidates if c.predicted["trained_steps_per_s"] >= (1 - TIE) * best]

    def departures(c: Candidate) -> int:  # how many choices differ from the configured defaults
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
    """The candidates with their predictions at their mode's measured scale. A mode
    no run measured, or one due a retry, takes the median of the others' scales
    (the profile's own errors weigh on every mode) and is marked as a trial."""
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


def choose(costs: Costs, cfg, explicit: set, memory: Optional[Recall] = None) -> Plan:
    """The best layout for `cfg` on these costs. Options in `explicit` (set by the
    user) are kept as they are; lag must stay within cfg.max_policy_lag. `memory`:
    what earlier runs of this setup measured here.

    With a memory, each mode's predictions take its measured scale, and a trial mode
    (`_remembered`) whose best comes within UNTRIED_MARGIN of the best is chosen,
    to be measured. Where the memory moved the choice off the model's own, the plan
    says which layout the model alone would run (`predicted["model_pick"]`)."""
    candidates = _candidates(costs, cfg, explicit)
    c = model_pick = _best(candidates, costs, cfg)
    if memory is not None and memory.scales:
        remembered = _remembered(candidates, memory)
        c = _best(remembered, costs, cfg)
        trials = [x for x in remembered if _is_trial(x)]
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
