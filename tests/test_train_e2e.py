"""The trainer as a user runs it: `python -m fastrl.train`, real envs, real processes."""
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from helpers import REPO, TESTS, TrainRun, make_experiment, read_summary

from fastrl import enjoy
from fastrl.learning.checkpoint import checkpoint_dir, load_checkpoint, load_latest_checkpoint, save_checkpoint
from fastrl.plumbing import timeline

# Small and quick on CPU, and what the tuned CartPole defaults look like.
FAST = ["--env", "CartPole-v1", "--status_every_seconds", "1"]


@pytest.mark.parametrize("placement", [[], ["--inference", "policy_worker"]], ids=["planned", "policy_worker"])
def test_cartpole_reaches_195_and_leaves_nothing_behind(tmp_path, placement):
    marks = tmp_path / "timeline.tsv"
    run = TrainRun([*FAST, "--train_dir", str(tmp_path), "--stop_at_reward", "195",
                    "--train_for_env_frames", "3000000", *placement], env={timeline.ENV_VAR: str(marks)})
    assert run.wait(timeout=150) == 0, run.output()
    # --plan auto (the default) printed its plan, saved it, and set the measured rate beside it.
    assert "fastrl: plan:" in run.output() and "measured" in run.output()
    assert os.path.isfile(tmp_path / "CartPole-v1" / "plan.json")
    if placement:
        assert "inference policy_worker" in run.output()
        assert any(t.startswith("fastrl: policy-worker 0") for t in run.worker_titles())
    summary = read_summary(tmp_path, "CartPole-v1")
    assert summary["reached_reward_at_seconds"] is not None, run.output()
    # The mean that stopped the run. The one at exit also counts episodes that ended
    # while the run wound down (191.5 once, in CI): still a trained policy's.
    assert summary["reached_reward_mean_100"] >= 195
    assert summary["mean_return_100"] >= 150
    assert summary["episodes"] >= 100
    assert summary["env_frames"] > 0 and summary["fps"] > 0
    assert set(summary) >= {"env_frames", "wall_seconds", "fps", "mean_return_100", "episodes",
                            "reached_reward_at_seconds", "reached_reward_mean_100"}
    # Start-up: how long from launch to the first trained batch, said once and kept.
    assert 0 < summary["first_batch_s"] < summary["wall_seconds"]
    assert sum(line.startswith("fastrl: first batch trained") for line in run.output().splitlines()) == 1
    # Every process wrote its marks to the timeline that benchmarks/startup.py reads.
    events = [event for _, _, event in timeline.read(str(marks))]
    assert {"main entered", "plan made", "learner: first batch trained", "first batch seen"} <= set(events)
    assert "rollout-worker 0: envs reset" in events and events[-1] != "main entered"
    assert len(run.descendants) >= 3, "expected a learner and rollout workers to have been seen"
    assert run.leftover_processes() == []
    assert run.new_shm_entries() == set()
    assert os.path.isfile(tmp_path / "CartPole-v1" / "config.json")


@pytest.mark.parametrize("placement", [["--inference", "local"], ["--inference", "policy_worker"]],
                         ids=["local", "policy_worker"])
