"""The learner's reported loss statistics describe a batch after its passes, as a user
reads them in TensorBoard and as the drift warnings judge them."""
import os
import statistics

from helpers import TrainRun, read_summary
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def test_an_on_policy_runs_kl_and_clip_fraction_are_those_its_passes_reached(tmp_path):
    # On policy the first step of a batch sees the policy that acted: KL 0, nothing clipped.
    # Four passes of four minibatches at CartPole's rate move it well past that.
    run = TrainRun(["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--plan", "off", "--num_workers", "1",
                    "--num_envs_per_worker", "8", "--batch_size", "256", "--max_batches_ahead", "0",
                    "--ppo_epochs", "4", "--num_minibatches", "4", "--train_for_seconds", "10",
                    "--status_every_seconds", "1"])
    assert run.wait(timeout=120) == 0, run.output()
    acc = EventAccumulator(os.path.join(tmp_path, "CartPole-v1", "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    kls = [point.value for point in acc.Scalars("loss/approx_kl")]
    clipped = [point.value for point in acc.Scalars("loss/clip_fraction")]
    assert len(kls) >= 3, run.output()
    assert statistics.median(kls) > 1e-3, kls
    assert statistics.median(clipped) > 0.0, clipped
    # No --target_kl: every batch takes all 4 x 4 steps, and says so.
    steps = [point.value for point in acc.Scalars("train/steps_per_batch")]
    assert steps and set(steps) == {16.0}, steps
    summary = read_summary(tmp_path, "CartPole-v1")
    assert summary["gradient_steps"] == 16 * summary["learner_steps"] > 0, summary
