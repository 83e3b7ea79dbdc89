"""--lr_schedule: the learning rate a run's learner takes, against hand-computed values,
and a real run's reported rate falling to 0 over its time budget."""
import os

import pytest
from helpers import TrainRun
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fastrl.config import Config, ConfigError, validate
from fastrl.learning.learner import scheduled_lr


def test_linear_falls_to_zero_where_the_nearer_budget_ends():
    frames = Config(env="CartPole-v1", lr=1e-3, lr_schedule="linear", train_for_env_frames=1000)
    assert scheduled_lr(frames, 0, 50.0) == pytest.approx(1e-3)
    assert scheduled_lr(frames, 250, 50.0) == pytest.approx(7.5e-4)
    assert scheduled_lr(frames, 1200, 0.0) == 0.0  # past the budget (the last batch's frames overshoot)
    seconds = Config(env="CartPole-v1", lr=1e-3, lr_schedule="linear", train_for_seconds=100.0)
    assert scheduled_lr(seconds, 10**9, 40.0) == pytest.approx(6e-4)
    both = Config(env="CartPole-v1", lr=1e-3, lr_schedule="linear", train_for_env_frames=1000,
                  train_for_seconds=100.0)
    assert scheduled_lr(both, 500, 20.0) == pytest.approx(5e-4)  # the frames run out first
    assert scheduled_lr(both, 100, 80.0) == pytest.approx(2e-4)  # the seconds do
    constant = Config(env="CartPole-v1", lr=1e-3, train_for_env_frames=1000)
    assert scheduled_lr(constant, 900, 90.0) == 1e-3


def test_linear_needs_a_budget_of_frames_or_seconds():
    validate(Config(env="CartPole-v1", lr_schedule="linear", train_for_seconds=60.0), writes=False)
    validate(Config(env="CartPole-v1", lr_schedule="linear", train_for_env_frames=10_000), writes=False)
    with pytest.raises(ConfigError, match="set --train_for_env_frames or --train_for_seconds"):
        validate(Config(env="CartPole-v1", lr_schedule="linear"), writes=False)


def test_linear_over_seconds_is_refused_under_torchrun(tmp_path):
    # Each rank would read its own clock and take a step of another size. The command runs
    # in its own process: in this one, its start-up would leave state other tests read.
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    run = TrainRun(["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--lr_schedule", "linear",
                    "--train_for_seconds", "60"], env=torchrun)
    assert run.wait(timeout=60) == 2, run.output()
    assert "cannot decay over --train_for_seconds under torchrun" in run.output()
    assert not os.listdir(tmp_path)


def test_a_run_with_a_time_budget_reports_its_rate_falling_to_zero(tmp_path):
    run = TrainRun(["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--plan", "off", "--num_workers", "1",
                    "--num_envs_per_worker", "8", "--batch_size", "256", "--lr", "1e-3", "--lr_schedule", "linear",
                    "--train_for_seconds", "16", "--status_every_seconds", "1"])
    assert run.wait(timeout=120) == 0, run.output()
    acc = EventAccumulator(os.path.join(tmp_path, "CartPole-v1", "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    rates = [point.value for point in acc.Scalars("loss/lr")]
    # Start-up counts against the budget, so even the first batch trains below --lr.
    assert len(rates) >= 3 and rates[0] < 1e-3, rates
    assert all(later <= earlier for earlier, later in zip(rates, rates[1:])), rates
    assert rates[-1] < 0.35e-3, rates
