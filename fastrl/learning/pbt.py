"""Population-based training over a run's policies (Jaderberg et al. 2017): each
period the policies worst by the true objective take the weights of a better one and
a perturbed copy of its hyperparameters. Pure bookkeeping: the runner carries the
decisions to the learners and logs them to <experiment>/pbt.jsonl, from which a
resumed run rebuilds the population. Round r draws from a generator seeded by the
run's seed and r, so a resumed run makes the draws the uninterrupted one would have."""
from __future__ import annotations

import json
import math
import os
import random
from typing import List, Optional, Sequence

# What PBT moves, within BOUNDS. gamma moves by its horizon 1 / (1 - gamma), so it
# stays inside [0, 1].
HYPERPARAMETERS = ("lr", "entropy_coef", "gamma", "reward_scale")
BOUNDS = {"lr": (1e-6, 1e-2), "entropy_coef": (0.0, 0.1), "gamma": (0.9, 0.9999), "reward_scale": (1e-3, 1e3)}
LOG_NAME = "pbt.jsonl"


def perturb(value: float, name: str, factor: float, up: bool) -> float:
    """`value` of hyperparameter `name` moved one step up or down by `factor`, within BOUNDS."""
    low, high = BOUNDS[name]
    if name == "gamma":
        horizon = 1.0 / max(1.0 - value, 1e-9)
        moved = 1.0 - 1.0 / (horizon * factor if up else horizon / factor)
    else:
        moved = value * factor if up else value / factor
    return min(max(moved, low), high)


class Population:
    """Each policy's hyperparameters as the rounds so far left them, all starting at
    `base`. A round replaces max(1, floor(replace_fraction x P)) policies."""

    def __init__(self, base: dict, num_policies: int, replace_fraction: float, perturb_factor: float, seed: int):
        if num_policies < 2:
            raise ValueError(f"a population needs 2 or more policies, not {num_policies}")
        self.hyper: List[dict] = [{k: float(base[k]) for k in HYPERPARAMETERS} for _ in range(num_policies)]
        self.replace_fraction, self.factor, self.seed = replace_fraction, perturb_factor, seed
        self.rounds = 0

    @property
    def size(self) -> int:
        return len(self.hyper)

    def _rng(self, round_: int) -> random.Random:
        return random.Random(f"{self.seed}:{round_}")

    def _perturbed(self, hyper: dict, rng: random.Random) -> dict:
        return {k: perturb(v, k, self.factor, up=rng.random() < 0.5) for k, v in hyper.items()}

    def start(self) -> List[dict]:
        """Round 0: every policy but the first starts from perturbed hyperparameters,
        so that the population explores from the start. Its events."""
        rng = self._rng(0)
        events = [self._event(k, None, self._perturbed(self.hyper[k], rng), env_steps=0, objectives=None)
                  for k in range(1, self.size)]
        for e in events:
            self.apply(e)
        return events

    def ready(self, objectives: Sequence[Optional[float]]) -> bool:
        """Whether every policy has an objective to be ranked by (a finished episode)."""
        if len(objectives) != self.size:
            raise ValueError(f"{len(objectives)} objectives for a population of {self.size}")
        return not any(o is None or math.isnan(o) for o in objectives)

    def round(self, round_: int, objectives: Sequence[float], env_steps: int) -> List[dict]:
        """Round `round_`: each bottom-fraction policy whose objective is below a random
        top-fraction policy's takes its weights and perturbed hyperparameters. Returns
        one event per policy changed."""
        if not self.ready(objectives):
            raise ValueError("every policy needs an objective before a round")
        self.rounds = round_
        rng = self._rng(round_)
        n = max(1, int(self.replace_fraction * self.size))
        ranked = sorted(range(self.size), key=lambda k: (objectives[k], -k))  # worst first; ties: higher index worse
        top, bottom = ranked[-n:], ranked[:n]
        events = []
        for k in bottom:
            source = rng.choice(top)
            if objectives[source] <= objectives[k]:
                continue  # no better policy to learn from (all level)
            event = self._event(k, source, self._perturbed(self.hyper[source], rng), env_steps, objectives)
            self.apply(event)
            events.append(event)
        return events

    def _event(self, policy: int, source: Optional[int], hyper: dict, env_steps: int,
               objectives: Optional[Sequence[float]]) -> dict:
        return {"round": self.rounds, "env_steps": int(env_steps), "policy": policy, "copied_from": source,
                "objective": None if objectives is None else float(objectives[policy]),
                "source_objective": None if objectives is None or source is None else float(objectives[source]),
                "hyper": dict(hyper)}

    def apply(self, event: dict) -> None:
        self.hyper[event["policy"]] = dict(event["hyper"])
        self.rounds = max(self.rounds, int(event["round"]))

    def replay(self, events: Sequence[dict]) -> None:
        """Rebuild the population from a log's events, in order."""
        for e in events:
            if not 0 <= e["policy"] < self.size:
                raise ValueError(f"the PBT log names policy {e['policy']} but this run has {self.size} policies")
            self.apply(e)


def describe(event: dict) -> str:
    """One line for the console: what a PBT event changed."""
    hyper = ", ".join(f"{k} {v:.4g}" for k, v in event["hyper"].items())
    if event["copied_from"] is None:
        return f"PBT: policy {event['policy']} starts with {hyper}"
    return (f"PBT round {event['round']}: policy {event['policy']} (objective {event['objective']:.2f}) "
            f"takes the weights of policy {event['copied_from']} (objective {event['source_objective']:.2f}) "
            f"and {hyper}")


def read_log(path: str) -> List[dict]:
    """The events of a pbt.jsonl, in order; [] when there is none. A last line cut
    short by a crash is left out; any other damage is an error naming the line."""
    if not os.path.isfile(path):
        return []
    with open(path) as fh:
        text = fh.read()
    lines = text.split("\n")[:-1]  # every whole line ends with a newline; what follows the last is cut short
    events = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            raise ValueError(f"{path} line {i + 1} is not a PBT event; move the file away to start the "
                             "population afresh") from None
    return events


def append_log(path: str, events: Sequence[dict]) -> None:
    """Append events to a pbt.jsonl, each a whole line, flushed to the disk (a line
    a crash cut short, which read_log leaves out, is cut off first)."""
    if os.path.isfile(path):
        with open(path, "rb+") as fh:
            text = fh.read()
            if text and not text.endswith(b"\n"):
                fh.truncate(text.rfind(b"\n") + 1)
    with open(path, "a") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
