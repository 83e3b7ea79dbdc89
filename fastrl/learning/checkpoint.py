"""Atomic, self-verifying checkpoint files that cannot run code.

A run can die at any instant (SIGKILL, power loss, full disk), and a resume must
never load half a file. So every checkpoint is written to a temp file in the target
directory, fsynced, renamed over its final name (atomic on POSIX), and the directory
is fsynced so the rename itself survives a crash. Renaming alone does not catch a
file damaged later (disk errors, a copy cut short), so each file starts with a header
carrying the payload's length and SHA-256; a load checks both before unpickling.

A checkpoint holds only tensors and plain data (dicts, lists and tuples of str, int,
float, bool and None), and is read with torch.load(weights_only=True), whose
unpickler builds nothing else: a checkpoint someone hands you cannot run code when
fastrl opens it. The checksum cannot promise that, since whoever writes a payload
writes its checksum too; what it tells apart is damage from intent. A file failing
its checksum was damaged after it was written, and a resume skips it for an older
one (CheckpointError); an intact file the unpickler refuses was written that way,
and is refused outright (RefusedCheckpointError), never skipped: someone put it there.
Saving converts numpy scalars to Python numbers and refuses anything else that is
not plain data, so a file fastrl writes always loads.

File layout: MAGIC (8 bytes) | payload length (uint64 LE) | sha256(payload) (32 bytes)
| payload (torch.save of the state dict).

Assumes one writer per checkpoint directory (the learner): stale temp files from a
killed writer are deleted by the next save.
"""

import copy
import hashlib
import io
import os
import re
import struct
import tempfile
import warnings
from collections import OrderedDict
from typing import Optional, Tuple

import numpy as np
import torch

MAGIC = b"FRLCKPT1"
_HEADER = struct.Struct("<8sQ32s")
_NAME_RE = re.compile(r"^checkpoint_(\d{12})\.pt$")
_TMP_PREFIX = ".tmp_"
_TMP_SUFFIX = ".partial"
BEST_NAME = "best.pt"
_CHUNK = 1 << 20
# Leaves and containers that torch.load(weights_only=True) rebuilds; what _plain accepts.
_LEAVES = (bool, int, float, str, type(None))
_CONTAINERS = (dict, OrderedDict, list, tuple)


class CheckpointError(Exception):
    """A checkpoint file that is missing, truncated, corrupt or unreadable: damaged,
    so a resume falls back to an older one. str() is one clause without a full
    stop, "Checkpoint PATH PROBLEM", for callers to end with their own advice."""

    def __init__(self, path: str, problem: str):
        super().__init__(path, problem)  # both in args: the exception pickles across processes
        self.path, self.problem = path, problem

    def __str__(self) -> str:
        return f"Checkpoint {self.path} {self.problem}"


class RefusedCheckpointError(CheckpointError):
    """An intact checkpoint file that does not load as tensors and plain data: loading
    it any further could run code, so nothing skips it silently."""


