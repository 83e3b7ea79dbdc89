"""The Python API as a user calls it: fastrl.Config, fastrl.train(cfg) (also after
`import fastrl.train`), fastrl.load_policy and the Policy it returns."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import gymnasium as gym
import numpy as np
import psutil
import pytest
from helpers import TrainRun, make_experiment

import fastrl
from fastrl import api
from fastrl.api import command_line
from fastrl.config import parse_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A user's script: train CartPole briefly, check the summary, then play the trained policy
# on real envs, one and a batch at a time; then export it for the next check.
USER_SCRIPT = textwrap.dedent("""
    import json, subprocess, sys
    import gymnasium as gym
    import numpy as np
    import fastrl

    train_dir = sys.argv[1]
    cfg = fastrl.Config(env="CartPole-v1", train_dir=train_dir, experiment="api", train_for_env_frames=3000,
                        num_workers=1, num_envs_per_worker=8, batch_size=256, plan="off", use_rnn=True, rnn_size=16,
                        hidden_sizes="16", normalize_obs=True, status_every_seconds=1.0)
    summary = fastrl.train(cfg, echo=False)
    assert isinstance(summary, fastrl.TrainSummary)

    import fastrl.train  # rebinds fastrl.train to the submodule, which is the same callable
    try:
        fastrl.train(fastrl.Config(env="CartPole-v1", train_dir=train_dir, batch_size=100))
        refused = ""
    except fastrl.ConfigError as err:
        refused = str(err)

    policy = fastrl.load_policy("api", train_dir=train_dir)
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    steps, done = 0, False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(policy(obs))
        steps, done = steps + 1, terminated or truncated
    policy.reset()
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
    batch, _ = envs.reset(seed=1)
    actions = []
    for _ in range(5):
        chosen = policy(batch)
        actions.append(chosen.tolist())
        batch, _, terminated, truncated, _ = envs.step(chosen)
        policy.reset(terminated | truncated)
    print(json.dumps({"summary": {k: getattr(summary, k) for k in ("experiment_dir", "env", "env_frames",
                                                                   "episodes", "mean_return_100", "samples_trained")},
                      "data_keys": sorted(summary.data), "refused": refused, "steps": steps, "actions": actions,
                      "recurrent": policy.recurrent, "is_module": fastrl.train is sys.modules["fastrl.train"]}))
""")


def test_a_user_script_trains_loads_and_plays_cartpole(tmp_path):
    train_dir = str(tmp_path / "runs")
    proc = subprocess.run([sys.executable, "-c", USER_SCRIPT, train_dir], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    summary = result["summary"]
    assert summary["experiment_dir"] == os.path.join(train_dir, "api") and summary["env"] == "CartPole-v1"
    assert summary["env_frames"] >= 3000 and summary["samples_trained"] > 0
    with open(os.path.join(train_dir, "api", "summary.json")) as fh:
        on_disk = json.load(fh)
    assert summary["env_frames"] == on_disk["env_frames"] and result["data_keys"] == sorted(on_disk)
    assert summary["episodes"] > 0 and isinstance(summary["mean_return_100"], float)
    with open(os.path.join(train_dir, "api", "config.json")) as fh:
        saved = json.load(fh)
    assert (saved["use_rnn"], saved["rnn_size"], saved["normalize_obs"], saved["batch_size"]) == (True, 16, True, 256)
    assert saved["origins"]["rnn_size"] == "given"  # the command the API ran was given these options

    assert result["is_module"] and "--batch_size 100 is not a multiple" in result["refused"]
    assert result["recurrent"] and 1 <= result["steps"] <= 500
    assert np.array(result["actions"]).shape == (5, 3) and set(np.ravel(result["actions"])) <= {0, 1}

    # Shared: the export's card tells the run's frames, return and the command the API ran.
    out = str(tmp_path / "shared")
    made = subprocess.run([sys.executable, "-m", "fastrl.export", "api", "--train_dir", train_dir, "--out", out,
                           "--video_steps", "5"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    with open(os.path.join(out, "README.md")) as fh:
        card = fh.read()
    assert f"| mean return, last 100 training episodes | {summary['mean_return_100']:.2f} |" in card
    assert "![Mean return of the last 100 episodes](learning_curve.png)" in card, made.stdout
    assert (f"python -m fastrl.train --env CartPole-v1 --batch_size 256 --experiment api --hidden_sizes 16 "
            f"--normalize_obs true --num_envs_per_worker 8 --plan off --rnn_size 16 --status_every_seconds 1.0 "
            f"--train_dir {train_dir} --train_for_env_frames 3000 --use_rnn true") in card
    with open(os.path.join(out, "export.json")) as fh:
        assert json.load(fh)["env_frames"] <= summary["env_frames"]  # the checkpoint written at the end, or before
    played = subprocess.run([sys.executable, "-m", "fastrl.enjoy", "--from", out, "--episodes", "1"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert played.returncode == 0 and "mean return over 1 episode(s)" in played.stdout, played.stderr


# A script with an env of its own: registered at its top level, where the run's processes find it.
OWN_ENV_SCRIPT = textwrap.dedent("""
    import json, sys
    import gymnasium
    import numpy as np
    import fastrl


    class Coin(gymnasium.Env):
        \"\"\"Say which side the coin shows: reward 1 when right, 8 tosses an episode.\"\"\"

        observation_space = gymnasium.spaces.Box(0.0, 1.0, (2,), np.float32)
        action_space = gymnasium.spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.side, self.tosses = int(self.np_random.integers(2)), 0
            return np.eye(2, dtype=np.float32)[self.side], {}

        def step(self, action):
            reward = float(int(action) == self.side)
            self.side, self.tosses = int(self.np_random.integers(2)), self.tosses + 1
            return np.eye(2, dtype=np.float32)[self.side], reward, False, self.tosses >= 8, {}


    fastrl.register_env("coin", Coin)

    if __name__ == "__main__":
        cfg = fastrl.Config(env="coin", train_dir=sys.argv[1], train_for_env_frames=2000, num_envs_per_worker=8,
                            batch_size=256, plan="off", hidden_sizes="8")
        summary = fastrl.train(cfg, echo=False)
        try:
            policy = fastrl.load_policy(summary.experiment_dir, deterministic=True)
        except fastrl.AgentLoadError as err:
            print(json.dumps({"frames": summary.env_frames, "load_error": str(err)}))
            sys.exit()
        print(json.dumps({"frames": summary.env_frames, "actions": policy(np.eye(2, dtype=np.float32)).tolist()}))
