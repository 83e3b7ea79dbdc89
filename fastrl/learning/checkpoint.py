"""Atomic, self-verifying checkpoint files that cannot run code.

Each file is written to a temp file, fsynced, renamed into place and the directory
fsynced, so a crash never leaves half a file. A header (MAGIC | payload length |
SHA-256) catches later damage: a damaged file is skipped for an older one
(CheckpointError). Checkpoints hold only tensors and plain data and load with
weights_only=True, so a file someone hands you cannot run code; an intact file the
unpickler refuses was written that way on purpose and is refused outright
(RefusedCheckpointError), never skipped. Two processes write into a checkpoint folder,
the learner (checkpoint_<step>.pt) and the evaluator (best.pt); each temp file carries
its writer's pid, and only a dead writer's are cleaned up, so neither removes the
other's half-written file.
"""

import contextlib
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

from fastrl.plumbing.files import writing

MAGIC = b"FRLCKPT1"
_HEADER = struct.Struct("<8sQ32s")
_NAME_RE = re.compile(r"^checkpoint_(\d{12})\.pt$")
_TMP_PREFIX = ".tmp_"
_TMP_SUFFIX = ".partial"
# .tmp_<writer's pid>-<random>.partial; older fastrl wrote .tmp_<random>.partial, without a pid
# (mkstemp's random part holds no "-").
_TMP_RE = re.compile(r"^\.tmp_(?:(\d+)-)?[^-]*\.partial$")
BEST_NAME = "best.pt"
_CHUNK = 1 << 20
# What torch.load(weights_only=True) rebuilds, so what _plain accepts.
_LEAVES = (bool, int, float, str, type(None))
_CONTAINERS = (dict, OrderedDict, list, tuple)


class CheckpointError(Exception):
    """A checkpoint that is missing, truncated or corrupt, so a resume falls back to
    an older one. str() is "Checkpoint PATH PROBLEM", for callers to add advice."""

    def __init__(self, path: str, problem: str):
        super().__init__(path, problem)  # both in args, so the exception pickles
        self.path, self.problem = path, problem

    def __str__(self) -> str:
        return f"Checkpoint {self.path} {self.problem}"


class UnreadableCheckpointError(CheckpointError):
    """A checkpoint the file system would not let us read (permissions, an I/O error): it may
    be whole, so rotation neither counts it as good nor deletes it as damaged."""


class RefusedCheckpointError(CheckpointError):
    """An intact checkpoint that does not load as tensors and plain data: it could run
    code, so it is never skipped silently."""


class UnsafeTorchError(RuntimeError):
    """This torch's weights-only loading can run code a checkpoint hides (torch < 2.6):
    no checkpoint is opened, whoever wrote it. One sentence, with the fix."""


# The first torch whose torch.load(weights_only=True) cannot be made to run code (CVE-2025-32434).
SAFE_LOADING_TORCH = (2, 6)


def check_torch_loads_safely() -> None:
    """UnsafeTorchError under a torch older than SAFE_LOADING_TORCH: setup.py asks for a newer one,
    but an install with --no-deps, or a torch replaced after fastrl, keeps the old one."""
    from torch.torch_version import TorchVersion

    if TorchVersion(torch.__version__) < SAFE_LOADING_TORCH:
        raise UnsafeTorchError(
            f"torch {torch.__version__} can run code hidden in a checkpoint as it loads it (fixed in torch 2.6), so "
            "fastrl opens no checkpoint with it; pip install 'torch>=2.6'.")


def checkpoint_root(cfg) -> str:
    """<experiment>/checkpoints: every policy's checkpoints live under it."""
    return os.path.join(cfg.experiment_dir, "checkpoints")


def checkpoint_dir(cfg, policy: int = 0) -> str:
    """<experiment>/checkpoints, or .../policy_<k> with several policies."""
    root = checkpoint_root(cfg)
    return root if cfg.num_policies == 1 else os.path.join(root, f"policy_{policy}")


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _plain(value, where: str):
    """`value` as plain data: numpy scalars become Python numbers, anything else not
    plain is a TypeError naming `where`. Unchanged containers come back as themselves,
    so a state_dict keeps its OrderedDict and _metadata."""
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


