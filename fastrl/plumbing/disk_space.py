"""Room on the experiment's disk for a run to end well: each policy's next checkpoint, the
evaluator's best.pt and the last reports. Start-up refuses a run without that room, and a
run left without it (its own logs, or another program, filled the disk) stops while its
final checkpoint still fits, rather than meeting a full disk mid-write."""
from __future__ import annotations

import os

from fastrl.plumbing.files import free_bytes

# summary.json and the last TensorBoard and W&B reports, with room to spare.
SLACK_BYTES = 8 << 20
# A checkpoint holds the weights and Adam's two moments of each, plus the pickle's framing
# (a CartPole model's 37 KB of weights make a 132 KB checkpoint).
CHECKPOINT_FRAMING_BYTES = 256 << 10
MB = 1 << 20


def state_bytes(model) -> int:
    """Bytes of a model's weights and buffers."""
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def bytes_needed(models: list, evaluates: bool) -> int:
    """What the run must be able to write before it ends: one checkpoint per policy (a
    new one is written before the oldest is rotated away), best.pt, and SLACK_BYTES."""
    checkpoints = sum(3 * state_bytes(model) + CHECKPOINT_FRAMING_BYTES for model in models)
    best = state_bytes(models[0]) if evaluates else 0
    return checkpoints + best + SLACK_BYTES


def folder_bytes(folder: str) -> int:
    """Bytes of the files under `folder` (0 where it does not exist)."""
    total = 0
    for where, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(where, name)).st_size
            except OSError:
                pass  # gone meanwhile
    return total


def shortfall_at_start(folder: str, need: int, freed: int = 0) -> str:
    """Why a run writing to `folder` cannot start, or "": fewer than `need` bytes free,
    counting `freed` bytes that it deletes first (--restart's old checkpoints)."""
    free = free_bytes(folder) + freed
    if free >= need:
        return ""
    return (f"The disk holding {folder} has {free / MB:,.1f} MB free, under the {need / MB:,.1f} MB this run needs "
            "to write its checkpoints and reports; free space there or choose another --train_dir.")


def shortfall_now(folder: str, need: int) -> str:
    """Why a running run must stop now to end well, or "": fewer than `need` bytes left."""
    free = free_bytes(folder)
    if free >= need:
        return ""
    return (f"the disk holding {folder} has {free / MB:,.1f} MB left, under the {need / MB:,.1f} MB this run needs "
            "to write its final checkpoint and reports, so it stops now; free space there, then run the command "
            "again to resume")
