"""Doom's action space: a MultiDiscrete of small heads built from the scenario's
buttons, each present only if its buttons are: move (none/forward/back), strafe,
attack, sprint, turn (11 angles with TURN_LEFT_RIGHT_DELTA, else none/left/right),
look, then a no/yes head per other binary button and a none/+/- head per other delta
button. Where a delta button and its binary twins both exist, only the one above is
used (doom_battle: [3, 3, 2, 2, 11]; doom_basic: [3, 2]). Delta values are per tic
and repeat for every skipped frame, so per-step angles are divided by the frameskip.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

# Degrees per agent step: fine aim near zero, fast turns at the ends.
TURN_ANGLES = (-20.0, -14.0, -9.0, -5.0, -2.0, 0.0, 2.0, 5.0, 9.0, 14.0, 20.0)
LOOK_DEGREES = 5.0  # per agent step
OTHER_DELTA_PER_TIC = 10.0  # other delta buttons (MOVE_*_DELTA): ViZDoom units per tic
# Scenarios with at most this many actions remember each action's button values.
MAX_REMEMBERED_ACTIONS = 65_536

_BINARY_TWINS = {  # delta button -> binary buttons that do the same motion
    "TURN_LEFT_RIGHT_DELTA": ("TURN_LEFT", "TURN_RIGHT"),
    "MOVE_LEFT_RIGHT_DELTA": ("MOVE_LEFT", "MOVE_RIGHT"),
    "MOVE_FORWARD_BACKWARD_DELTA": ("MOVE_FORWARD", "MOVE_BACKWARD"),
    "MOVE_UP_DOWN_DELTA": ("MOVE_UP", "MOVE_DOWN"),
}


@dataclass(frozen=True)
class ActionHead:
    name: str
    labels: tuple  # one per choice
    presses: tuple  # one per choice: ((button name, value), ...)

    @property
    def n(self) -> int:
        return len(self.labels)


def is_delta(button: str) -> bool:
    return button.endswith("_DELTA")


def build_heads(buttons: list, frameskip: int) -> list:
    """The action heads for a scenario with these available buttons (names)."""
    have = set(buttons)
    used = set()
    heads = []

    def binary_pair(name, neg_label, pos_label, neg, pos, none_label="none"):
        labels, presses = [none_label], [()]
        for label, button in ((neg_label, neg), (pos_label, pos)):
            if button in have:
                labels.append(label)
                presses.append(((button, 1.0),))
                used.add(button)
        if len(labels) > 1:
            heads.append(ActionHead(name, tuple(labels), tuple(presses)))

    binary_pair("move", "forward", "back", "MOVE_FORWARD", "MOVE_BACKWARD")
    binary_pair("strafe", "left", "right", "MOVE_LEFT", "MOVE_RIGHT")
    for name, button in (("attack", "ATTACK"), ("sprint", "SPEED")):
        if button in have:
            heads.append(ActionHead(name, ("no", "yes"), ((), ((button, 1.0),))))
            used.add(button)
    if "TURN_LEFT_RIGHT_DELTA" in have:
        labels = tuple(f"{a:+g}" for a in TURN_ANGLES)
        presses = tuple(((("TURN_LEFT_RIGHT_DELTA", a / frameskip),) if a else ()) for a in TURN_ANGLES)
        heads.append(ActionHead("turn", labels, presses))
        used.update(("TURN_LEFT_RIGHT_DELTA", "TURN_LEFT", "TURN_RIGHT"))
    else:
        binary_pair("turn", "left", "right", "TURN_LEFT", "TURN_RIGHT")
    if "LOOK_UP_DOWN_DELTA" in have:
        per_tic = LOOK_DEGREES / frameskip
        heads.append(ActionHead("look", ("none", "up", "down"),
                                ((), (("LOOK_UP_DOWN_DELTA", -per_tic),), (("LOOK_UP_DOWN_DELTA", per_tic),))))
        used.add("LOOK_UP_DOWN_DELTA")
    for delta, twins in _BINARY_TWINS.items():
        if delta in have and any(t in used for t in twins):
            used.add(delta)
    for button in buttons:
        if button in used:
            continue
        used.add(button)
        if is_delta(button):
            heads.append(ActionHead(button.lower(), ("none", "+", "-"),
                                    ((), ((button, OTHER_DELTA_PER_TIC),), ((button, -OTHER_DELTA_PER_TIC),))))
        else:
            heads.append(ActionHead(button.lower(), ("no", "yes"), ((), ((button, 1.0),))))
    return heads


class ActionMapper:
    """MultiDiscrete action -> the list of button values make_action wants."""

    def __init__(self, buttons: list, frameskip: int):
        self.buttons = list(buttons)
        self.heads = build_heads(self.buttons, frameskip)
        if not self.heads:
            raise ValueError("the scenario has no available buttons, so the agent could not act; add some to its .cfg")
        index = {b: i for i, b in enumerate(self.buttons)}
        self._rows = [[tuple((index[b], v) for b, v in choice) for choice in h.presses] for h in self.heads]
        self.nvec = np.array([h.n for h in self.heads], dtype=np.int64)
        # Each action's button values, built once and looked up per step (cheaper than
        # building the list); callers only read it. Skipped for huge action spaces.
        self._values: Optional[dict] = {} if int(np.prod(self.nvec)) <= MAX_REMEMBERED_ACTIONS else None

    def __call__(self, action) -> list:
        choices = tuple(np.asarray(action).reshape(-1).tolist())
        if self._values is None:
            return self._build(action, choices)
        values = self._values.get(choices)
        if values is None:
            values = self._values[choices] = self._build(action, choices)
        return values

    def _build(self, action, choices: tuple) -> list:
        if len(choices) != len(self._rows):
            raise ValueError(f"action {action!r} has {len(choices)} entries; "
                             f"this env takes {len(self._rows)} ({self.describe()})")
        values = [0.0] * len(self.buttons)
        for rows, c in zip(self._rows, choices):
            if not 0 <= c < len(rows):
                raise ValueError(f"action {action!r} is outside {self.describe()}")
            for i, v in rows[int(c)]:
                values[i] = v
        return values

    def describe(self) -> str:
        return ", ".join(f"{h.name}[{'/'.join(h.labels)}]" for h in self.heads)
