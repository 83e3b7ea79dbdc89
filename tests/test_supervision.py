"""The supervisor's rules for policy workers, on stand-in processes: which deaths
it repairs and in what order, which it leaves to stop the run, and when it gives
up. (tests/test_reliability.py breaks real runs.)"""
import time
from types import SimpleNamespace

import torch

from fastrl.plumbing.stats_board import StatsBoard
from fastrl.runtime.supervision import WorkerSupervisor

MAX_RESTARTS = 3  # --max_worker_restarts


class FakeProcess:
    def __init__(self, exitcode=None):
        self.exitcode = exitcode

    def is_alive(self) -> bool:
        return self.exitcode is None

    def terminate(self) -> None:
        self.exitcode = -15

    def kill(self) -> None:
        self.exitcode = -9

    def join(self, timeout=None) -> None:
        pass


def _supervised(*processes, timeout_s: float = 3.0):
    """A supervisor over a stand-in runner with these policy workers; the runner's
    `replaced` lists, for each restart, the epoch then and whether an old one lived."""
    runner = SimpleNamespace(
        ctx=SimpleNamespace(board=StatsBoard([f"policy_{i}" for i in range(len(processes))]),
                            inference_epoch=torch.zeros(1, dtype=torch.int64)),
        policy_processes=dict(enumerate(processes)), rollout_processes={}, replaced=[], said=[])
    runner.say = lambda text, incident=False: runner.said.append(text)

    def replace_policy_workers():
        old = runner.policy_processes.values()
        runner.replaced.append((int(runner.ctx.inference_epoch[0]), any(p.is_alive() for p in old)))
        runner.policy_processes = {i: FakeProcess() for i in runner.policy_processes}

    runner.replace_policy_workers = replace_policy_workers
    return WorkerSupervisor(runner, heartbeat_timeout_s=timeout_s, max_restarts=MAX_RESTARTS), runner


def test_a_policy_worker_that_raised_is_left_for_the_run_to_stop_on():
    supervisor, runner = _supervised(FakeProcess(exitcode=1))
    assert supervisor.check_policy_workers() is None
    assert runner.replaced == [] and supervisor.total_restarts == 0


def test_a_killed_policy_worker_restarts_them_all_once_every_old_one_is_dead():
    healthy = FakeProcess()
    supervisor, runner = _supervised(healthy, FakeProcess(exitcode=-9))
    assert supervisor.check_policy_workers() is None
    assert runner.replaced == [(1, False)]  # the epoch moved, and no old worker was left to answer in it
    assert healthy.exitcode == -15 and supervisor.total_restarts == 1
    assert runner.said == ["policy-worker 1 was killed by signal 9; restarted all 2 policy workers, and the rollout "
                           "workers re-send the requests left unanswered."]
    assert supervisor.check_policy_workers() is None and len(runner.replaced) == 1


def test_a_silent_policy_worker_is_killed_and_restarted_but_one_starting_up_is_not():
    supervisor, runner = _supervised(FakeProcess(), FakeProcess())
    runner.ctx.board.row("policy_0").set("heartbeat", time.time() - 10.0)  # policy_1 has not beaten yet
    hung = runner.policy_processes[0]
    assert supervisor.check_policy_workers() is None
    assert hung.exitcode == -9 and runner.replaced == [(1, False)]
    assert runner.ctx.board.get("policy_0", "heartbeat") == 0.0  # its successor is not judged by its beat


def test_a_policy_worker_frozen_before_its_first_heartbeat_is_killed_and_restarted():
    # Stuck while starting up (a model being built, an env being made), it never
    # beats; judged only by its beats, it was never found silent and the run waited
    # for it for good.
    supervisor, runner = _supervised(FakeProcess(), timeout_s=0.2)
    frozen = runner.policy_processes[0]
    assert supervisor.check_policy_workers() is None  # just started: not silent yet
    time.sleep(0.3)
    assert supervisor.check_policy_workers() is None
    assert frozen.exitcode == -9 and runner.replaced == [(1, False)]


def test_a_worker_killed_since_its_check_is_left_for_the_next_not_taken_for_a_failure():
    # Found by chaos.py: a rollout worker killed while a policy-worker restart took
    # seconds was seen dead by the runner's look for dead children, which stopped the run.
    supervisor, runner = _supervised(FakeProcess(exitcode=-9))
    assert supervisor.will_restart(runner.policy_processes[0])
    assert not supervisor.will_restart(FakeProcess(exitcode=-9))  # not a worker: the learner, say
    runner.policy_processes[0].exitcode = 1
    assert not supervisor.will_restart(runner.policy_processes[0])  # it raised: the run stops with its traceback


def test_a_policy_worker_dying_too_often_stops_the_run_naming_it():
    supervisor, runner = _supervised(FakeProcess())
    for _ in range(MAX_RESTARTS):
        runner.policy_processes[0].exitcode = -9
        assert supervisor.check_policy_workers() is None
    runner.policy_processes[0].exitcode = -9
    failure = supervisor.check_policy_workers()
    assert failure.startswith(f"policy-worker 0 was killed by signal 9, {MAX_RESTARTS + 1} deaths in 600 s where "
                              f"--max_worker_restarts allows {MAX_RESTARTS} restarts")
    assert len(runner.replaced) == MAX_RESTARTS