class NonFiniteStateError(ValueError):
    """A state holding a NaN or inf, which is never saved as good: every resume and
    restart would inherit it."""


def _nonfinite_entry(value, where: str) -> Optional[str]:
    """Where in `value` (plain data) a floating tensor holds a NaN or inf, or None."""
    if isinstance(value, torch.Tensor):
        finite = not (value.is_floating_point() or value.is_complex()) or bool(torch.isfinite(value).all())
        return None if finite else where
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    return next((found for k, v in items if (found := _nonfinite_entry(v, f"{where}[{k!r}]"))), None)


def _check_state(state) -> dict:
    """The state to save, as plain data (see _plain), every tensor of it finite,
    buffers such as the normalisers' statistics included."""
    if not isinstance(state, dict):
        raise TypeError(
            f"A checkpoint state must be a dict (of tensors, dicts and numbers), got "
            f"{type(state).__name__}; wrap it, e.g. {{'model': model.state_dict()}}."
        )
    state = _plain(state, "state")
    bad = _nonfinite_entry(state, "state")
    if bad:
        raise NonFiniteStateError(f"{bad} holds a NaN or inf, so it is not saved as a good checkpoint.")
    return state


class _WriteErrorKept:
    """A file's writer that keeps the OSError it raised: torch.save turns it into a
    RuntimeError that no longer says the disk was full."""

    def __init__(self, f):
        self._f = f
        self.error: Optional[OSError] = None

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        self._f.flush()


def _save_into(state: dict, f) -> None:
    """torch.save into the open file `f`, raising the file's own OSError if a write failed."""
    writer = _WriteErrorKept(f)
    try:
        torch.save(state, writer)
    except RuntimeError:
        if writer.error is not None:
            raise writer.error from None
        raise


def _atomic_write(path: str, state: dict) -> None:
    """torch.save `state` to `path` with the checksum header, atomically; DiskFullError
    (no temp file left) when the disk is full."""
    directory = os.path.dirname(path) or "."
    with writing(path, f"the checkpoint {os.path.basename(path)}"):
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f"{_TMP_PREFIX}{os.getpid()}-", suffix=_TMP_SUFFIX)
        try:
            with os.fdopen(fd, "w+b") as f:
                # torch.save streams into the file, so the state is not held twice in RAM;
                # the digest reads the payload back from the page cache.
                f.write(b"\0" * _HEADER.size)
                _save_into(state, f)
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
            # BaseException: a Ctrl-C mid-save must not leave a temp file either.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
    _fsync_dir(directory)


def _list_checkpoints(ckpt_dir: str):
    """(step, path) of every checkpoint_<step>.pt file, oldest first (folders excluded)."""
    if not os.path.isdir(ckpt_dir):
        return []
    found = []
    for entry in os.scandir(ckpt_dir):
        match = _NAME_RE.match(entry.name)
        if match and entry.is_file():
            found.append((int(match.group(1)), entry.path))
    return sorted(found)


# Files this process wrote or verified, with their fingerprint then, so rotation reads
# each file's checksum once, not at every save.
_verified: dict = {}


def _fingerprint(path: str) -> tuple:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns, info.st_ino


def _soundness(path: str) -> str:
    """"good" if `path` passes its checksum (read only if it changed since last verified),
    "damaged" if it fails it, "unreadable" if it could not be read to tell."""
    fingerprint = _fingerprint(path)
    if _verified.get(path) == fingerprint:
        return "good"
    try:
        _verified_payload(path)
    except UnreadableCheckpointError:
        return "unreadable"
    except CheckpointError:
        return "damaged"
    _verified[path] = fingerprint
    return "good"