""")


def test_a_script_trains_an_env_it_registers_itself(tmp_path):
    script = tmp_path / "coin_script.py"
    script.write_text(OWN_ENV_SCRIPT)
    train_dir = str(tmp_path / "runs")
    proc = subprocess.run([sys.executable, str(script), train_dir], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["frames"] >= 2000  # the run's processes found the env through the script's path
    with open(os.path.join(train_dir, "coin", "config.json")) as fh:
        modules = json.load(fh)["modules"].split(",")
    # Recorded once, by its path: every later process (load_policy here, enjoy) imports it from there.
    assert modules == [str(script)]
    assert "load_error" not in result, result["load_error"]
    assert len(result["actions"]) == 2


# The script takes Ctrl-C as one started from a terminal does: a process started in the
# background of a non-interactive shell (`pytest ... &`) inherits SIGINT ignored, and a
# Python so started would never raise KeyboardInterrupt for fastrl.train to forward.
INTERRUPTED_SCRIPT = textwrap.dedent("""
    import signal, sys, fastrl

    signal.signal(signal.SIGINT, signal.default_int_handler)
    cfg = fastrl.Config(env="CartPole-v1", train_dir=sys.argv[1], train_for_seconds=300, num_envs_per_worker=8,
                        batch_size=256, plan="off", status_every_seconds=1.0)
    try:
        fastrl.train(cfg)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(5)
""")


def test_ctrl_c_stops_the_run_as_it_stops_the_command_then_raises_keyboard_interrupt(tmp_path):
    (tmp_path / "interrupted_script.py").write_text(INTERRUPTED_SCRIPT)
    run = TrainRun([str(tmp_path / "runs")], module="interrupted_script", env={"PYTHONPATH": str(tmp_path)})
    run.wait_for_line(lambda line: "samples/s" in line, timeout=120)  # training, and its status lines echoed
    os.kill(run.proc.pid, signal.SIGINT)  # to this process alone: it forwards the signal to its run
    assert run.wait(timeout=120) == 5
    assert "fastrl: stopped by SIGINT" in run.output() and run.lines[-1] == "interrupted"
    assert os.listdir(tmp_path / "runs" / "CartPole-v1" / "checkpoints")  # the last checkpoint, at the stop
    assert os.path.isfile(tmp_path / "runs" / "CartPole-v1" / "summary.json")
    assert run.leftover_processes() == []


class CtrlCAtFirstStart(threading.Thread):
    """A thread whose first start in the test is followed by a KeyboardInterrupt, as a
    Ctrl-C pressed while fastrl.train starts its output's copiers would raise."""
    starts = 0

    def start(self):
        super().start()
        CtrlCAtFirstStart.starts += 1
        if CtrlCAtFirstStart.starts == 1:
            raise KeyboardInterrupt


def training_children() -> list:
    """This process's children that run fastrl.train."""
    found = []
    for child in psutil.Process().children():
        try:
            if "fastrl.train" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.Error:
            pass  # gone, or a zombie about to be reaped
    return found


