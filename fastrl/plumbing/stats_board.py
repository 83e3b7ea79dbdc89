"""A shared table of counters, one row per process. Each process writes only its own
row, so no lock: a reader may see a row mid-update, an error of one step at most."""
from __future__ import annotations

import time

import torch

FIELDS = (
    "heartbeat",          # time.time() of the row owner's last loop
    "env_steps",          # agent steps taken (rollout workers)
    "env_frames",         # env frames = agent steps x frameskip (rollout workers)
    "busy_s",             # seconds computing (env steps, forward, backward)
    "wait_s",             # seconds blocked waiting for work or for a free buffer
    "comm_s",             # seconds moving data: queue ops, copies in and out of shared memory
    "gpu_s",              # GPU seconds of the learner's steps or the policy workers' forwards (fastrl.cuda.timing)
    "h2d_s",              # GPU seconds uploading batches to the device (learner)
    "d2h_s",              # GPU seconds copying actions back to the host (policy workers)
    "sync_s",             # seconds in collectives with the other torchrun ranks, waits for them included (learner)
    "samples_received",   # samples taken from the trajectory queue (learner)
    "samples_trained",    # samples that contributed to a gradient step (learner)
    "samples_dropped",    # samples masked out for policy lag past max_policy_lag (learner)
    "learner_steps",      # batches trained = policy version (learner); epochs x minibatches optimiser steps each
    "lag_min", "lag_mean", "lag_max", "lag_p90",  # policy lag of the last batch, in learner steps
    "nonfinite_skips",    # updates skipped for a non-finite loss or gradient (learner)
    "kl_stops",           # batches whose passes --target_kl ended early (learner)
    "gradient_steps",     # optimiser steps taken, of epochs x minibatches a batch (learner)
    "batch_steps",        # optimiser steps the newest batch took before its passes ended (learner)
    "env_restarts",       # envs re-created after raising (rollout workers)
    "trajectories_discarded",  # trajectories thrown away (a worker restarted)
    "policy_reloads",     # times new params were copied in (inference)
    "inference_batches",  # forward passes run (inference)
    "inference_samples",  # samples in them
    "episodes",           # episodes finished (runner)
)
_COL = {name: i for i, name in enumerate(FIELDS)}


def learner_row(policy: int) -> str:
    """'learner' for policy 0, 'learner_<k>' for the others, so summing rows that start
    with 'learner' counts every policy's."""
    return "learner" if policy == 0 else f"learner_{policy}"


def per_second(amount: float, seconds: float) -> float:
    """`amount` gained over `seconds`; a zero-length span reads as a tiny one."""
    return amount / max(seconds, 1e-9)


class StatsBoard:
    def __init__(self, row_names: list):
        self.row_names = list(row_names)
        self._row = {name: i for i, name in enumerate(self.row_names)}
        self.table = torch.zeros((len(self.row_names), len(FIELDS)), dtype=torch.float64).share_memory_()

    def row(self, name: str) -> "BoardRow":
        return BoardRow(self.table[self._row[name]])

    def get(self, row: str, field: str) -> float:
        return float(self.table[self._row[row], _COL[field]])

    def total(self, field: str, prefix: str = "") -> float:
        rows = [i for n, i in self._row.items() if n.startswith(prefix)]
        return float(self.table[rows, _COL[field]].sum()) if rows else 0.0

    def rows_with(self, prefix: str) -> list:
        return [n for n in self.row_names if n.startswith(prefix)]


class BoardRow:
    """The owner's handle to its row; cheap enough to call every loop."""

    def __init__(self, values: torch.Tensor):
        self._v = values
        self._np = values.numpy()  # numpy view of the same shared memory: far cheaper per write

    def add(self, field: str, amount: float) -> None:
        self._np[_COL[field]] += amount

    def set(self, field: str, value: float) -> None:
        self._np[_COL[field]] = value

    def get(self, field: str) -> float:
        return float(self._np[_COL[field]])

    def beat(self) -> None:
        self._np[_COL["heartbeat"]] = time.time()


class Timer:
    """Accumulates wall seconds into one board field: `with timer("busy_s"): ...`."""

    def __init__(self, row: BoardRow):
        self._row = row

    def __call__(self, field: str):
        return _Span(self._row, field)


class _Span:
    __slots__ = ("_row", "_field", "_t0")

    def __init__(self, row, field):
        self._row, self._field = row, field

    def __enter__(self):
        self._t0 = time.perf_counter()

    def __exit__(self, *exc):
        self._row.add(self._field, time.perf_counter() - self._t0)
