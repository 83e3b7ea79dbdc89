"""Parameter publishing: the learner writes its flat parameter vector into one
shared tensor and bumps a version; readers copy it only when the version moved.

No OS semaphore is involved (a multiprocessing.Lock is a named /dev/shm
semaphore that a SIGKILLed runner would leak): one writer, the learner, and a
sequence counter, odd while a write is under way, let readers detect a torn
copy and retry. Writes happen once per learner step; readers copy only after
one, so a retry is rare and costs one more memcpy.

On a GPU run the vector also lives in device memory, shared with the other
processes by CUDA IPC (fastrl.cuda.ipc): the learner's weights reach the GPU
policy workers by two device-to-device copies, with no trip through the host.
The host copy stays for the readers that compute on a CPU (local actors, the
evaluator): one device-to-host copy per version, about a millisecond for the
Doom model's 2.9M weights. The device copy does not travel inside the shared
context, which every child gets: receiving a CUDA tensor starts CUDA in the
receiver (a context of some hundred MB of GPU memory and a second or more of
start-up in each of dozens of rollout workers that never compute on the GPU).
The runner hands it to the learners and policy workers apart (`device_copies`).
"""
from __future__ import annotations

import contextlib
import time

import torch

from fastrl.cuda.ipc import copy_and_wait, device_param_buffer


class SharedParams:
    """Args: size, the flat vector's length; device, where the learner and policy
    workers compute: a CUDA device adds the device copy. Create it in the process
    that outlives every reader (the runner): CUDA IPC memory dies with its maker."""

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
    """Within it, `params` (a child's, unpickled without their device copies) read
    and publish through `copies`, the runner's device tensors, given to the child
    apart; on leaving, the child lets go of them, so that the runner, which made
    them, sees every mapping of its memory released. None: a CPU run, nothing to do.

    Letting go includes emptying `copies`: it is the child's Process argument, which
    would otherwise hold the tensors until the interpreter's teardown, where they
    may never be freed, and the runner then warns at its exit ("Producer process has
    been terminated before all shared CUDA tensors released", printed by every GPU
    run of the twenty-third session)."""
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
