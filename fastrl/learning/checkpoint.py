"""Atomic, self-verifying checkpoint files.

A run can die at any instant (SIGKILL, power loss, full disk), and a resume must
never load half a file. So every checkpoint is written to a temp file in the target
directory, fsynced, renamed over its final name (atomic on POSIX), and the directory
is fsynced so the rename itself survives a crash. Renaming alone does not catch a
file damaged later (disk errors, a copy cut short), so each file starts with a header
carrying the payload's length and SHA-256; a load checks both before unpickling.

File layout: MAGIC (8 bytes) | payload length (uint64 LE) | sha256(payload) (32 bytes)
| payload (torch.save of the state dict).

Assumes one writer per checkpoint directory (the learner): stale temp files from a
killed writer are deleted by the next save.
"""

import hashlib
import io
import os
import re
import struct
import tempfile
import warnings
from typing import Optional, Tuple

import torch

MAGIC = b"FRLCKPT1"
_HEADER = struct.Struct("<8sQ32s")
_NAME_RE = re.compile(r"^checkpoint_(\d{12})\.pt$")
_TMP_PREFIX = ".tmp_"
_TMP_SUFFIX = ".partial"
BEST_NAME = "best.pt"
_CHUNK = 1 << 20


class CheckpointError(Exception):
    """A checkpoint file is missing, truncated, corrupt or unreadable."""


def checkpoint_dir(cfg) -> str:
    """Where an experiment's checkpoints live: <experiment>/checkpoints."""
    return os.path.join(cfg.experiment_dir, "checkpoints")


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_state(state) -> None:
    if not isinstance(state, dict):
        raise TypeError(
            f"A checkpoint state must be a dict (of tensors, dicts and numbers), got "
            f"{type(state).__name__}; wrap it, e.g. {{'model': model.state_dict()}}."
        )


def _atomic_write(path: str, state: dict) -> None:
    """torch.save `state` to `path` with the checksum header, atomically."""
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX)
    try:
        with os.fdopen(fd, "w+b") as f:
            # torch.save streams straight into the file instead of into memory first:
            # a model plus optimizer state is not held twice in RAM. The digest is
            # then computed by reading the payload back (from the page cache).
            f.write(b"\0" * _HEADER.size)
            torch.save(state, f)
            length = f.tell() - _HEADER.size
            f.seek(_HEADER.size)
            digest = hashlib.sha256()
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                digest.update(chunk)
            f.seek(0)
            f.write(_HEADER.pack(MAGIC, length, digest.digest()))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        # BaseException: a Ctrl-C mid-save must not leave a partial temp file either.
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)


def _list_checkpoints(ckpt_dir: str):
    """(step, path) of every checkpoint_<step>.pt in ckpt_dir, oldest first."""
    if not os.path.isdir(ckpt_dir):
        return []
    found = []
    for name in os.listdir(ckpt_dir):
        match = _NAME_RE.match(name)
        if match:
            found.append((int(match.group(1)), os.path.join(ckpt_dir, name)))
    return sorted(found)


def save_checkpoint(ckpt_dir: str, state: dict, name_step: int, keep: int) -> str:
    """Atomically write `state` as <ckpt_dir>/checkpoint_<name_step:012d>.pt.

    Afterwards only the newest `keep` checkpoints remain (by step number); the file
    just written is never deleted, even if older-numbered than the others. Returns
    the path written.
    """
    _check_state(state)
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep={keep!r} must be an int >= 1 (the number of checkpoints to retain).")
    if not isinstance(name_step, int) or not 0 <= name_step < 10**12:
        raise ValueError(f"name_step={name_step!r} must be an int in [0, 10**12) to fit the 12-digit name.")
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, f"checkpoint_{name_step:012d}.pt")
    _atomic_write(path, state)

    older = [p for _, p in _list_checkpoints(ckpt_dir) if p != path]
    for stale in older[: max(0, len(older) - (keep - 1))]:
        os.unlink(stale)
    for name in os.listdir(ckpt_dir):
        if name.startswith(_TMP_PREFIX) and name.endswith(_TMP_SUFFIX):
            os.unlink(os.path.join(ckpt_dir, name))
    return path


def save_best(ckpt_dir: str, state: dict, score: float) -> str:
    """Atomically write `state` plus {"best_score": score} as <ckpt_dir>/best.pt.

    Writes unconditionally: the caller decides what counts as a new best (it can
    read the previous score back with load_checkpoint(...)["best_score"]).
    """
    _check_state(state)
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, BEST_NAME)
    _atomic_write(path, {**state, "best_score": float(score)})
    return path


def load_checkpoint(path: str) -> dict:
    """Verify and load one checkpoint file onto the CPU.

    Raises CheckpointError naming the file and the problem when it is missing,
    truncated, fails its checksum or cannot be unpickled.
    """
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CheckpointError(f"Checkpoint {path} does not exist.") from None
    except OSError as err:
        raise CheckpointError(f"Checkpoint {path} cannot be opened: {err.strerror}.") from None
    with f:
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size:
            raise CheckpointError(
                f"Checkpoint {path} is truncated: {len(header)} bytes, shorter than its "
                f"{_HEADER.size}-byte header."
            )
        magic, length, expected = _HEADER.unpack(header)
        if magic != MAGIC:
            raise CheckpointError(f"Checkpoint {path} is not a fastrl checkpoint (its first bytes are {magic!r}).")
        payload = f.read(length)
        trailing = f.read(1)
    if len(payload) < length:
        raise CheckpointError(
            f"Checkpoint {path} is truncated: its header promises {length} payload bytes, "
            f"the file holds {len(payload)}."
        )
    if trailing:
        raise CheckpointError(f"Checkpoint {path} is corrupt: it has bytes past the {length}-byte payload.")
    if hashlib.sha256(payload).digest() != expected:
        raise CheckpointError(f"Checkpoint {path} is corrupt: its SHA-256 does not match the header.")
    try:
        # weights_only=False: these are our own files, verified above, and hold
        # plain Python numbers next to tensors. map_location="cpu" lets a GPU
        # checkpoint open anywhere; load_state_dict moves tensors to the model's device.
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means the same thing
        raise CheckpointError(
            f"Checkpoint {path} passed its checksum but could not be unpickled ({type(err).__name__}: {err})."
        ) from err
    return state


def load_latest_checkpoint(ckpt_dir: str) -> Tuple[Optional[dict], Optional[str]]:
    """Load the newest valid checkpoint in ckpt_dir: (state, path), or (None, None).

    Files that fail verification are skipped with a warning naming them, falling back
    to the next older one, so a crash mid-copy or a damaged disk block costs one
    checkpoint interval rather than the run.
    """
    for _, path in reversed(_list_checkpoints(ckpt_dir)):
        try:
            return load_checkpoint(path), path
        except CheckpointError as err:
            warnings.warn(f"Skipping unusable checkpoint: {err}", RuntimeWarning, stacklevel=2)
    return None, None
