"""The rollout workers' start order: those whose first trajectories fill the learner's
first batch make their envs first; the others wait until those handed a trajectory
over (fastrl/sampling/rollout_worker.py)."""
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from helpers import TrainRun

from fastrl.config import Config
from fastrl.plumbing import timeline
from fastrl.plumbing.params import StopFlag
from fastrl.plumbing.stats_board import StatsBoard
from fastrl.sampling.rollout_worker import first_batch_workers, wait_for_first_batch_workers


@pytest.mark.parametrize("options, leading", [
    # doom_battle's plan on 2 cores: one worker's 32 envs x 32 steps are a batch of 1,024.
    (dict(num_workers=2, num_envs_per_worker=32), 1),
    (dict(num_workers=2, num_envs_per_worker=16), 2),  # a batch takes both workers' trajectories
    (dict(num_workers=4, num_envs_per_worker=8), 4),
    (dict(num_workers=8, num_envs_per_worker=32, batch_size=2048), 2),
    # Two splits of 16 a worker with policy workers: one worker's two trajectories fill it.
    (dict(num_workers=8, num_envs_per_worker=32, inference="policy_worker"), 1),
    (dict(num_workers=3, num_envs_per_worker=32, batch_size=8192), 3),  # more than there are
    # Several policies: a worker's splits feed different learners, so every worker starts.
    (dict(num_workers=2, num_envs_per_worker=32, num_policies=2, batch_size=512), 2),
])
def test_the_workers_that_fill_the_first_batch_are_counted(options, leading):
    cfg = Config(env="doom_battle", rollout=32, batch_size=options.pop("batch_size", 1024), **options)
    assert first_batch_workers(cfg) == leading


def _waiting(num_workers=2):
    cfg = Config(env="doom_battle", num_workers=num_workers, num_envs_per_worker=32, rollout=32, batch_size=1024)
    ctx = SimpleNamespace(first_handed=torch.zeros(num_workers, dtype=torch.int8).share_memory_(), stop=StopFlag(),
                          board=StatsBoard([f"rollout_{i}" for i in range(num_workers)]))
    return cfg, ctx


def test_a_worker_that_fills_the_first_batch_starts_at_once():
    cfg, ctx = _waiting()
    assert wait_for_first_batch_workers(cfg, 0, ctx)


def test_the_others_start_once_those_handed_a_trajectory_over_and_beat_meanwhile():
    cfg, ctx = _waiting()
    row = ctx.board.row("rollout_1")
    beat_before = row.get("heartbeat")
    handed_at = []

    def worker_0_hands_over():
        time.sleep(0.3)
        handed_at.append(time.monotonic())
        ctx.first_handed[0] = 1

    threading.Thread(target=worker_0_hands_over).start()
    assert wait_for_first_batch_workers(cfg, 1, ctx)
    assert handed_at and time.monotonic() >= handed_at[0]
    assert row.get("heartbeat") > beat_before  # the supervisor sees it alive while it waits


def test_a_worker_restarted_after_the_first_batch_does_not_wait():
    cfg, ctx = _waiting()
    ctx.first_handed[0] = 1
    start = time.monotonic()
    assert wait_for_first_batch_workers(cfg, 1, ctx)
    assert time.monotonic() - start < 0.1


def test_a_waiting_worker_leaves_when_the_run_stops():
    cfg, ctx = _waiting()
    threading.Timer(0.2, ctx.stop.set).start()
    assert not wait_for_first_batch_workers(cfg, 1, ctx)


def test_a_run_starts_the_second_worker_after_the_first_handed_its_trajectory(tmp_path):
    # CartPole, 2 local workers x 8 envs, 32 steps: worker 0's first trajectory is a
    # whole batch of 256, so worker 1 makes its envs only after it.
    marks = tmp_path / "timeline.tsv"
    run = TrainRun(["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--plan", "off", "--inference", "local",
                    "--num_workers", "2", "--num_envs_per_worker", "8", "--rollout", "32", "--batch_size", "256",
                    "--train_for_env_frames", "30000"], env={timeline.ENV_VAR: str(marks)})
    assert run.wait(timeout=120) == 0, run.output()
    events = [event for _, _, event in timeline.read(str(marks))]
    assert events.index("rollout-worker 0: envs reset") \
        < events.index("rollout-worker 1: first batch's workers started") \
        < events.index("rollout-worker 1: envs made")
    assert "rollout-worker 0: first batch's workers started" not in events
    assert run.leftover_processes() == [] and run.new_shm_entries() == set()