def checkpoint_dir(cfg, policy: int = 0) -> str:
    """Where an experiment's checkpoints live: <experiment>/checkpoints, and with
    several policies each policy's in <experiment>/checkpoints/policy_<k>."""
    root = os.path.join(cfg.experiment_dir, "checkpoints")
    return root if cfg.num_policies == 1 else os.path.join(root, f"policy_{policy}")


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _plain(value, where: str):
    """`value` as data torch.load(weights_only=True) rebuilds: numpy scalars become
    Python numbers (np.float32(0.5) pickles as a numpy object, which that loader
    refuses), anything else that is not plain data is a TypeError naming `where`.
    A container comes back as itself when nothing in it changed, so a model's
    state_dict keeps its OrderedDict and the _metadata attribute on it."""
    if isinstance(value, torch.Tensor) or type(value) in _LEAVES:
        return value
    if isinstance(value, np.generic):
        return value.item()
    if type(value) not in _CONTAINERS:
        raise TypeError(
            f"Checkpoint value {where} is a {type(value).__module__}.{type(value).__qualname__}; a checkpoint holds "
            "only tensors, numbers, strings, None and dicts, lists or tuples of them, so that it loads without "
            "running code: convert it to one of those.")
    if isinstance(value, dict):
        for key in value:
            if type(key) not in _LEAVES:
                raise TypeError(f"Checkpoint key {key!r} in {where} is a {type(key).__name__}; use a str or int key.")
        converted = {k: _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
        if all(converted[k] is v for k, v in value.items()):
            return value
        out = copy.copy(value)  # keeps the dict's type and attributes
        out.update(converted)
        return out
    converted = [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if all(c is v for c, v in zip(converted, value)):
        return value
    return type(value)(converted)


def _check_state(state) -> dict:
    """The state to save, as plain data (see _plain)."""
    if not isinstance(state, dict):
        raise TypeError(
            f"A checkpoint state must be a dict (of tensors, dicts and numbers), got "
            f"{type(state).__name__}; wrap it, e.g. {{'model': model.state_dict()}}."
        )
    return _plain(state, "state")


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
    """(step, path) of every checkpoint_<step>.pt file in ckpt_dir, oldest first. A
    folder of that name is no checkpoint, and rotation could not delete it."""
    if not os.path.isdir(ckpt_dir):
        return []
    found = []
    for entry in os.scandir(ckpt_dir):
        match = _NAME_RE.match(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry.path))
    return sorted(found)


# Checkpoint files this process wrote or verified, each with the fingerprint it had
# then: the checksum of a file rotation keeps is read once, not at every save (a
# keep of 50 large checkpoints would read them all each time).
_verified: dict = {}


def _fingerprint(path: str) -> tuple:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns, info.st_ino


def _is_good(path: str) -> bool:
    """Whether checkpoint `path` passes its checksum, read only if it changed since
    this process last found it good."""
    fingerprint = _fingerprint(path)
    if _verified.get(path) == fingerprint:
        return True
    try:
        _verified_payload(path)
    except CheckpointError:
        return False
    _verified[path] = fingerprint
    return True


def save_checkpoint(ckpt_dir: str, state: dict, name_step: int, keep: int) -> str:
    """Atomically write `state` as <ckpt_dir>/checkpoint_<name_step:012d>.pt.

    Afterwards only the newest `keep` good checkpoints remain (by step number); the
    file just written is never deleted, even if older-numbered than the others.
    Returns the path written.

    Damaged checkpoints are deleted whatever their number, and count for nothing.
    One a resume skipped would otherwise stay: numbered above the resumed run's
    files, it would hold a slot for good while the good checkpoints beside it
    rotated out, or, below them, hold one of the `keep` slots meant for good ones.
    Telling good from damaged takes reading a file for its checksum, which each
    process does once per file: its own files are known good, and a file verified
    once is not read again while it is unchanged (see _is_good).
    """
    state = _check_state(state)
    if not isinstance(keep, int) or keep < 1:
        raise ValueError(f"keep={keep!r} must be an int >= 1 (the number of checkpoints to retain).")
    if not isinstance(name_step, int) or not 0 <= name_step < 10**12:
        raise ValueError(f"name_step={name_step!r} must be an int in [0, 10**12) to fit the 12-digit name.")
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, f"checkpoint_{name_step:012d}.pt")
    _atomic_write(path, state)

    _verified[path] = _fingerprint(path)
    kept = 0
    for _, other in reversed(_list_checkpoints(ckpt_dir)):
        if other == path:
            continue
        if kept < keep - 1 and _is_good(other):
            kept += 1
            continue
        os.unlink(other)
        _verified.pop(other, None)
    for name in os.listdir(ckpt_dir):
        if name.startswith(_TMP_PREFIX) and name.endswith(_TMP_SUFFIX):
            os.unlink(os.path.join(ckpt_dir, name))
    return path