def save_checkpoint(ckpt_dir: str, state: dict, name_step: int, keep: int) -> str:
    """Atomically write <ckpt_dir>/checkpoint_<name_step:012d>.pt and return its path.
    Afterwards only the newest `keep` good checkpoints remain, this one always among
    them; damaged files are deleted whatever their number, so they hold no slot, and files
    that cannot be read are left alone."""
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
        soundness = _soundness(other)
        if kept < keep - 1 and soundness == "good":
            kept += 1
            continue
        if soundness == "unreadable":
            continue  # perhaps whole: the permissions or the disk failed, not the file
        os.unlink(other)
        _verified.pop(other, None)
    _remove_dead_writers_temp_files(ckpt_dir)
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _remove_dead_writers_temp_files(ckpt_dir: str) -> None:
    """Delete the temp files whose writer is gone (killed mid-save): a live writer's,
    such as the evaluator's best.pt on its way, is left to it."""
    for name in os.listdir(ckpt_dir):
        match = _TMP_RE.match(name)
        if match and not (match.group(1) and _alive(int(match.group(1)))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(ckpt_dir, name))


def save_best(ckpt_dir: str, state: dict, score: float) -> str:
    """Atomically write `state` plus {"best_score": score} as <ckpt_dir>/best.pt; the
    caller decides what counts as a new best."""
    state = _check_state(state)
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, BEST_NAME)
    _atomic_write(path, {**state, "best_score": float(score)})
    return path


def load_checkpoint(path: str) -> dict:
    """Verify and load one checkpoint onto the CPU: CheckpointError if it is missing
    or damaged, RefusedCheckpointError if intact but not plain data, UnsafeTorchError
    under a torch that cannot load it safely."""
    check_torch_loads_safely()
    payload = _verified_payload(path)
    try:
        # On the CPU so a GPU checkpoint opens anywhere; load_state_dict moves tensors.
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - intact bytes that are not plain data all mean the same
        raise RefusedCheckpointError(path, _refusal(err)) from None
    if not isinstance(state, dict):
        raise RefusedCheckpointError(path, f"holds a {type(state).__name__}, not the dict a checkpoint is")
    return state


def _verified_payload(path: str) -> bytes:
    """The payload once header, length and checksum check out; else CheckpointError."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise CheckpointError(path, "does not exist") from None
    except OSError as err:
        raise UnreadableCheckpointError(path, f"cannot be opened: {err.strerror}") from None
    with f:
        try:
            header = f.read(_HEADER.size)
            if len(header) < _HEADER.size:
                raise CheckpointError(
                    path, f"is truncated: {len(header)} bytes, shorter than its {_HEADER.size}-byte header")
            magic, length, expected = _HEADER.unpack(header)
            if magic != MAGIC:
                raise CheckpointError(path, f"is not a fastrl checkpoint (its first bytes are {magic!r})")
            # Checked against the file's size before reading: a damaged header may claim exabytes.
            held = os.fstat(f.fileno()).st_size - _HEADER.size
            if length > held:
                raise CheckpointError(
                    path, f"is truncated: its header promises {length} payload bytes, the file holds {held}")
            payload = f.read(length)
            trailing = f.read(1)
        except OSError as err:
            raise UnreadableCheckpointError(path, f"cannot be read: {err.strerror}") from None
    if len(payload) < length:
        raise CheckpointError(
            path, f"is truncated: its header promises {length} payload bytes, the file holds {len(payload)}")
    if trailing:
        raise CheckpointError(path, f"is corrupt: it has bytes past the {length}-byte payload")
    if hashlib.sha256(payload).digest() != expected:
        raise CheckpointError(path, "is corrupt: its SHA-256 does not match the header")
    return payload


def _refusal(err: Exception) -> str:
    """Why an intact payload was refused, naming the global torch's unpickler refused."""
    needs = re.search(r"GLOBAL (\S+)", str(err))
    if needs:
        return f"holds more than tensors and plain data (it needs {needs.group(1)}), so loading it could run code"
    return f"is intact but does not load as tensors and plain data ({type(err).__name__})"


def load_latest_checkpoint(ckpt_dir: str) -> Tuple[Optional[dict], Optional[str]]:
    """(state, path) of the newest good checkpoint, or (None, None) if there is none.
    Damaged files are skipped with a warning; if every file is damaged this raises,
    as starting over would be the user's call. RefusedCheckpointError is never skipped.
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
