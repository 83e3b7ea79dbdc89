"""python -m fastrl.export: an experiment becomes a folder of safetensors weights, its
options, a model card, learning curve and replay, which enjoy --from and
fastrl.load_policy play in a fresh process; bad input ends in one sentence and
leaves nothing half-written."""
import json
import os
import subprocess
import sys

import cv2
import gymnasium as gym
import numpy as np
import pytest
import yaml
from helpers import make_experiment
from safetensors import safe_open

import fastrl
from fastrl import export
from fastrl.config import Config, save_config
from fastrl.learning.checkpoint import checkpoint_dir
from fastrl.runtime.monitor import Monitor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = "CartPole-v1"


def _trained_looking_experiment(train_dir: str) -> Config:
    """An experiment as a run leaves it, without training: a checkpoint of an untrained GRU model
    with an observation normaliser, config.json with its origins, TensorBoard returns, summary.json."""
    cfg = make_experiment(train_dir, "tiny", ENV, hidden_sizes="16", use_rnn=True, rnn_size=8, normalize_obs=True)
    save_config(cfg, os.path.join(cfg.experiment_dir, "config.json"),
                {"hidden_sizes": "given", "normalize_obs": "given", "rnn_size": "given", "use_rnn": "given",
                 "experiment": "given", "train_dir": "given", "vtrace_lambda": "spaces preset"})
    monitor = Monitor(cfg, cfg.experiment_dir)
    for i, ret in enumerate([12.0, 20.0, 31.0]):
        monitor.log(400 * (i + 1), float(i), {"train/return_mean_100": ret})
    monitor.close()
    with open(os.path.join(cfg.experiment_dir, "summary.json"), "w") as fh:
        json.dump({"env": ENV, "env_frames": 1234, "mean_return_100": 31.0}, fh)
    return cfg


