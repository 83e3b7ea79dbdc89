"""Models users bring (register_model, --model): examples/custom_model.py trained, profiled and
resumed as a user runs it; fastrl's parts (core, heads, normalisers, precision, compiled paths)
around a custom encoder; and the sentences for an encoder that does not fit."""
import json
import os
import signal
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn
from helpers import REPO, TrainRun, read_summary

from fastrl.algo.model import ActorCritic, ModelSpec, obs_zeros
from fastrl.algo.model_registry import ModelError, register_model
from fastrl.config import ConfigError, check_env_and_options, config_from_saved, parse_args
from fastrl.learning.checkpoint import checkpoint_dir, load_latest_checkpoint

EXAMPLE = os.path.join(REPO, "examples", "custom_model.py")


def test_the_example_model_trains_profiles_and_resumes(tmp_path):
    # --plan fresh: the planner profiles this model itself rather than an earlier run's.
    first = subprocess.run([sys.executable, EXAMPLE, "--train_dir", str(tmp_path), "--plan", "fresh",
                            "--train_for_env_frames", "10000"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "fastrl: plan:" in first.stdout
    summary = read_summary(tmp_path, "residual_mlp")
    assert summary["env_frames"] >= 10000 and summary["samples_trained"] > 0
    saved = json.loads((tmp_path / "residual_mlp" / "config.json").read_text())
    assert (saved["model"], saved["modules"]) == ("residual_mlp", EXAMPLE)
    cfg = config_from_saved(saved)
    state, _ = load_latest_checkpoint(checkpoint_dir(cfg))
    # The example's layer norms, in the policy's encoder and the critic's (separate_critic).
    assert {"encoders.0.net.blocks.1.0.weight", "critic_encoders.0.net.blocks.1.0.weight"} <= set(state["model"])
    # Resumed from that checkpoint with a larger budget: the weights load into the model built again.
    again = subprocess.run([sys.executable, EXAMPLE, "--train_dir", str(tmp_path), "--plan", "off",
                            "--train_for_env_frames", "20000"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "fastrl: resuming with the options" in again.stdout
    assert read_summary(tmp_path, "residual_mlp")["env_frames"] >= 20000
    newer, _ = load_latest_checkpoint(checkpoint_dir(cfg))
    assert newer["version"] > state["version"]


@pytest.mark.slow
def test_the_compiled_learner_and_actors_run_a_custom_encoder(tmp_path):
    # torch.compile of the learner's unroll and of a rollout worker's forward, through the
    # user's module; a GRU core so that the learner compiles. Stopped once both say so.
    run = TrainRun(["--env", "CartPole-v1", "--model", "examples.custom_model:build_encoder", "--use_rnn", "true",
                    "--rnn_size", "16", "--rollout", "8", "--plan", "off", "--num_workers", "1",
                    "--compile_learner", "on", "--compile_actors", "on", "--train_for_seconds", "400",
                    "--train_dir", str(tmp_path), "--status_every_seconds", "10"])
    try:
        run.wait_for_line(lambda line: "the learner's step runs compiled" in line, timeout=360)
        run.wait_for_line(lambda line: line.startswith("fastrl: the rollout workers' forward"), timeout=60)
        run.signal_group(signal.SIGINT)
        assert run.wait(timeout=60) == 128 + signal.SIGINT, run.output()
    finally:
        run.kill_all()
    summary = read_summary(tmp_path, "CartPole-v1")
    assert summary["learner_compile"]["chosen"] == "compiled", summary["learner_compile"]
    assert [r["chosen"] for r in summary["actor_compile"]] == ["compiled"], summary["actor_compile"]


class Flat(nn.Module):
    """Any observation, flattened, through one linear layer; records what it was given."""

    def __init__(self, in_dim: int, out_dim: int = 8):
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)
        self.seen = None

    def forward(self, x):
        self.seen = x
        if isinstance(x, dict):
            x = torch.cat([v.float().reshape(len(v), -1) for v in x.values()], dim=1)
        return torch.tanh(self.linear(x.flatten(1)))


def _flat(obs_space, spec):
    if isinstance(obs_space, gym.spaces.Dict):
        return Flat(sum(int(np.prod(s.shape)) for s in obs_space.spaces.values()))
    return Flat(int(np.prod(obs_space.shape)))


register_model("test_flat", _flat)
VECTOR = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
IMAGE = gym.spaces.Box(0, 255, (1, 6, 6), np.uint8)
ACTIONS = gym.spaces.Discrete(3)


def _batch(space, rows: int) -> dict:
    spaces = space.spaces if isinstance(space, gym.spaces.Dict) else {"obs": space}
    return {key: torch.as_tensor(np.stack([s.sample() for _ in range(rows)])) for key, s in spaces.items()}


@pytest.mark.parametrize("use_rnn", [False, True])
def test_a_custom_encoder_acts_and_learns_the_same_numbers_inside_fastrls_network(use_rnn):
    # act (inference, step by step) and evaluate (the learner's unroll) must agree, as for fastrl's encoders.
    torch.manual_seed(0)
    model = ActorCritic(VECTOR, ACTIONS, ModelSpec(model="test_flat", use_rnn=use_rnn, rnn_size=5))
    assert model.encoders[0].out_dim == 8 and model.core_size == (5 if use_rnn else 8)
    steps, batch = 4, 3
    obs = {"obs": torch.randn(steps + 1, batch, 3)}
    h0 = torch.zeros(batch, model.rnn_state_size)
    h, actions, logps, values = h0, [], [], []
    with torch.no_grad():
        for t in range(steps + 1):
            out = model.act({"obs": obs["obs"][t]}, h)
            h = out.rnn_state
            actions.append(out.actions)
            logps.append(out.logp)
            values.append(out.values)
        ev = model.evaluate(obs, h0, torch.zeros(steps + 1, batch), torch.stack(actions[:steps]))
    torch.testing.assert_close(ev.logp, torch.stack(logps[:steps]))
    torch.testing.assert_close(ev.values, torch.stack(values))
    loss = model.evaluate(obs, h0, torch.zeros(steps + 1, batch), torch.stack(actions[:steps])).logp.sum()
    loss.backward()
    assert model.encoders[0].net.linear.weight.grad is not None  # the user's weights learn


def test_the_encoder_gets_images_scaled_and_dicts_whole_and_normalised_when_asked():
    image = ActorCritic(IMAGE, ACTIONS, ModelSpec(model="test_flat"))
    frames = torch.full((2, 1, 6, 6), 255, dtype=torch.uint8)
    with torch.no_grad():
        image.act({"obs": frames}, torch.zeros(2, 0))
    seen = image.encoders[0].net.seen
    assert seen.dtype == torch.float32 and float(seen.max()) == 1.0  # /255, as fastrl's conv encoder does
    both = gym.spaces.Dict({"pos": VECTOR, "room": gym.spaces.Discrete(4)})
    model = ActorCritic(both, ACTIONS, ModelSpec(model="test_flat", normalize_obs=True, separate_critic=True))
    batch = _batch(both, 64)
    batch["pos"] = batch["pos"] * 0.1 + 5.0
    model.update_normalizer(batch)
    with torch.no_grad():
        model.act(batch, torch.zeros(64, 0))
    seen = model.encoders[0].net.seen
    assert set(seen) == {"pos", "room"} and seen["room"].dtype == torch.int64
    # The running z-score of the vector key, in the policy's encoder and the critic's, fed by the learner's call.
    assert abs(float(seen["pos"].mean())) < 1e-4
    norms = [name for name, _ in model.named_buffers() if name.endswith("norm.count")]
    assert norms == ["encoders.0.inputs.0.norm.count", "critic_encoders.0.inputs.0.norm.count"]


def test_bf16_runs_the_encoder_under_autocast_and_returns_float32_features():
    model = ActorCritic(IMAGE, ACTIONS, ModelSpec(model="test_flat", conv_bf16=True))
    features = model.encoders[0]({"obs": obs_zeros((2,), (1, 6, 6), torch.uint8)})
    assert model.encoders[0].net.seen.dtype == torch.float32 and features.dtype == torch.float32
    fp32 = ActorCritic(IMAGE, ACTIONS, ModelSpec(model="test_flat"))
    fp32.load_state_dict(model.state_dict())  # precision changes no weight


class Wrong(nn.Module):
    def __init__(self, give):
        super().__init__()
        self.give = give

    def forward(self, x):
        return self.give(x)


@pytest.mark.parametrize("give, sentence", [
    (lambda x: x[:, None], "Model 'test_wrong': its encoder must return features of shape [2, features] for 2 "
                           "observations, but returned [2, 1, 3]."),
    (lambda x: (x, x), "Model 'test_wrong': its encoder must return one tensor [2, features] for 2 observations, "
                       "but returned a tuple."),
    (lambda x: x.long(), "Model 'test_wrong': its encoder returned torch.int64 features; return floating-point ones."),
    (lambda x: x @ torch.zeros(5, 5), "Model 'test_wrong': its encoder failed on a batch of 2 observations of shapes "
                                      "{'obs': (3,)} (RuntimeError: mat1 and mat2 shapes cannot be multiplied "
                                      "(2x3 and 5x5))."),
])
def test_an_encoder_that_does_not_fit_is_named_with_the_shape_expected(give, sentence):
    register_model("test_wrong", lambda obs_space, spec: Wrong(give))
    with pytest.raises(ModelError) as refused:
        ActorCritic(VECTOR, ACTIONS, ModelSpec(model="test_wrong"))
    assert str(refused.value) == sentence


def test_a_declared_width_and_a_builder_without_a_module_are_checked():
    def declares_wrong(obs_space, spec):
        net = Flat(3, out_dim=8)
        net.out_dim = 16
        return net

    register_model("test_declares", declares_wrong)
    with pytest.raises(ModelError, match=r"must return features of shape \[2, 16\] for 2 observations, but returned "
                                         r"\[2, 8\]\."):
        ActorCritic(VECTOR, ACTIONS, ModelSpec(model="test_declares"))
    register_model("test_no_module", lambda obs_space, spec: torch.zeros(3))
    with pytest.raises(ModelError, match="its builder must return a torch.nn.Module, the encoder, but returned a "
                                         "Tensor."):
        ActorCritic(VECTOR, ACTIONS, ModelSpec(model="test_no_module"))


def test_an_unknown_model_is_refused_before_any_process_starts(tmp_path):
    cfg, _ = parse_args(["--env", "CartPole-v1", "--model", "tiny_cnn", "--train_dir", str(tmp_path)])
    with pytest.raises(ConfigError, match="Unknown model 'tiny_cnn' \\(registered in this process: "):
        check_env_and_options(cfg)
    refused = subprocess.run([sys.executable, "-m", "fastrl.train", "--env", "CartPole-v1", "--model",
                              "examples.custom_model:no_such", "--train_dir", str(tmp_path)],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "fastrl: error: Model 'examples.custom_model:no_such': module 'examples.custom_model' has no function "
        "'no_such'; define no_such(obs_space, spec) there, returning the encoder."]
    with pytest.raises(ModelError, match="the model name 'test_flat' is taken \\(already registered by "
                                         "test_custom_model\\)"):
        exec("register_model('test_flat', builder)", {"__name__": "someone_else", "register_model": register_model,
                                                      "builder": _flat})


def test_a_changed_model_module_gets_its_own_profile_and_precision_timings(tmp_path, monkeypatch):
    # A profile of yesterday's encoder must not plan today's: the cache key holds the user's source.
    from fastrl.algo.model import Precision
    from fastrl.tuning.profiling import cache_path, setup_cache_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    module = tmp_path / "my_encoder.py"
    module.write_text("WIDTH = 64\n")
    cfg, _ = parse_args(["--env", "CartPole-v1", "--modules", str(module), "--model", "my_encoder:build"])
    fp32 = Precision("fp32", "fp32", "test")
    before = (setup_cache_path("costs", cfg, fp32), cache_path({"precision": 1}, cfg.modules))
    assert before == (setup_cache_path("costs", cfg, fp32), cache_path({"precision": 1}, cfg.modules))
    module.write_text("WIDTH = 128\n")
    after = (setup_cache_path("costs", cfg, fp32), cache_path({"precision": 1}, cfg.modules))
    assert before[0] != after[0] and before[1] != after[1]
    other, _ = parse_args(["--env", "CartPole-v1", "--modules", str(module), "--model", "other:build"])
    assert setup_cache_path("costs", other, fp32) != after[0]


def test_an_encoder_that_does_not_fit_stops_the_command_in_one_sentence(tmp_path):
    module = tmp_path / "narrow.py"
    module.write_text("import torch.nn as nn\n"
                      "def build(obs_space, spec):\n"
                      "    net = nn.Linear(obs_space.shape[0], 8)\n"
                      "    net.out_dim = 16\n"
                      "    return net\n")
    refused = subprocess.run([sys.executable, "-m", "fastrl.train", "--env", "CartPole-v1", "--modules", str(module),
                              "--model", "narrow:build", "--train_dir", str(tmp_path)],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "fastrl: error: Model 'narrow:build': its encoder must return features of shape [2, 16] for 2 observations, "
        "but returned [2, 8]."]
    assert not os.path.exists(tmp_path / "CartPole-v1" / "checkpoints")
