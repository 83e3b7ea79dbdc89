"""Worker supervision: a worker killed by a signal or silent past its heartbeat timeout
is replaced; one that raised is not (its traceback is a bug the user must see) and the
run stops. A rollout worker comes back with fresh envs and its buffers go back to the
pool; policy workers restart together and the rollout workers re-send what went
unanswered (inference.RemotePolicy). A queue lock a killed worker held is freed by the
runner's lock watch (plumbing/queue_locks.py). A learner silent too long is killed and
named, and the runner treats it as a learner that died: the run stops, or restarts from
its newest good checkpoint under --max_restarts.
"""
from __future__ import annotations

import time

from fastrl.plumbing.polling import put_many_polling
from fastrl.plumbing.stats_board import learner_row

RESTART_WINDOW_S = 600.0
# A late policy-worker batch could still write into a dead worker's buffers; wait this
# long before recycling them.
RECYCLE_DELAY_S = 1.0
STOP_TIMEOUT_S = 5.0  # for a healthy policy worker to leave on SIGTERM before it is killed
# A learner beats between batches, so it may stay silent for a batch's step: this many of its
# mean steps, where that is longer than the timeout (a large batch; a compile keeps beating).
LEARNER_SILENT_STEPS = 10


class WorkerSupervisor:
    def __init__(self, runner, heartbeat_timeout_s: float, max_restarts: int):
        self.runner = runner
        self.timeout = heartbeat_timeout_s
        self.max_restarts = max_restarts  # per worker within RESTART_WINDOW_S
        self.restarts: dict = {}  # worker name -> restart times
        self.total_restarts = 0
        self._first_seen: dict = {}  # worker process -> when a check first saw it

    def _last_sign_of_life(self, process, row: str) -> float:
        """Its last heartbeat or, before the first, when a check first saw it: a worker
        stuck starting up is as hung as one stuck later."""
        first = self._first_seen.setdefault(process, time.time())
        beat = self.runner.ctx.board.get(row, "heartbeat")
        return beat if beat > 0 else first

    def _forget(self, processes) -> None:
        for p in processes:
            self._first_seen.pop(p, None)

    def _cause(self, process, row: str) -> str | None:
        """Why `process` must be replaced (killed by a signal, or hung and killed here);
        None while well or when it exited on its own (the runner reports that)."""
        if process.is_alive():
            if time.time() - self._last_sign_of_life(process, row) <= self.timeout:
                return None
            process.kill()
            process.join(5.0)
            return f"sent no heartbeat for {self.timeout:g} s and was killed"
        if process.exitcode is not None and process.exitcode < 0:
            return f"was killed by signal {-process.exitcode}"
        return None

    def learner_timeout(self, policy: int) -> float:
        """How long policy `policy`'s learner may stay silent: the heartbeat timeout, or
        LEARNER_SILENT_STEPS of its mean steps so far where longer; under torchrun at least the
        collectives' timeout, as a learner waits that long for a slower rank."""
        board, cfg, row = self.runner.ctx.board, self.runner.cfg, learner_row(policy)
        batches = board.get(row, "samples_received") / cfg.batch_size
        bound = max(self.timeout, LEARNER_SILENT_STEPS * board.get(row, "busy_s") / batches if batches else 0.0)
        return max(bound, cfg.dist_timeout_seconds) if self.runner.rank.distributed else bound

    def check_learners(self):
        """(name, cause) of a learner silent past learner_timeout, killed here; None while all
        are well. Watched from their first heartbeat, in their loop: their start-up (a resumed
        checkpoint, the ranks' first meeting) is bounded by its own timeouts."""
        for policy, process in self.runner.learner_processes.items():
            beat = self.runner.ctx.board.get(learner_row(policy), "heartbeat")
            if beat <= 0 or not process.is_alive():  # a dead one is the runner's dead-child check's
                continue
            bound = self.learner_timeout(policy)
            if time.time() - beat > bound:
                process.kill()
                process.join(5.0)
                return process.name, f"sent no heartbeat for {bound:.3g} s and was killed"
        return None

    def will_restart(self, process) -> bool:
        """Whether `process` is a worker killed by a signal, which the next check
        restarts; the runner's dead-child check must leave it alone."""
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
        # All of them, healthy too: the epoch may move only once no old worker can answer.
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
    """SIGTERM those alive, then wait, killing any that outstays STOP_TIMEOUT_S."""
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