def _run(module: str, *args, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def _observations(count: int) -> list:
    env = gym.make(ENV)
    obs, _ = env.reset(seed=3)
    seen = [obs]
    for _ in range(count - 1):
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        seen.append(env.reset()[0] if terminated or truncated else obs)
    env.close()
    return seen


def test_an_export_holds_weights_card_curve_and_replay_and_plays_in_a_fresh_process(tmp_path):
    cfg = _trained_looking_experiment(str(tmp_path / "train"))
    out = str(tmp_path / "shared" / "cartpole-agent")
    made = _run("fastrl.export", "tiny", "--train_dir", cfg.train_dir, "--out", out, "--video_steps", "6",
                "--repo_id", "someone/cartpole")
    assert made.returncode == 0, made.stderr
    assert sorted(os.listdir(out)) == ["README.md", "config.json", "export.json", "learning_curve.png",
                                       "model.safetensors", "replay.mp4"]
    assert "huggingface-cli upload someone/cartpole" in made.stdout
    assert [n for n in os.listdir(tmp_path / "shared") if n != "cartpole-agent"] == []  # no staging folder left

    # safetensors, not pickle: every tensor of the checkpoint's model, the normaliser's statistics too.
    from fastrl.learning.checkpoint import load_checkpoint

    state = load_checkpoint(os.path.join(checkpoint_dir(cfg), sorted(os.listdir(checkpoint_dir(cfg)))[-1]))["model"]
    with safe_open(os.path.join(out, "model.safetensors"), "pt") as weights:
        assert sorted(weights.keys()) == sorted(state)
        assert all((weights.get_tensor(k) == v).all() for k, v in state.items())
    assert any("mean" in k for k in state)

    with open(os.path.join(out, "README.md")) as fh:
        card = fh.read()
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["library_name"] == "fastrl" and ENV in meta["tags"]
    assert meta["model-index"][0]["results"][0]["metrics"][0]["value"] == "31.00"
    assert "| env frames trained | 1,234 |" in card
    assert ("python -m fastrl.train --env CartPole-v1 --experiment tiny --hidden_sizes 16 --normalize_obs true "
            f"--rnn_size 8 --train_dir {cfg.train_dir} --use_rnn true") in card  # the given options, not the presets
    assert "![Mean return of the last 100 episodes](learning_curve.png)" in card
    assert "huggingface-cli download someone/cartpole --local-dir agent" in card
    with open(os.path.join(out, "learning_curve.png"), "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    video = cv2.VideoCapture(os.path.join(out, "replay.mp4"))
    frames = 0
    while video.read()[0]:
        frames += 1
    video.release()
    steps = int(card.split(" steps.")[0].rsplit(" over ", 1)[1])
    assert 1 <= steps <= 6 and frames == steps + 1  # the reset's frame, then one per step

    # Both ways of loading it, in a fresh process, act as the experiment's own checkpoint does.
    played = _run("fastrl.enjoy", "--from", out, "--episodes", "1", "--seed", "5", "--deterministic", cwd=tmp_path)
    assert played.returncode == 0, played.stderr
    assert f"of {ENV} with {out} (policy version 3, 1,234 env frames)" in played.stdout
    observations = np.stack(_observations(20))
    script = ("import sys, json, numpy as np, fastrl; p = fastrl.load_policy(sys.argv[1], deterministic=True); "
              "obs = np.load(sys.argv[2]); print(json.dumps([int(p(o)) for o in obs]))")
    np.save(tmp_path / "obs.npy", observations)
    loaded = subprocess.run([sys.executable, "-c", script, out, str(tmp_path / "obs.npy")], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert loaded.returncode == 0, loaded.stderr
    experiment = fastrl.load_policy("tiny", train_dir=cfg.train_dir, deterministic=True)
    assert json.loads(loaded.stdout) == [int(experiment(o)) for o in observations]


def test_export_refuses_bad_input_in_one_sentence_and_writes_nothing(tmp_path, capsys):
    cfg = _trained_looking_experiment(str(tmp_path / "train"))
    base = ["--train_dir", cfg.train_dir, "--no_video"]

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    assert export.main(["tiny", "--out", str(busy), *base]) == 2
    assert "exists and is not empty; choose a new or empty folder, or pass --force" in capsys.readouterr().err
    assert export.main(["tiny", "--out", str(busy), "--force", *base]) == 2
    assert "holds no earlier export (export.json), so --force does not replace it" in capsys.readouterr().err
    assert os.listdir(busy) == ["notes.txt"]

    out = str(tmp_path / "out")
    assert export.main(["tiny", "--out", out, *base]) == 0
    assert export.main(["tiny", "--out", out, "--force", "--checkpoint", "best", *base]) == 2
    assert "has no best checkpoint" in capsys.readouterr().err
    assert export.main(["tiny", "--out", out, "--force", *base]) == 0  # an earlier export is replaced
    assert "README.md" in os.listdir(out)

    assert export.main(["nope", "--out", str(tmp_path / "x"), *base]) == 2
    assert "No experiment at" in capsys.readouterr().err
    for name in os.listdir(checkpoint_dir(cfg)):
        os.unlink(os.path.join(checkpoint_dir(cfg), name))
    assert export.main(["tiny", "--out", str(tmp_path / "x"), *base]) == 2
    assert "has no usable checkpoint" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "x")
    assert sorted(os.listdir(tmp_path)) == ["busy", "out", "train"]


def test_a_failure_while_writing_leaves_no_export_and_no_staging_folder(tmp_path, monkeypatch):
    cfg = _trained_looking_experiment(str(tmp_path / "train"))

    def broken_card(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(export, "model_card", broken_card)
    args = export.build_parser().parse_args(["tiny", "--train_dir", cfg.train_dir, "--out", str(tmp_path / "out"),
                                             "--no_video"])
    with pytest.raises(OSError, match="disk full"):
        export.export(args)
    assert sorted(os.listdir(tmp_path)) == ["train"]


def test_loading_something_that_is_no_agent_says_so(tmp_path, capsys):
    (tmp_path / "stray").mkdir()
    with pytest.raises(fastrl.AgentLoadError, match="is neither an export folder .* nor an experiment folder"):
        fastrl.load_policy(str(tmp_path / "stray"))
    with pytest.raises(fastrl.AgentLoadError, match="No experiment at"):
        fastrl.load_policy("nope", train_dir=str(tmp_path))
    from fastrl import enjoy

    assert enjoy.main(["--from", str(tmp_path / "stray")]) == 2
    assert "is not an export folder (it has no export.json)" in capsys.readouterr().err
    (tmp_path / "stray" / "export.json").write_text('{"format": "something-else"}')
    with pytest.raises(fastrl.AgentLoadError, match="is not a fastrl-export/1 export"):
        fastrl.load_policy(str(tmp_path / "stray"))


def test_an_export_carries_every_kind_of_space_fastrl_trains_on():
    from fastrl.agent import space_from_json, space_to_json

    box = gym.spaces.Box(np.array([-np.inf, 0.0], np.float32), np.array([1.0, np.inf], np.float32))
    spaces = [gym.spaces.Box(-np.inf, np.inf, (4,)), box, gym.spaces.Box(0, 255, (3, 8, 8), np.uint8),
              gym.spaces.Discrete(3, start=1), gym.spaces.MultiDiscrete([2, 3]),
              gym.spaces.Dict({"pos": box, "action_mask": gym.spaces.MultiBinary(3)}),
              gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Discrete(3)])]
    for space in spaces:
        assert space_from_json(json.loads(json.dumps(space_to_json(space)))) == space
    assert space_to_json(spaces[2])["low"] == 0  # a uniform bound is one number, not 192 of them


def test_a_handed_over_agent_runs_no_code_its_config_asks_for_unless_named(tmp_path):
    # An export whose config.json names a module of its own (a planted one: it leaves a marker when imported).
    cfg = _trained_looking_experiment(str(tmp_path / "train"))
    out = str(tmp_path / "handed_over")
    assert _run("fastrl.export", "tiny", "--train_dir", cfg.train_dir, "--out", out, "--no_video").returncode == 0
    marker = tmp_path / "it ran"
    planted = tmp_path / "planted.py"
    planted.write_text(f"open({str(marker)!r}, 'w').close()\n")
    with open(os.path.join(out, "config.json")) as fh:
        saved = json.load(fh)
    with open(os.path.join(out, "config.json"), "w") as fh:
        json.dump({**saved, "modules": str(planted)}, fh)
    for refused in (_run("fastrl.enjoy", "--from", out, "--episodes", "1"),
                    _run("fastrl.enjoy", "--env", ENV, "--train_dir", str(tmp_path), "--experiment", "handed_over")):
        assert refused.returncode == 2 and f"pass --modules {planted} (" in refused.stderr, refused.stderr
    script = (f"import fastrl\ntry:\n    fastrl.load_policy({out!r})\nexcept fastrl.AgentLoadError as err:\n"
              f"    print(err)\n")
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "which fastrl runs only when you name it" in loaded.stdout, loaded.stdout + loaded.stderr
    assert not marker.exists()
    # Named by the user, it is theirs to run.
    named = _run("fastrl.enjoy", "--from", out, "--episodes", "1", "--modules", str(planted))
    assert named.returncode == 0, named.stderr
    assert marker.exists()


def test_a_scenario_file_a_config_names_is_opened_only_when_named(tmp_path):
    from fastrl.agent import AgentLoadError, Named, followed

    saved = {"env": "doom_custom", "doom_scenario": "/elsewhere/handed_over.cfg"}
    with pytest.raises(AgentLoadError, match="plays the ViZDoom scenario /elsewhere/handed_over.cfg its config names, "
                                             "which fastrl opens only when you name it; if you trust it, pass "
                                             "--doom_scenario /elsewhere/handed_over.cfg"):
        followed(saved, Named(), "The agent in x")
    assert followed(saved, Named(doom_scenario="/elsewhere/handed_over.cfg"), "x") == saved
