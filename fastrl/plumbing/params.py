"""Parameter publishing: the learner writes its flat parameter vector into one
shared tensor and bumps a version; readers copy it only when the version moved.

No OS semaphore is involved (a multiprocessing.Lock is a named /dev/shm
semaphore that a SIGKILLed runner would leak): one writer, the learner, and a
sequence counter, odd while a write is under way, let readers detect a torn
copy and retry. Writes happen once per learner step; readers copy only after
one, so a retry is rare and costs one more memcpy.
"""
from __future__ import annotations

import time

import torch


class SharedParams:
    def __init__(self, size: int):
        self.flat = torch.zeros(size, dtype=torch.float32).share_memory_()
        # [sequence, version]: sequence is odd while the learner is writing.
        self._state = torch.tensor([0, -1], dtype=torch.int64).share_memory_()

    @property
    def version(self) -> int:
        return int(self._state[1])

    def publish(self, flat: torch.Tensor, version: int) -> None:
        """Only one process (the learner; the runner before it starts) may publish."""
        self._state[0] += 1
        self.flat.copy_(flat)
        self._state[1] = version
        self._state[0] += 1

    def read_if_newer(self, known_version: int, out: torch.Tensor) -> int:
        """Copy the params into `out` if they are newer than `known_version`;
        return the version now held in `out`."""
        if int(self._state[1]) == known_version:
            return known_version
        while True:
            before = int(self._state[0])
            if before % 2:  # a write is under way
                time.sleep(0.0005)
                continue
            out.copy_(self.flat)
            version = int(self._state[1])
            if int(self._state[0]) == before:
                return version


class StopFlag:
    """A cross-process stop flag in shared memory: the semaphore-free twin of
    multiprocessing.Event for the one use here (set once, polled by loops)."""

    def __init__(self):
        self._flag = torch.zeros(1, dtype=torch.int8).share_memory_()

    def set(self) -> None:
        self._flag[0] = 1

    def is_set(self) -> bool:
        return bool(self._flag[0])

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.is_set() and time.monotonic() < deadline:
            time.sleep(min(0.01, timeout))
        return self.is_set()
