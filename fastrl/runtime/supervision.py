"""Worker supervision: a worker killed by a signal, or silent past its heartbeat
timeout, is replaced by a fresh one; one that raised is not restarted, as its
traceback is a bug or a broken env the user must see, and the run stops with it.

A rollout worker comes back with fresh envs, and the buffers it held go back to
the free pool (their half-written trajectories are counted as discarded). A policy
worker holds nothing that shared memory does not, but the requests it had taken
are lost with it: the policy workers restart together, and the rollout workers
then re-send what was not answered (sampling/inference.RemotePolicy says why).

What a restart alone would not repair: a worker killed while it holds a queue's
lock (a few microseconds of each queue call; faster-fifo's mutex is not robust)
leaves that queue locked, and whoever uses it next, the runner among them, waits
for good. The runner's lock watch frees such a lock (plumbing/queue_locks.py).
"""
from __future__ import annotations

import time

from fastrl.plumbing.polling import put_many_polling

RESTART_WINDOW_S = 600.0
# In policy-worker mode a late batch could still write actions into a dead
# worker's buffers; waiting this long before recycling them lets it land.
RECYCLE_DELAY_S = 1.0
STOP_TIMEOUT_S = 5.0  # for a healthy policy worker to leave on SIGTERM before it is killed


class WorkerSupervisor:
    def __init__(self, runner, heartbeat_timeout_s: float, max_restarts: int):
        self.runner = runner
        self.timeout = heartbeat_timeout_s
        self.max_restarts = max_restarts  # per worker within RESTART_WINDOW_S
        self.restarts: dict = {}  # worker name -> restart times
        self.total_restarts = 0
        self._first_seen: dict = {}  # worker process -> when a check first saw it

    def _last_sign_of_life(self, process, row: str) -> float:
        """Its last heartbeat or, before its first, when a check first saw it (its
        start, to within a poll): a worker stuck starting up, in an env that is never
        made, is as hung as one stuck later, and is given the same timeout. A worker
        with a slow start beats as it goes (a rollout worker after each env made)."""
        first = self._first_seen.setdefault(process, time.time())
        beat = self.runner.ctx.board.get(row, "heartbeat")
        return beat if beat > 0 else first

    def _forget(self, processes) -> None:
        for p in processes:
            self._first_seen.pop(p, None)

    def _cause(self, process, row: str) -> str | None:
        """Why `process` must be replaced: it was killed by a signal, or it hung (and
        is killed here). None while it is well, or when it exited on its own, which
        the runner's failure check reports."""
        if process.is_alive():
            if time.time() - self._last_sign_of_life(process, row) <= self.timeout:
                return None
            process.kill()
            process.join(5.0)
            return f"sent no heartbeat for {self.timeout:g} s and was killed"
        if process.exitcode is not None and process.exitcode < 0:
            return f"was killed by signal {-process.exitcode}"
        return None

    def will_restart(self, process) -> bool:
        """Whether `process` is a worker killed by a signal, which a check restarts.
        The runner's look for dead children must leave it alone: a worker that died
        after its own check, while another's restart took seconds, is this
        supervisor's to restart at the next poll, not a failure that ends the run."""
        workers = [*self.runner.rollout_processes.values(), *self.runner.policy_processes.values()]
        return process in workers and process.exitcode is not None and process.exitcode < 0

    def _too_many(self, name: str, cause: str) -> str | None:
        """Count a restart of `name`; a failure sentence when it dies too often to go on."""
        now = time.time()
        recent = [t for t in self.restarts.get(name, []) if now - t < RESTART_WINDOW_S] + [now]
        self.restarts[name] = recent
        if len(recent) > self.max_restarts:
            return (f"{name} {cause}, {len(recent)} deaths in {RESTART_WINDOW_S:g} s where --max_worker_restarts "
                    f"allows {self.max_restarts} restarts; stopping instead of restarting it again")
        self.total_restarts += 1
        return None

    def check(self, process, index: int) -> str | None:
        """Restart rollout worker `index` if it died by a signal or hung.
        Returns a failure sentence when it should stop the run instead."""
        cause = self._cause(process, f"rollout_{index}")
        if cause is None:
            return None
        failure = self._too_many(f"rollout-worker {index}", cause)
        if failure:
            return failure
        ctx = self.runner.ctx
        time.sleep(RECYCLE_DELAY_S if self.runner.cfg.inference == "policy_worker" else 0.0)
        held = ctx.held_buffers.release(index)
        if held:
            put_many_polling(ctx.free_queue, held, 10.0)
        ctx.board.row(f"rollout_{index}").add("trajectories_discarded", len(held))
        ctx.board.row(f"rollout_{index}").set("heartbeat", 0.0)
        self._forget([process])
        _drain(ctx.response_queues[index] if ctx.response_queues else None)
        self.runner.replace_rollout_worker(process, index)
        self.runner.say(f"rollout-worker {index} {cause}; restarted it with fresh envs "
                        f"({len(held)} partial trajectories discarded).", incident=True)
        return None

    def check_policy_workers(self) -> str | None:
        """Restart the policy workers if one died by a signal or hung.
        Returns a failure sentence when it should stop the run instead."""
        processes = self.runner.policy_processes
        for index, process in processes.items():
            cause = self._cause(process, f"policy_{index}")
            if cause is not None:
                break
        else:
            return None
        failure = self._too_many(f"policy-worker {index}", cause)
        if failure:
            return failure
        # All of them, the healthy too: the epoch may move only once no old worker
        # can write an answer any more (inference.RemotePolicy).
        _end(processes.values())
        ctx = self.runner.ctx
        ctx.inference_epoch += 1
        for i in processes:
            ctx.board.row(f"policy_{i}").set("heartbeat", 0.0)
        self._forget(processes.values())
        self.runner.replace_policy_workers()
        which = f"all {len(processes)} policy workers" if len(processes) > 1 else "it"
        self.runner.say(f"policy-worker {index} {cause}; restarted {which}, and the rollout workers "
                        "re-send the requests left unanswered.", incident=True)
        return None


def _end(processes) -> None:
    """SIGTERM those alive (they unwind between two Python steps, never inside a
    queue's lock), then wait for every one, killing any that outstays STOP_TIMEOUT_S."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.time() + STOP_TIMEOUT_S
    for p in processes:
        p.join(max(0.0, deadline - time.time()))
        if p.is_alive():
            p.kill()
            p.join(5.0)


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