def test_max_batches_ahead_0_trains_every_sample_with_the_weights_that_chose_it(tmp_path, placement):
    # On-policy: sampling waits for each batch to be trained. With policy workers each
    # worker's second env half keeps a buffer while the learner trains, and the
    # batches after take those: --max_batches_ahead's help gives the bound.
    run = TrainRun([*FAST, "--train_dir", str(tmp_path), "--max_batches_ahead", "0",
                    "--train_for_env_frames", "40000", *placement])
    assert run.wait(timeout=120) == 0, run.output()
    cfg = json.loads((tmp_path / "CartPole-v1" / "config.json").read_text())
    if cfg["inference"] == "local":
        most_lag = 0
    else:
        buffers_per_batch = cfg["batch_size"] // (cfg["rollout"] * cfg["num_envs_per_worker"] // 2)
        most_lag = 1 + -(-cfg["num_workers"] // buffers_per_batch)
    lags = [int(m.group(1)) for m in map(re.compile(r"lag min/mean/max \d+/[\d.]+/(\d+)").search, run.lines) if m]
    assert len(lags) >= 2 and max(lags) <= most_lag, run.output()
    assert read_summary(tmp_path, "CartPole-v1")["env_frames"] >= 40000
    assert run.leftover_processes() == [] and run.new_shm_entries() == set()


def test_ctrl_c_stops_quickly_with_a_loadable_checkpoint(tmp_path):
    run = TrainRun([*FAST, "--train_dir", str(tmp_path), "--experiment", "interrupted"])
    run.wait_for_line(lambda line: line.startswith("[") and "trained 0 samples/s" not in line, timeout=90)
    run.signal_group(signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group gets it
    code = run.wait(timeout=15)
    assert code == 128 + signal.SIGINT, run.output()
    state, path = load_latest_checkpoint(str(tmp_path / "interrupted" / "checkpoints"))
    assert state is not None and state["version"] > 0 and state["env_frames"] > 0
    assert run.leftover_processes() == []
    assert run.new_shm_entries() == set()
    assert "stopped by SIGINT" in run.output()


CHILD_SIGINT_SCRIPT = """
import signal

from fastrl.plumbing.proc import start_process_server


def sigint_handler_at_start(queue):
    queue.put(repr(signal.getsignal(signal.SIGINT)))


if __name__ == "__main__":
    before = signal.getsignal(signal.SIGINT)
    mp = start_process_server()
    queue = mp.SimpleQueue()
    child = mp.Process(target=sigint_handler_at_start, args=(queue,))
    child.start()
    child.join()
    print(queue.get(), signal.getsignal(signal.SIGINT) is before, signal.pthread_sigmask(signal.SIG_BLOCK, []))
"""


def test_children_ignore_ctrl_c_from_their_first_instruction(tmp_path):
    # A Ctrl-C reaches the whole group; a child that took it before init_child ran
    # died with exit code 1, which the runner reported as a crash (and restarted
    # from). The process server's children now start with SIGINT ignored, and the
    # runner keeps its own handler and an empty signal mask.
    script = tmp_path / "child_sigint.py"
    script.write_text(CHILD_SIGINT_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": REPO})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["<Handlers.SIG_IGN:", "1>", "True", "set()"], out.stdout


def test_sigterm_to_the_runner_stops_everything(tmp_path):
    run = TrainRun([*FAST, "--train_dir", str(tmp_path), "--inference", "policy_worker"])
    run.wait_for_line(lambda line: line.startswith("[") and "frames" in line, timeout=90)
    os.kill(run.proc.pid, signal.SIGTERM)
    assert run.wait(timeout=15) == 128 + signal.SIGTERM, run.output()
    assert run.leftover_processes() == []
    assert run.new_shm_entries() == set()


def test_resume_continues_frames_version_and_optimizer(tmp_path):
    first = TrainRun([*FAST, "--train_dir", str(tmp_path), "--train_for_env_frames", "40000",
                      "--eval_every_frames", "15000", "--eval_episodes", "2"])
    assert first.wait(timeout=90) == 0, first.output()
    state1, _ = load_latest_checkpoint(str(tmp_path / "CartPole-v1" / "checkpoints"))
    assert state1["optimizer"]["state"], "the optimizer state must be saved"
    # The evaluator ran beside training and kept the best policy it saw.
    assert read_summary(tmp_path, "CartPole-v1")["last_eval"]["eval/return"] > 0
    assert "evaluation at" in first.output()
    assert os.path.isfile(tmp_path / "CartPole-v1" / "checkpoints" / "best.pt")

    second = TrainRun([*FAST, "--train_dir", str(tmp_path), "--train_for_env_frames", "80000"])
    assert second.wait(timeout=90) == 0, second.output()
    state2, _ = load_latest_checkpoint(str(tmp_path / "CartPole-v1" / "checkpoints"))
    summary = read_summary(tmp_path, "CartPole-v1")
    assert state2["version"] > state1["version"]
    assert state2["env_frames"] >= 80000 > state1["env_frames"]
    assert summary["env_frames"] - summary["env_frames_this_run"] == state1["env_frames"]
    # The second run began with the first run's Adam moments, so its step count carried on.
    step1 = max(int(s["step"]) for s in state1["optimizer"]["state"].values())
    step2 = max(int(s["step"]) for s in state2["optimizer"]["state"].values())
    assert step2 > step1

    third = TrainRun([*FAST, "--train_dir", str(tmp_path), "--train_for_env_frames", "20000", "--restart"])
    assert third.wait(timeout=90) == 0, third.output()
    state3, _ = load_latest_checkpoint(str(tmp_path / "CartPole-v1" / "checkpoints"))
    assert state3["env_frames"] < 80000


def test_a_config_file_sets_options_and_a_resume_keeps_them_but_for_those_given_again(tmp_path):
    options = tmp_path / "run.yaml"
    # Pendulum: its presets set lr and normalize_obs, which the values given here, then saved, must keep on resume.
    options.write_text("env: Pendulum-v1\nlr: 0.0005\nhidden_sizes: [32, 32]\nnormalize_obs: no\n"
                       "train_for_env_frames: 20000\nstatus_every_seconds: 1\n")
    first = TrainRun(["--config", str(options), "--train_dir", str(tmp_path), "--gamma", "0.98"])
    assert first.wait(timeout=90) == 0, first.output()
    config_json = tmp_path / "Pendulum-v1" / "config.json"
    saved = json.loads(config_json.read_text())
    assert (saved["lr"], saved["hidden_sizes"], saved["normalize_obs"], saved["gamma"]) == \
        (0.0005, "32,32", False, 0.98)
    assert saved["origins"]["lr"] == saved["origins"]["gamma"] == "given"
    assert "options off their defaults, by source: " in first.output()

    # Resumed with one option changed: the rest stay as the run was trained, and the run says what changed.
    second = TrainRun(["--env", "Pendulum-v1", "--train_dir", str(tmp_path), "--train_for_env_frames", "40000"])
    assert second.wait(timeout=90) == 0, second.output()
    assert (f"fastrl: resuming with the options {config_json} saved; changed on this command line: "
            "train_for_env_frames 20000 -> 40000") in second.output()
    again = json.loads(config_json.read_text())
    assert {k: again[k] for k in ("lr", "hidden_sizes", "normalize_obs", "gamma", "train_for_env_frames")} == {
        "lr": 0.0005, "hidden_sizes": "32,32", "normalize_obs": False, "gamma": 0.98, "train_for_env_frames": 40000}
    assert again["origins"]["lr"] == "saved run" and again["origins"]["train_for_env_frames"] == "given"
    assert read_summary(tmp_path, "Pendulum-v1")["env_frames"] >= 40000
    checkpoints = str(tmp_path / "Pendulum-v1" / "checkpoints")
    assert load_latest_checkpoint(checkpoints)[0]["optimizer"]["param_groups"][0]["lr"] == 0.0005

    # A new rate given on the command line is the rate trained at, not the one the optimizer state saved.
    third = TrainRun(["--env", "Pendulum-v1", "--train_dir", str(tmp_path), "--train_for_env_frames", "60000",
                      "--lr", "0.0002"])
    assert third.wait(timeout=90) == 0, third.output()
    assert "lr 0.0005 -> 0.0002" in third.output()
    assert load_latest_checkpoint(checkpoints)[0]["optimizer"]["param_groups"][0]["lr"] == 0.0002


@pytest.mark.parametrize("text, words", [
    ("lr: 0.001\nlearning_rate: 3\n", "names an unknown option 'learning_rate'"),
    ("- lr\n", "holds a list, not a mapping of option: value"),
    ("lr: [1\n", "is not YAML or JSON"),
    ("batch_size: many\n", "batch_size: 'many' is not a valid value"),
    ("device: tpu\n", "device: 'tpu' is not one of auto, cpu, cuda"),
])
def test_a_bad_config_file_is_one_sentence_before_any_process(tmp_path, text, words):
    options = tmp_path / "run.yaml"
    options.write_text(text)
    run = TrainRun(["--env", "CartPole-v1", "--config", str(options), "--train_dir", str(tmp_path)])
    assert run.wait(timeout=60) == 2
    lines = [line for line in run.lines if line.strip()]
    assert len(lines) == 1 and words in lines[0], run.output()
    assert not (tmp_path / "CartPole-v1").exists()


def test_any_gymnasium_env_with_box_actions_trains(tmp_path):
    run = TrainRun(["--env", "Pendulum-v1", "--train_dir", str(tmp_path), "--train_for_env_frames", "20000",
                    "--num_workers", "1", "--use_rnn", "--rnn_size", "32"])
    assert run.wait(timeout=90) == 0, run.output()
    summary = read_summary(tmp_path, "Pendulum-v1")
    assert summary["env_frames"] >= 20000 and summary["episodes"] > 0
    assert summary["samples_trained"] > 0
    with open(tmp_path / "Pendulum-v1" / "config.json") as f:
        saved = json.load(f)
    assert (saved["lr"], saved["target_kl"]) == (1e-3, 0.01)  # the continuous-action preset, as trained and saved


def test_continuous_control_keeps_its_best_policy_by_default(tmp_path):
    run = TrainRun(["--env", "Pendulum-v1", "--train_dir", str(tmp_path), "--train_for_env_frames", "260000",
                    "--seed", "0"])
    assert run.wait(timeout=150) == 0, run.output()
    # The preset's evaluator played its 10 episodes at 250,000 frames and kept that policy.
    evaluations = [line for line in run.lines if "evaluation at" in line]
    assert len(evaluations) == 1 and "over 10 deterministic episodes" in evaluations[0], run.output()
    best = load_checkpoint(str(tmp_path / "Pendulum-v1" / "checkpoints" / "best.pt"))
    assert best["env_frames"] >= 250_000 and math.isfinite(best["best_score"])
    assert read_summary(tmp_path, "Pendulum-v1")["env_frames"] >= 260_000


def _random_policy_return(env_id: str, episodes: int, seed: int = 0) -> float:
    """The mean return of uniformly random actions: the bar a trained policy must clear."""
    import gymnasium

    env = gymnasium.make(env_id)
    env.action_space.seed(seed)
    total = 0.0
    for episode in range(episodes):
        env.reset(seed=seed + episode)
        done = False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            done = terminated or truncated
    env.close()
    return total / episodes


def test_a_mujoco_task_learns_past_a_random_policy_with_the_continuous_control_defaults(tmp_path):
    pytest.importorskip("mujoco", reason='MuJoCo is not installed: pip install "gymnasium[mujoco]"')
    run = TrainRun(["--env", "Hopper-v5", "--train_dir", str(tmp_path), "--train_for_env_frames", "100000",
                    "--seed", "0"])
    assert run.wait(timeout=150) == 0, run.output()
    with open(tmp_path / "Hopper-v5" / "config.json") as f:
        saved = json.load(f)
    # The continuous-control defaults and the locomotion family's, as trained and saved.
    assert (saved["normalize_obs"], saved["log_std_init"], saved["minibatch_split"]) == (True, -1.0, "samples")
    assert (saved["lr"], saved["ppo_epochs"], saved["origins"]["ppo_epochs"]) == (3e-4, 4, "spaces preset")
    random_return = _random_policy_return("Hopper-v5", episodes=50)
    summary = read_summary(tmp_path, "Hopper-v5")
    # Random actions fall within ~20 steps (a return near 20); standing and hopping for
    # longer is what any learning shows within this budget.
    assert summary["episodes"] >= 100
    assert summary["mean_return_100"] > 3 * random_return, (summary["mean_return_100"], random_return)


@pytest.mark.parametrize("args, words", [
    (["--env", "CartPol-v1"], "CartPole-v1"),
    (["--env", "CartPole-v1", "--num_workers", "0"], "--num_workers is 0"),
    (["--env", "CartPole-v1", "--batch_size", "1000"], "not a multiple"),
    (["--env", "CartPole-v1", "--num_workres", "2"], "Did you mean --num_workers?"),
])
def test_bad_input_is_one_sentence_and_nonzero_before_any_process(tmp_path, args, words):
    run = TrainRun([*args, "--train_dir", str(tmp_path)])
    assert run.wait(timeout=60) == 2
    assert words in run.output()
    assert "Traceback" not in run.output()
    assert run.descendants == set()
    assert not os.path.exists(tmp_path / "CartPole-v1" / "config.json")


def test_a_checkpoint_of_another_model_shape_is_refused(tmp_path):
    first = TrainRun([*FAST, "--train_dir", str(tmp_path), "--train_for_env_frames", "5000"])
    assert first.wait(timeout=90) == 0, first.output()
    second = TrainRun([*FAST, "--train_dir", str(tmp_path), "--hidden_sizes", "32"])
    assert second.wait(timeout=60) == 2
    assert "does not fit this model" in second.output() and "--restart" in second.output()
    assert second.worker_titles() == []
    # the first run's checkpoint is untouched
    assert load_latest_checkpoint(str(tmp_path / "CartPole-v1" / "checkpoints"))[0] is not None


def test_status_lines_show_progress_toward_the_budget(tmp_path):
    run = TrainRun([*FAST, "--train_dir", str(tmp_path), "--train_for_env_frames", "60000"])
    assert run.wait(timeout=90) == 0, run.output()
    progress = [line for line in run.lines if line.startswith("[") and "% ETA " in line]
    assert progress, run.output()
    assert "[##########] 100% ETA 0m00s" in progress[-1]


def test_an_experiment_from_before_return_normalisation_was_the_default_resumes(tmp_path):
    # A checkpoint written by a8bffe5 (tests/data/README.md), whose config has no
    # normalize_returns: it was trained without, so the resumed run must be too.
    ckpts = tmp_path / "older" / "checkpoints"
    ckpts.mkdir(parents=True)
    shutil.copy(os.path.join(TESTS, "data", "a8bffe5", "checkpoint_000000000027.pt"), ckpts)
    run = TrainRun([*FAST, "--train_dir", str(tmp_path), "--experiment", "older", "--plan", "off",
                    "--hidden_sizes", "8", "--normalize_obs", "true", "--train_for_seconds", "6"])
    assert run.wait(timeout=90) == 0, run.output()
    with open(tmp_path / "older" / "config.json") as fh:
        assert json.load(fh)["normalize_returns"] is False


def test_an_experiment_saved_with_options_since_removed_plays_and_resumes(tmp_path):
    # --clip_anchor, --lr_kl_target and --lr_schedule kl_adaptive were measured and
    # removed (their numbers are in git's history of benchmarks/README.md); config.json
    # and the checkpoints of a run from before still name them.
    removed = {"clip_anchor": "proximal", "lr_schedule": "kl_adaptive", "lr_kl_target": 0.008}
    cfg = make_experiment(str(tmp_path), "older", hidden_sizes="8")
    config_path = os.path.join(cfg.experiment_dir, "config.json")
    with open(config_path) as fh:
        saved = json.load(fh)
    with open(config_path, "w") as fh:
        json.dump({**saved, **removed}, fh)
    state, _ = load_latest_checkpoint(checkpoint_dir(cfg))
    save_checkpoint(checkpoint_dir(cfg), {**state, "config": {**state["config"], **removed}}, state["version"], 1)

    assert enjoy.load_experiment_config(cfg.experiment_dir).lr_schedule == "constant"
    assert enjoy.main(["--env", "CartPole-v1", "--experiment", "older", "--train_dir", str(tmp_path),
                       "--episodes", "1"]) == 0
    run = TrainRun([*FAST, "--train_dir", str(tmp_path), "--experiment", "older", "--plan", "off",
                    "--hidden_sizes", "8", "--train_for_env_frames", "20000"])
    assert run.wait(timeout=90) == 0, run.output()
    resumed, _ = load_latest_checkpoint(checkpoint_dir(cfg))
    assert resumed["version"] > state["version"] and resumed["env_frames"] >= 20000
    with open(config_path) as fh:
        assert not {"clip_anchor", "lr_kl_target"} & set(json.load(fh))
