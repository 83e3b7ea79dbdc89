"""A pixel policy that learns to look, through the real command line.

The Doom and Atari models read the policy and the value from one GRU core. A GRU's
output is bounded (tanh), so a value head asked for returns far from 1 pushes the
core's units to saturate and the core stops carrying what the frame shows: on
react_env (a task that needs nothing but sight, chance 16 of 32) such a model
stayed at chance through 135k-286k frames with the raw returns (about 15 per
episode), at lr 1e-4 and at 1e-3. With the value head learning z-scored returns
(--normalize_returns, the default) it sees within ~130k frames.
"""
from helpers import TEST_ENVS_ON_PATH, TrainRun, read_summary

# The pixel family's model and update (fastrl/presets.py), at a step size that
# keeps the test short. In fp32: --precision auto chooses by timing, and where it
# chose bf16 (acting in bf16 on an AMD EPYC, 0.95x fp32's time) this model stayed at
# chance through 600k frames; `--precision bf16` did too through 300k, fp32 learned
# by 130k. That is an open defect of bf16 on this task, not what this test checks.
PIXEL_MODEL = ["--use_rnn", "true", "--separate_critic", "false", "--ppo_epochs", "1", "--num_minibatches", "1",
               "--lr", "1e-3", "--precision", "fp32"]


def test_a_shared_gru_core_learns_to_see(tmp_path):
    run = TrainRun(["--env", "react_env:ReactImage-v0", "--experiment", "react", "--train_dir", str(tmp_path),
                    "--plan", "off", "--num_workers", "1", "--num_envs_per_worker", "16", *PIXEL_MODEL,
                    "--stop_at_reward", "28", "--train_for_env_frames", "600000", "--status_every_seconds", "2"],
                   env=TEST_ENVS_ON_PATH)
    assert run.wait(timeout=240) == 0, run.output()
    summary = read_summary(tmp_path, "react")
    assert summary["reached_reward_at_seconds"] is not None, run.output()
    assert summary["reached_reward_mean_100"] >= 28
