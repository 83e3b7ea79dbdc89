"""Naming the bottleneck from each component's busy, waiting and communicating shares.

In a pipeline the limiting stage never waits while the stages around it wait on it:
each component scores its active share (busy + comm) minus its waiting share, the
highest is the bottleneck, and the sentence quotes the waiting of the stage it holds
up as evidence. "balanced": the top two are both nearly always active with close
scores. "latency-bound": nothing is active half its time, so round trips lose it.

On a GPU run the learner and policy workers count as busy while waiting for kernels,
so when one of them tops the ranking the GPU's own share decides: at GPU_BOUND or
more the GPU is the bottleneck, else that process's host work. A full GPU does not
override rollout workers that hold the run up: the spans overstate the GPU's work.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

SATURATED = 0.5  # a component active less than this share of its time limits nobody
BALANCED_ACTIVE = 0.9  # both top components at least this active ...
BALANCED_SCORES = 0.05  # ... and their scores this close: neither holds the other up
COMM_WORTH_NAMING = 0.2  # communication share large enough to mention next to busy
OVERSUBSCRIBED = 1.05  # active core-equivalents over the cores (slack for timer noise)
OTHERS_WORTH_NAMING = 0.25  # cores used by other programs worth a warning
GPU_BOUND = 0.9  # the GPU's device time per wall second past which it limits the run
GPU_USERS = ("learner", "policy")  # the components that compute on the GPU on a GPU run


class _Role(NamedTuple):
    label: str  # when this component limits
    noun: str
    be: str
    doing: str  # what its busy time is spent on
    wait: str


_ROLES = {
    "rollout": _Role("env-bound", "rollout workers", "are", "stepping envs", "wait"),
    "policy": _Role("inference-bound", "policy workers", "are", "computing actions", "wait"),
    "learner": _Role("learner-bound", "the learner", "is", "training", "waits"),
    "sink": _Role("sink-bound", "the sink", "is", "freeing buffers", "waits"),
}
# Whose waiting shows that a component holds the others up, in order of preference.
_EVIDENCE = {"rollout": ("learner", "sink", "policy"), "policy": ("rollout",), "learner": ("rollout",),
             "sink": ("rollout",)}


def _pct(x: float) -> str:
    return f"{round(100 * x)}%"


def diagnose(fractions: dict, cores: Optional[float] = None, others_cores: Optional[float] = None,
             gpu_busy: Optional[float] = None) -> str:
    """One sentence naming the bottleneck. fractions: {component: {"busy", "wait",
    "comm", "count"}} for rollout, policy, learner, sink (no "policy": local
    inference). cores and others_cores add CPU contention and other programs' use to
    the sentence; gpu_busy is the GPU's device time per wall second on a GPU run."""
    unknown = set(fractions) - set(_ROLES)
    if unknown or not fractions:
        raise ValueError(f"fractions must name components among {sorted(_ROLES)}, got {sorted(fractions)}.")

    def get(c: str, key: str) -> float:
        return float(fractions[c].get(key, 0.0))

    active = {c: get(c, "busy") + get(c, "comm") for c in fractions}
    ranked = sorted(fractions, key=lambda c: active[c] - get(c, "wait"), reverse=True)
    top = ranked[0]
    role = _ROLES[top]
    if gpu_busy is not None and gpu_busy >= GPU_BOUND and top in GPU_USERS:
        waiters = " and ".join(_ROLES[c].noun for c in GPU_USERS if c in fractions)
        sentence = f"gpu-bound: the GPU is busy {_pct(gpu_busy)} of the time, and {waiters} wait for its kernels"
    elif active[top] < SATURATED:
        sentence = (f"latency-bound: no component is active half of its time (the busiest: {role.noun} {role.be} "
                    f"busy {_pct(get(top, 'busy'))}), so the time goes to round trips between them")
    elif (len(ranked) > 1 and min(active[top], active[ranked[1]]) >= BALANCED_ACTIVE
          and (active[top] - get(top, "wait")) - (active[ranked[1]] - get(ranked[1], "wait")) < BALANCED_SCORES):
        second = ranked[1]
        sentence = (f"balanced: {role.noun} (busy {_pct(get(top, 'busy'))}) and {_ROLES[second].noun} (busy "
                    f"{_pct(get(second, 'busy'))}) keep pace with each other, neither waits more than "
                    f"{_pct(max(get(top, 'wait'), get(second, 'wait')))}")
    else:
        doing = role.doing
        if top == "rollout" and "policy" not in fractions:
            doing = "stepping envs and computing their actions"
        sentence = f"{role.label}: {role.noun} {role.be} busy {_pct(get(top, 'busy'))} {doing}"
        if get(top, "comm") >= COMM_WORTH_NAMING:
            sentence += f" and {_pct(get(top, 'comm'))} moving data"
        waiter = next((c for c in _EVIDENCE[top] if c in fractions), None)
        if waiter:
            sentence += f", {_ROLES[waiter].noun} {_ROLES[waiter].wait} {_pct(get(waiter, 'wait'))}"
        if gpu_busy is not None and top in GPU_USERS:
            owner = role.noun + ("'" if role.noun.endswith("s") else "'s")
            sentence += f"; the GPU is busy only {_pct(gpu_busy)}, so it is {owner} host work that limits"
    if cores:
        demand = sum(active[c] * fractions[c].get("count", 1) for c in fractions)
        if demand > cores * OVERSUBSCRIBED:
            sentence += (f"; together the processes are active {demand:.1f} cores' worth on {cores:g} cores,"
                         " so they also wait for CPU")
    if others_cores is not None and others_cores >= OTHERS_WORTH_NAMING:
        of = f" of its {cores:g}" if cores else ""
        sentence += f"; other programs on this machine used {others_cores:.1f}{of} cores meanwhile"
    return sentence + "."