def test_a_ctrl_c_while_the_output_copiers_start_reaches_the_run_too(tmp_path, monkeypatch):
    # The first copier started, the second not: the run must get the Ctrl-C, and both its
    # pipes be read to its end, or it would train on to its budget behind the caller's back.
    # The run takes SIGINT as one started from a terminal does, however the suite was launched
    # (in the background of a shell it inherits SIGINT ignored, and a forwarded Ctrl-C that
    # lands before its own handler would be lost).
    monkeypatch.setattr(api.threading, "Thread", CtrlCAtFirstStart)
    monkeypatch.setattr(CtrlCAtFirstStart, "starts", 0)
    argv = command_line(fastrl.Config(env="CartPole-v1", train_dir=str(tmp_path), train_for_seconds=60, plan="off"))
    caller_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    started = time.time()
    try:
        with pytest.raises(KeyboardInterrupt):
            api._run_command(argv, echo=False)
    finally:
        signal.signal(signal.SIGINT, caller_handler)
        starts = CtrlCAtFirstStart.starts
        monkeypatch.undo()
        runs = training_children()
        for run in runs:
            run.kill()
    assert runs == [] and starts == 2
    assert time.time() - started < 40  # it ended on the Ctrl-C, not at its 60-s budget


def test_the_command_line_train_runs_asks_for_exactly_the_config():
    cfg = fastrl.Config(env="CartPole-v1", lr=1e-3, use_rnn=True, stop_at_reward=-5.5, wandb_project="",
                        hidden_sizes="32,32", device="cpu", seed=7)
    argv = command_line(cfg)
    assert argv[0] == "--env=CartPole-v1" and len(argv) == 8  # --env, then only the options off their defaults
    assert parse_args(argv)[0] == cfg
    # Options left at their default take the env's presets, as on the command line.
    doom = parse_args(command_line(fastrl.Config(env="doom_basic", num_workers=3, lr=1e-4)))[0]
    assert (doom.num_workers, doom.lr, doom.batch_size, doom.reward_scale) == (3, 1e-4, 256, 0.01)


def test_a_bad_config_is_refused_before_any_process_starts(tmp_path):
    train_dir = str(tmp_path / "runs")
    with pytest.raises(fastrl.ConfigError, match="Config.batch_size is 'big', a str, but it takes int"):
        fastrl.train(fastrl.Config(env="CartPole-v1", batch_size="big", train_dir=train_dir))
    with pytest.raises(fastrl.ConfigError, match="Config.device is 'gpu' but must be one of auto, cpu, cuda"):
        fastrl.train(fastrl.Config(env="CartPole-v1", device="gpu", train_dir=train_dir))
    with pytest.raises(fastrl.ConfigError, match="No environment given"):
        fastrl.train(fastrl.Config(train_dir=train_dir))
    with pytest.raises(fastrl.ConfigError, match="NoSuchEnv-v9"):
        fastrl.train(fastrl.Config(env="NoSuchEnv-v9", train_dir=train_dir))
    with pytest.raises(TypeError, match="fastrl.train takes a fastrl.Config, not a dict"):
        fastrl.train({"env": "CartPole-v1"})
    assert not os.path.exists(train_dir)


def test_a_recurrent_policy_carries_each_rows_state_until_reset(tmp_path):
    # Pendulum's actions are continuous, so they show any change of the GRU state.
    make_experiment(str(tmp_path), "pendulum", "Pendulum-v1", hidden_sizes="16", use_rnn=True, rnn_size=8)
    policy = fastrl.load_policy("pendulum", train_dir=str(tmp_path), deterministic=True)
    env = gym.make("Pendulum-v1")
    first, second = env.reset(seed=0)[0], env.reset(seed=1)[0]
    fresh_second = policy(second)
    policy.reset()
    policy(first)
    after_first = policy(second)
    assert fresh_second.shape == (1,) and not np.allclose(after_first, fresh_second)
    policy.reset()
    assert np.allclose(policy(second), fresh_second)

    policy.reset()
    both = policy(np.stack([first, second]))  # a batch: one state per row, fresh at first
    assert both.shape == (2, 1) and np.allclose(both[1], fresh_second)
    policy(np.stack([first, second]))
    policy.reset(np.array([False, True]))  # the second row's episode ended
    again = policy(np.stack([first, second]))
    assert np.allclose(again[1], fresh_second) and not np.allclose(again[0], both[0])
    sampled = [policy(second, deterministic=False) for _ in range(3)]
    assert len({float(a[0]) for a in sampled}) == 3
    with pytest.raises(ValueError, match=r"observation has 3 dimensions, but Pendulum-v1's have 1 \(shape \(3,\)\)"):
        policy(np.zeros((2, 2, 3)))
