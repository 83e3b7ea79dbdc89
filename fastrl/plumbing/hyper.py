"""Each policy's PBT hyperparameters in shared memory: the runner writes a policy's new
values (and maybe whose weights to take), its learner takes them before its next batch.
Lock-free like the parameters (plumbing/params.py): one writer and a sequence counter."""
from __future__ import annotations

import time
from typing import Optional, Sequence

import torch


class SharedHyper:
    def __init__(self, num_policies: int, names: Sequence[str]):
        self.names = tuple(names)
        self._values = torch.zeros(num_policies, len(self.names), dtype=torch.float64).share_memory_()
        self._source = torch.full((num_policies,), -1, dtype=torch.int64).share_memory_()
        self._epoch = torch.zeros(num_policies, dtype=torch.int64).share_memory_()

    def set(self, policy: int, values: dict, copy_from: Optional[int] = None) -> None:
        """Runner only: give `policy` these values and, with `copy_from`, that policy's weights."""
        self._epoch[policy] += 1
        self._values[policy] = torch.tensor([float(values[n]) for n in self.names], dtype=torch.float64)
        self._source[policy] = -1 if copy_from is None else copy_from
        self._epoch[policy] += 1

    def take(self, policy: int, known_epoch: int):
        """(epoch, values, copy_from or None) when `policy` was given something since
        `known_epoch`, else None."""
        while True:
            epoch = int(self._epoch[policy])
            if epoch == known_epoch:
                return None
            if epoch % 2:  # the runner is writing
                time.sleep(0.0005)
                continue
            values = dict(zip(self.names, self._values[policy].tolist()))
            source = int(self._source[policy])
            if int(self._epoch[policy]) == epoch:
                return epoch, values, (None if source < 0 else source)
