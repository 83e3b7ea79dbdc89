"""Parameter publishing: the learner writes its flat parameter vector into one shared
tensor and bumps a version; readers copy it only when the version moved.

No OS semaphore (a SIGKILLed runner would leak it): one writer and a sequence counter,
odd during a write, let readers detect a torn copy and retry.

On a GPU run the vector also lives in device memory shared by CUDA IPC, so policy
workers get weights device to device. The device copy stays out of SharedContext, as
receiving a CUDA tensor starts a CUDA context in every child; the runner hands it to
learners and policy workers apart (`device_copies`).
"""
from __future__ import annotations

import contextlib
import time

import torch

from fastrl.cuda.ipc import copy_and_wait, device_param_buffer


class SharedParams:
    """The flat vector of `size` floats; a CUDA `device` adds the device copy. Create it
    in the process that outlives every reader: CUDA IPC memory dies with its maker."""

    def __init__(self, size: int, device="cpu"):
        self.flat = torch.zeros(size, dtype=torch.float32).share_memory_()
        self.on_device = device_param_buffer(size, device) if torch.device(device).type == "cuda" else None
        # [sequence, version]: sequence is odd while the learner is writing.
        self._state = torch.tensor([0, -1], dtype=torch.int64).share_memory_()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "on_device": None}  # see the module doc

    @property
    def version(self) -> int:
        return int(self._state[1])

    def publish(self, flat: torch.Tensor, version: int) -> None:
        """Only one process (the learner; the runner before it starts) may publish."""
        self._state[0] += 1
        if self.on_device is not None:
            copy_and_wait(self.on_device, flat)  # done on the device before the sequence moves on
        self.flat.copy_(flat)  # from a GPU tensor, a blocking copy
        self._state[1] = version
        self._state[0] += 1

    def read_if_newer(self, known_version: int, out: torch.Tensor) -> int:
        """Copy the params into `out` if they are newer than `known_version`;
        return the version now held in `out`. A GPU `out` reads the device copy."""
        if int(self._state[1]) == known_version:
            return known_version
        source = self.on_device if out.is_cuda and self.on_device is not None else self.flat
        while True:
            before = int(self._state[0])
            if before % 2:  # a write is under way
                time.sleep(0.0005)
                continue
            copy_and_wait(out, source)
            version = int(self._state[1])
            if int(self._state[0]) == before:
                return version


@contextlib.contextmanager
def device_copies(params: list, copies: list | None):
    """Within it, `params` read and publish through `copies`, the runner's device
    tensors handed to the child apart. On leaving they are released and `copies`
    emptied, as the Process argument would otherwise hold them past teardown and the
    runner would warn at exit. None: a CPU run."""
    if copies is None:
        yield
        return
    for p, copy in zip(params, copies):
        p.on_device = copy
    try:
        yield
    finally:
        for p in params:
            p.on_device = None
        copies.clear()


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
