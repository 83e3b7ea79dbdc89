"""Rollout-worker supervision: a worker killed by a signal, or silent past its
heartbeat timeout, is replaced by a fresh one with fresh envs, and the buffers
it held go back to the free pool (their half-written trajectories are counted
as discarded). A worker that raised is not restarted: its traceback is a bug or
a broken env the user must see, and the run stops with it.
"""
from __future__ import annotations

import time

RESTART_WINDOW_S = 600.0
MAX_RESTARTS_IN_WINDOW = 5
# In policy-worker mode a late batch could still write actions into a dead
# worker's buffers; waiting this long before recycling them lets it land.
RECYCLE_DELAY_S = 1.0


class WorkerSupervisor:
    def __init__(self, runner, heartbeat_timeout_s: float):
        self.runner = runner
        self.timeout = heartbeat_timeout_s
        self.restarts: dict = {}  # worker index -> restart times
        self.total_restarts = 0

    def check(self, process, index: int) -> str | None:
        """Restart rollout worker `index` if it died by a signal or hung.
        Returns a failure sentence when it should stop the run instead."""
        ctx = self.runner.ctx
        beat = ctx.board.get(f"rollout_{index}", "heartbeat")
        hung = process.is_alive() and beat > 0 and time.time() - beat > self.timeout
        if process.is_alive() and not hung:
            return None
        if hung:
            process.kill()
            process.join(5.0)
            cause = f"sent no heartbeat for {self.timeout:g} s and was killed"
        elif process.exitcode is not None and process.exitcode < 0:
            cause = f"was killed by signal {-process.exitcode}"
        else:
            return None  # exited on its own: the runner's failure check reports it
        now = time.time()
        recent = [t for t in self.restarts.get(index, []) if now - t < RESTART_WINDOW_S] + [now]
        self.restarts[index] = recent
        if len(recent) > MAX_RESTARTS_IN_WINDOW:
            return (f"rollout-worker {index} {cause}, its {len(recent)}th death in {RESTART_WINDOW_S:g} s; "
                    "stopping instead of restarting it again")
        time.sleep(RECYCLE_DELAY_S if self.runner.cfg.inference == "policy_worker" else 0.0)
        held = ctx.held_buffers.release(index)
        if held:
            ctx.free_queue.put_many(held, block=True, timeout=10.0)
        ctx.board.row(f"rollout_{index}").add("trajectories_discarded", len(held))
        ctx.board.row(f"rollout_{index}").set("heartbeat", 0.0)
        _drain(ctx.response_queues[index] if ctx.response_queues else None)
        self.runner.replace_rollout_worker(process, index)
        self.total_restarts += 1
        print(f"fastrl: rollout-worker {index} {cause}; restarted it with fresh envs "
              f"({len(held)} partial trajectories discarded).", flush=True)
        return None


def _drain(q) -> None:
    """Drop stale action-ready notes meant for the dead worker."""
    if q is None:
        return
    import queue

    while True:
        try:
            q.get_many(block=False)
        except queue.Empty:
            return
