"""The journey a user takes who never read fastrl's source: their own env and model in a module
of their own, trained from a Python script, resumed from the command line with one option
changed (the rest kept, and said), exported, and the export loaded in a fresh process."""
import json
import os
import subprocess
import sys
import textwrap

USER_MODULE = textwrap.dedent("""
    import gymnasium
    import numpy as np
    import torch.nn as nn

    import fastrl


    class Cue(gymnasium.Env):
        # Each step shows one of `arms` cues; picking the arm it shows pays 1.
        def __init__(self, arms: int):
            self.arms = arms
            self.observation_space = gymnasium.spaces.Box(0.0, 1.0, (arms,), np.float32)
            self.action_space = gymnasium.spaces.Discrete(arms)

        def _show(self):
            self.cue = int(self.np_random.integers(self.arms))
            return np.eye(self.arms, dtype=np.float32)[self.cue]

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.steps = 0
            return self._show(), {}

        def step(self, action):
            reward = float(int(action) == self.cue)
            self.steps += 1
            return self._show(), reward, False, self.steps >= 8, {}


    class Narrow(nn.Module):
        def __init__(self, inputs: int):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(inputs, 16), nn.Tanh())
            self.out_dim = 16

        def forward(self, x):
            return self.net(x)


    fastrl.register_env("cue", Cue, options={"arms": (4, "How many arms, and cues.")})
    fastrl.register_model("narrow", lambda obs_space, spec: Narrow(obs_space.shape[0]))
""")

SCRIPT = textwrap.dedent("""
    import sys
    import fastrl
    import my_rl  # registers the env and the model

    cfg = fastrl.Config(env="cue", model="narrow", env_option="arms=3", train_dir=sys.argv[1], experiment="mine",
                        train_for_env_frames=4000, lr=0.002, gamma=0.9, use_rnn=False, plan="off", num_workers=1,
                        num_envs_per_worker=8, batch_size=256)
    summary = fastrl.train(cfg, echo=False)
    print(summary.env_frames)
""")

LOAD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import fastrl

    export, experiment = sys.argv[1], sys.argv[2]
    exported = fastrl.load_policy(export, modules="my_rl", deterministic=True)
    trained = fastrl.load_policy(experiment, modules="my_rl", deterministic=True)
    cues = np.eye(3, dtype=np.float32)
    print(json.dumps({"exported": exported(cues).tolist(), "trained": trained(cues).tolist()}))
""")


def _python(args: list, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_own_env_and_model_trained_from_a_script_resumed_exported_and_loaded(tmp_path):
    (tmp_path / "my_rl.py").write_text(USER_MODULE)
    (tmp_path / "train_it.py").write_text(SCRIPT)
    (tmp_path / "load_it.py").write_text(LOAD)
    runs = str(tmp_path / "runs")
    first = _python(["train_it.py", runs], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert int(first.stdout.strip().splitlines()[-1]) >= 4000

    # From the command line, one option changed: the rest as the script trained it, said in one line.
    resumed = _python(["-m", "fastrl.train", "--env", "cue", "--modules", "my_rl", "--train_dir", runs,
                       "--experiment", "mine", "--train_for_env_frames", "8000"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "changed on this command line: train_for_env_frames 4000 -> 8000" in resumed.stdout, resumed.stdout
    with open(os.path.join(runs, "mine", "config.json")) as fh:
        saved = json.load(fh)
    assert (saved["model"], saved["env_option"], saved["lr"], saved["gamma"]) == ("narrow", "arms=3", 0.002, 0.9)
    with open(os.path.join(runs, "mine", "summary.json")) as fh:
        assert json.load(fh)["env_frames"] >= 8000

    exported = _python(["-m", "fastrl.export", "mine", "--train_dir", runs, "--out", "shared", "--no_video",
                        "--modules", "my_rl"], cwd=tmp_path)
    assert exported.returncode == 0, exported.stdout + exported.stderr
    assert os.path.isfile(tmp_path / "shared" / "model.safetensors")

    # A fresh process plays the export exactly as the experiment's own checkpoint, and has learned the cues.
    loaded = _python(["load_it.py", "shared", os.path.join(runs, "mine")], cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    actions = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert actions["exported"] == actions["trained"]
    assert actions["exported"] == [0, 1, 2], actions
