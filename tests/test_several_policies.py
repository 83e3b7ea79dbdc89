"""Several policies in one run (--num_policies) and population-based training over
them (--with_pbt), as a user runs them: `python -m fastrl.train` on CartPole-v1."""
import json
import os
import signal
import time

import pytest
from helpers import TrainRun, read_summary

from fastrl import plot
from fastrl.config import Config
from fastrl.learning import pbt
from fastrl.learning.checkpoint import checkpoint_dir, load_latest_checkpoint

SMALL = ["--env", "CartPole-v1", "--plan", "off", "--num_workers", "1", "--num_envs_per_worker", "16",
         "--batch_size", "256", "--status_every_seconds", "1"]
RANDOM_RETURN = 22  # CartPole-v1's mean return under a uniform random policy


def policy_states(train_dir, experiment, policies):
    cfg = Config(env="CartPole-v1", train_dir=str(train_dir), experiment=experiment, num_policies=policies)
    return [load_latest_checkpoint(checkpoint_dir(cfg, k))[0] for k in range(policies)]


@pytest.mark.parametrize("inference", ["local", pytest.param("policy_worker", marks=pytest.mark.slow)])
def test_two_policies_both_learn_and_keep_their_own_checkpoints(tmp_path, inference):
    args = [*SMALL, "--inference", inference, "--num_policies", "2", "--train_dir", str(tmp_path)]
    run = TrainRun([*args, "--train_for_env_frames", "100000"])
    assert run.wait(timeout=240) == 0, run.output()
    assert "by policy" in run.output()
    summary = read_summary(tmp_path, "CartPole-v1")
    # Each learner trained on its own half of the envs, and each policy learned.
    for k, policy in enumerate(summary["policies"]):
        assert policy["policy"] == k and policy["learner_steps"] > 10, summary["policies"]
        assert policy["mean_return_100"] > 3 * RANDOM_RETURN, summary["policies"]
    assert summary["samples_trained"] == sum(p["samples_trained"] for p in summary["policies"])
    states = policy_states(tmp_path, "CartPole-v1", 2)
    assert all(s is not None and s["version"] > 10 for s in states)
    assert states[0]["model"]["policy_head.weight"].ne(states[1]["model"]["policy_head.weight"]).any()
    assert run.leftover_processes() == [] and run.new_shm_entries() == set()
    # Each policy's curve, as `python -m fastrl.plot EXP --by_policy` draws them.
    exp = str(tmp_path / "CartPole-v1")
    curves = plot.read_policy_curves(exp)
    assert [c.label for c in curves] == ["CartPole-v1 policy 0", "CartPole-v1 policy 1"]
    assert all(c.values[-1] > 2 * RANDOM_RETURN for c in curves)  # the episodes that end at shutdown come after
    assert plot.main([exp, "--by_policy", "--out", str(tmp_path / "by_policy.png")]) == 0
    assert os.path.getsize(tmp_path / "by_policy.png") > 0
    # Resuming it with another number of policies is refused: tests/test_bad_input.py.


def test_pbt_replaces_the_worst_policy_logs_it_and_every_policy_resumes_with_the_log_replayed(tmp_path):
    # Two policies, the smallest population: a round replaces at least one policy
    # whatever the population's size, and each policy makes its 15,000-step periods
    # twice as fast as in a population of four (66 s for this test then, 22-26 s now).
    args = [*SMALL, "--num_policies", "2", "--with_pbt", "true", "--pbt_period_env_steps", "15000",
            "--train_dir", str(tmp_path)]
    run = TrainRun([*args, "--train_for_env_frames", "75000"])
    assert run.wait(timeout=240) == 0, run.output()
    log = pbt.read_log(str(tmp_path / "CartPole-v1" / pbt.LOG_NAME))
    starts = [e for e in log if e["round"] == 0]
    assert [e["policy"] for e in starts] == [1]  # policy 0 keeps the configured values
    rounds = [e for e in log if e["round"] > 0]
    assert rounds, run.output()  # CartPole's policies part ways within a few periods
    for e in rounds:
        assert e["copied_from"] != e["policy"] and e["source_objective"] > e["objective"]
        assert all(pbt.BOUNDS[k][0] <= v <= pbt.BOUNDS[k][1] for k, v in e["hyper"].items())
    assert f"PBT round {rounds[0]['round']}: policy {rounds[0]['policy']}" in run.output()
    summary = read_summary(tmp_path, "CartPole-v1")
    for k in range(2):  # each policy ends with its last event's hyperparameters
        last = [e for e in log if e["policy"] == k]
        if last:
            assert summary["policies"][k]["hyperparameters"] == last[-1]["hyper"]

    states = policy_states(tmp_path, "CartPole-v1", 2)
    again = TrainRun([*args, "--train_for_env_frames", "85000"])
    assert again.wait(timeout=180) == 0, again.output()
    assert f"the population as {tmp_path / 'CartPole-v1' / pbt.LOG_NAME} left it" in again.output()
    for before, after in zip(states, policy_states(tmp_path, "CartPole-v1", 2)):  # each from its own checkpoint
        assert after["version"] > before["version"] and after["env_frames"] > before["env_frames"]
    assert not any(line.startswith("fastrl: PBT: policy") for line in again.output().splitlines())
    replayed = read_summary(tmp_path, "CartPole-v1")["policies"]
    later = pbt.read_log(str(tmp_path / "CartPole-v1" / pbt.LOG_NAME))
    assert later[:len(log)] == log  # the log only grows
    for k in range(2):
        mine = [e for e in later if e["policy"] == k]
        if mine:
            assert replayed[k]["hyperparameters"] == mine[-1]["hyper"]
    with open(tmp_path / "CartPole-v1" / "config.json") as fh:
        assert json.load(fh)["with_pbt"] is True
    assert os.path.isdir(tmp_path / "CartPole-v1" / "checkpoints" / "policy_1")


@pytest.mark.slow
def test_a_killed_policys_learner_restarts_every_policy_from_its_own_checkpoint(tmp_path):
    run = TrainRun([*SMALL, "--num_policies", "2", "--train_dir", str(tmp_path), "--max_restarts", "1",
                    "--checkpoint_every_seconds", "2", "--train_for_env_frames", "100000000"])
    run.wait_for_line(lambda line: line.startswith("[") and "trained 0 samples/s" not in line, timeout=90)
    time.sleep(3)  # a checkpoint of each policy
    learner_1 = next(pid for pid, title in run.titles.items() if title.strip() == "fastrl: learner 1")
    os.kill(learner_1, signal.SIGKILL)
    line = run.wait_for_line(lambda text: "restarted the run from" in text, timeout=60)
    assert line.startswith("fastrl: learner 1 was killed by SIGKILL; restarted the run from each policy's newest "
                           "checkpoint (policy 0's: "), line
    run.wait_for_line(lambda text: text.startswith("[") and "by policy" in text, timeout=60)
    run.signal_group(signal.SIGINT)
    assert run.wait(timeout=60) == 128 + signal.SIGINT, run.output()
    assert all(s is not None and s["version"] > 0 for s in policy_states(tmp_path, "CartPole-v1", 2))
    assert run.leftover_processes() == [] and run.new_shm_entries() == set()
