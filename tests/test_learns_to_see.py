"""A pixel policy that learns to look, through the real command line.

The Doom and Atari models read the policy and the value from one GRU core. A GRU's
output is bounded (tanh), so a value head asked for returns far from 1 pushes the
core's units to saturate and the core stops carrying what the frame shows: on
react_env (a task that needs nothing but sight, chance 16 of 32) such a model
stayed at chance through 135k-286k frames with the raw returns (about 15 per
episode), at lr 1e-4 and at 1e-3. With the value head learning z-scored returns
(--normalize_returns, the default) it sees within ~130k frames.
"""
import pytest
from helpers import TEST_ENVS_ON_PATH, TrainRun, read_summary

from fastrl.algo.model import native_bf16

# The pixel family's model and update (fastrl/presets.py), at a step size and a GRU
# width that keep the test short, and eager: the fault is the GRU's saturation, not
# its width (at 128 units and raw returns it stayed at chance through 217k frames,
# where z-scored returns reached 28 by ~80k). At the family's 512 units the run took
# 77-100 s to 28, compiled (`--compile_learner auto`'s choice for a GRU) or eager;
# at 128, eager, 25-27 s (AMD EPYC, 2 cores); compiling the learner's step or the
# workers' forward costs a short run more than it gives, and tests/test_compiled.py
# and tests/test_compiled_act.py cover them.
PIXEL_MODEL = ["--use_rnn", "true", "--separate_critic", "false", "--ppo_epochs", "1", "--num_minibatches", "1",
               "--lr", "1e-3", "--rnn_size", "128", "--compile_learner", "off", "--compile_actors", "off"]


# bf16 as well: every episode here ends at a time limit, whose bootstrap value the
# learner computes without gradients, and a bf16 learner once read it from a copy
# of its first weights (model.ConvEncoder._bf16_layers): it stayed at chance
# through 300k frames where fp32 saw by 130k. So bf16 covers both faults in the fast
# suite where the CPU computes bf16 (fp32 takes 50 s more there, with the slow
# tests); where oneDNN emulates it, the fast suite runs fp32, as `--precision auto`
# would: on a Zen 3 the bf16 run had not finished after 240 s.
FAST = "bf16" if native_bf16() else "fp32"


@pytest.mark.parametrize("precision", [pytest.param(p, marks=() if p == FAST else pytest.mark.slow)
                                       for p in ("fp32", "bf16")])
def test_a_shared_gru_core_learns_to_see(tmp_path, precision):
    run = TrainRun(["--env", "react_env:ReactImage-v0", "--experiment", "react", "--train_dir", str(tmp_path),
                    "--plan", "off", "--num_workers", "1", "--num_envs_per_worker", "16", *PIXEL_MODEL,
                    "--precision", precision,
                    "--stop_at_reward", "28", "--train_for_env_frames", "600000", "--status_every_seconds", "2"],
                   env=TEST_ENVS_ON_PATH)
    assert run.wait(timeout=240) == 0, run.output()
    summary = read_summary(tmp_path, "react")
    assert summary["reached_reward_at_seconds"] is not None, run.output()
    assert summary["reached_reward_mean_100"] >= 28
