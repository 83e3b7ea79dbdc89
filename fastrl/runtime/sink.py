"""A consumer that frees trajectories without learning: the sampling system's
throughput measured alone (bench --mode sample). It stands in the learner's row
of the stats board, so every report reads the same counters."""
from __future__ import annotations

import queue

from fastrl.plumbing.context import SharedContext
from fastrl.plumbing.polling import get_many_polling, put_many_polling
from fastrl.plumbing.stats_board import Timer

QUEUE_TIMEOUT_S = 0.1


def sink_main(cfg, ctx: SharedContext) -> None:
    row = ctx.board.row("learner")
    timer = Timer(row)
    while not ctx.stop.is_set():
        row.beat()
        with timer("wait_s"):
            indices = []
            for q in ctx.traj_queues:  # one per policy
                try:
                    indices += get_many_polling(q, QUEUE_TIMEOUT_S / len(ctx.traj_queues))
                except queue.Empty:
                    pass
            if not indices:
                continue
        with timer("comm_s"):
            put_many_polling(ctx.free_queue, indices, 10.0)
        row.add("samples_received", len(indices) * cfg.samples_per_buffer)
