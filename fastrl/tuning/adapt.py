"""Adapting the plan while training. Free-buffer throttling matches production to
consumption but cannot move idle cores to the side that needs them; this moves the
learner's thread count: rollout workers blocked on free buffers while the learner is
busy give it a thread, a learner waiting for data gives one back.
"""
from __future__ import annotations

import torch

WAIT_HIGH = 0.30  # a side waiting this much of the window has cores to give
BUSY_HIGH = 0.80  # the other side this busy can use them
SETTLE_WINDOWS = 2  # windows to wait after a change before judging again


class ThreadAdapter:
    def __init__(self, board, num_workers: int, cores: int, start_threads: int):
        self.board = board
        self.num_workers = num_workers
        self.cores = cores
        self.target = torch.tensor([start_threads], dtype=torch.int64).share_memory_()  # read by the learner
        self.floor = start_threads
        self._last = None
        self._settle = 0

    @property
    def threads(self) -> int:
        return int(self.target[0])

    def _totals(self):
        b = self.board
        return (b.total("wait_s", "rollout_"), b.get("learner", "busy_s"), b.get("learner", "wait_s"))

    def update(self, now: float):
        """Judge the window since the last call; return a sentence when it changed
        the learner's threads, else None."""
        totals = self._totals()
        if self._last is None:
            self._last = (now, totals)
            return None
        (then, before), self._last = self._last, (now, totals)
        dt = now - then
        if dt <= 0:
            return None
        worker_wait = (totals[0] - before[0]) / (dt * self.num_workers)
        learner_busy = (totals[1] - before[1]) / dt
        learner_wait = (totals[2] - before[2]) / dt
        if self._settle:
            self._settle -= 1
            return None
        old = self.threads
        if worker_wait > WAIT_HIGH and learner_busy > BUSY_HIGH and old < self.cores:
            new = old + 1
            why = (f"rollout workers wait {worker_wait:.0%} for free buffers "
                   f"while the learner is busy {learner_busy:.0%}")
        elif learner_wait > WAIT_HIGH and old > self.floor:
            new = old - 1
            why = f"the learner waits {learner_wait:.0%} for trajectories"
        else:
            return None
        self.target[0] = new
        self._settle = SETTLE_WINDOWS
        return f"adapt: {why}; learner threads {old} -> {new}"
