"""Parameter publishing: the learner writes its flat parameter vector into one
shared tensor and bumps a version; readers copy it only when the version moved."""
from __future__ import annotations

import torch


class SharedParams:
    """One flat float32 tensor of the model's parameters and float buffers, with
    a version counter. A lock makes a reader's copy consistent; it is held only
    for one memcpy, and readers take it only when the version has moved."""

    def __init__(self, size: int, lock):
        self.flat = torch.zeros(size, dtype=torch.float32).share_memory_()
        self._version = torch.full((1,), -1, dtype=torch.int64).share_memory_()
        self._lock = lock

    @property
    def version(self) -> int:
        return int(self._version[0])

    def publish(self, flat: torch.Tensor, version: int) -> None:
        with self._lock:
            self.flat.copy_(flat)
            self._version[0] = version

    def read_if_newer(self, known_version: int, out: torch.Tensor) -> int:
        """Copy the params into `out` if they are newer than `known_version`;
        return the version now held in `out`."""
        if int(self._version[0]) == known_version:
            return known_version
        with self._lock:
            out.copy_(self.flat)
            return int(self._version[0])