def save_best(ckpt_dir: str, state: dict, score: float) -> str:
    """Atomically write `state` plus {"best_score": score} as <ckpt_dir>/best.pt.

    Writes unconditionally: the caller decides what counts as a new best (it can
    read the previous score back with load_checkpoint(...)["best_score"]).
    """
    state = _check_state(state)
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, BEST_NAME)
    _atomic_write(path, {**state, "best_score": float(score)})
    return path


def load_checkpoint(path: str) -> dict:
    """Verify and load one checkpoint file onto the CPU, as tensors and plain data only.

    Raises CheckpointError naming the file and the problem when it is missing,
    truncated or fails its checksum, and RefusedCheckpointError when it is intact
    but is not a dict of tensors and plain data.
    """
    payload = _verified_payload(path)
    try:
        # map_location="cpu" lets a GPU checkpoint open anywhere; load_state_dict
        # moves tensors to the model's device.
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - intact bytes that are not plain data all mean the same
        raise RefusedCheckpointError(path, _refusal(err)) from None
    if not isinstance(state, dict):
        raise RefusedCheckpointError(path, f"holds a {type(state).__name__}, not the dict a checkpoint is")
    return state


def _verified_payload(path: str) -> bytes:
    """The payload of checkpoint file `path` once its header, length and checksum
    check out; CheckpointError naming the problem otherwise."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CheckpointError(path, "does not exist") from None
    except OSError as err:
        raise CheckpointError(path, f"cannot be opened: {err.strerror}") from None
    with f:
        header = f.read(_HEADER.size)
        if len(header) < _HEADER.size:
            raise CheckpointError(
                path, f"is truncated: {len(header)} bytes, shorter than its {_HEADER.size}-byte header")
        magic, length, expected = _HEADER.unpack(header)
        if magic != MAGIC:
            raise CheckpointError(path, f"is not a fastrl checkpoint (its first bytes are {magic!r})")
        payload = f.read(length)
        trailing = f.read(1)
    if len(payload) < length:
        raise CheckpointError(
            path, f"is truncated: its header promises {length} payload bytes, the file holds {len(payload)}")
    if trailing:
        raise CheckpointError(path, f"is corrupt: it has bytes past the {length}-byte payload")
    if hashlib.sha256(payload).digest() != expected:
        raise CheckpointError(path, "is corrupt: its SHA-256 does not match the header")
    return payload


def _refusal(err: Exception) -> str:
    """Why an intact payload was refused. torch names the first thing its unpickler
    would not build as "GLOBAL module.name"; that name is worth showing (exec,
    posix.system), and its absence (a payload that is not a pickle) is said too."""
    needs = re.search(r"GLOBAL (\S+)", str(err))
    if needs:
        return f"holds more than tensors and plain data (it needs {needs.group(1)}), so loading it could run code"
    return f"is intact but does not load as tensors and plain data ({type(err).__name__})"


def load_latest_checkpoint(ckpt_dir: str) -> Tuple[Optional[dict], Optional[str]]:
    """Load the newest good checkpoint in ckpt_dir: (state, path), or (None, None)
    when it holds no checkpoint file.

    Damaged files are skipped for the next older one, each named in a warning, so a
    crash mid-copy or a damaged disk block costs one checkpoint interval rather than
    the run (and the next save_checkpoint deletes them). When every file is damaged
    this raises CheckpointError instead of returning (None, None): starting over
    would throw away the whole run, which is the user's call. A
    RefusedCheckpointError is raised, never skipped.
    """
    damaged = []
    for _, path in reversed(_list_checkpoints(ckpt_dir)):
        try:
            state = load_checkpoint(path)
        except RefusedCheckpointError:
            raise
        except CheckpointError as err:
            damaged.append(err)
            continue
        for err in damaged:
            warnings.warn(f"Skipping unusable checkpoint: {err}; using the older {os.path.basename(path)}.",
                          RuntimeWarning, stacklevel=2)
        return state, path
    if damaged:
        newest, older = damaged[0], len(damaged) - 1
        rest = f"the {older} older one(s) beside it are damaged too" if older else "there is no older one"
        raise CheckpointError(newest.path, f"{newest.problem}, and {rest}")
    return None, None
