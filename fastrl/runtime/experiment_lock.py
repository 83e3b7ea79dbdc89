"""One run per experiment folder. Two runs on one folder (a double launch, a requeued job)
would rotate away each other's checkpoints, and a `--restart` would delete the ones the
other is writing, so a run holds a lock on <experiment>/run.lock from before it reads
the folder until it ends. The kernel drops the lock with its holder, even one killed by
SIGKILL, so a crash never leaves an experiment locked; the file holds the holder's pid,
for the sentence that refuses a second run. A POSIX record lock (lockf), not flock: a
forked child (a profile's timing process, say) does not inherit it, so a child that
outlives the run cannot keep the experiment locked after it.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from typing import Iterator, Optional

from fastrl.config import ConfigError

LOCK_NAME = "run.lock"


def _holder_pid(fd: int) -> Optional[int]:
    """The pid the holder wrote, or None while it has not written it yet."""
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _missing_folders(path: str) -> list:
    """The folders of `path` that do not exist yet, outermost first."""
    missing = []
    while path and not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    return missing[::-1]


class ExperimentLock:
    """The lock of one experiment folder, held by this process between acquire and release."""

    def __init__(self, experiment_dir: str):
        self.directory = os.path.abspath(experiment_dir)
        self.path = os.path.join(self.directory, LOCK_NAME)
        self._fd: Optional[int] = None
        self._made: list = []  # folders made for the lock, removed again if the run leaves them empty

    def acquire(self) -> None:
        """Take the lock, or raise ConfigError naming the run that holds it."""
        self._made = _missing_folders(self.directory)
        os.makedirs(self.directory, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                holder = _holder_pid(fd) if err.errno in (errno.EAGAIN, errno.EACCES) else None
                os.close(fd)
                self._remove_made_folders()
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise ConfigError(f"The experiment folder {self.directory} cannot be locked for this run "
                                      f"({err.strerror}); choose another --train_dir.") from None
                who = f"pid {holder}" if holder else "a process that is starting"
                raise ConfigError(f"The experiment {self.directory} is in use by another run ({who}); wait for it "
                                  "to end or stop it, or choose another --experiment.") from None
            # A holder unlinks the file as it releases it: locked, it must still be the file at the path.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Let go of the lock, removing its file (and the folders it made, if left empty)."""
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # while still held, so that no one waits on a file about to go
        os.close(self._fd)
        self._fd = None
        self._remove_made_folders()

    def _remove_made_folders(self) -> None:
        for folder in reversed(self._made):
            try:
                os.rmdir(folder)
            except OSError:
                break  # not empty: the run wrote there
        self._made = []


@contextlib.contextmanager
def experiment_locked(experiment_dir: str, hold: bool = True) -> Iterator[None]:
    """Hold the experiment's lock for the block; `hold=False` (a torchrun rank past 0, whose
    rank 0 holds it for the run) only runs the block."""
    if not hold:
        yield
        return
    lock = ExperimentLock(experiment_dir)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()
