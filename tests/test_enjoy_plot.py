"""Watching and comparing runs: enjoy plays a saved policy and records a video that
OpenCV decodes; plot draws curves from TensorBoard events."""
import os
import re
import subprocess
import sys

import cv2
from helpers import make_experiment

from fastrl import enjoy, plot
from fastrl.algo.model import build_model
from fastrl.config import Config
from fastrl.learning.checkpoint import checkpoint_dir
from fastrl.runtime.monitor import Monitor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = "CartPole-v1"


def _make_experiment(train_dir: str, name: str = "tiny") -> Config:
    """An experiment of an untrained GRU model, without training."""
    return make_experiment(train_dir, name, ENV, hidden_sizes="16", use_rnn=True, rnn_size=8)


def test_enjoy_prints_returns_and_writes_a_decodable_video(tmp_path):
    cfg = _make_experiment(str(tmp_path / "train"))
    video = str(tmp_path / "out" / "x.mp4")
    proc = subprocess.run(
        [sys.executable, "-m", "fastrl.enjoy", "--env", ENV, "--experiment", "tiny", "--train_dir", cfg.train_dir,
         "--episodes", "2", "--save_video", video, "--deterministic", "--seed", "5"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lengths = [int(n) for n in re.findall(r"^episode \d: return [\d.]+, length (\d+)$", proc.stdout, re.M)]
    assert len(lengths) == 2, proc.stdout

    # The same saved policy, played here on the same seeds, must give the same episodes:
    # the subprocess really loaded the checkpoint and carried the GRU state.
    from fastrl.envs.registry import get_spec

    env = get_spec(ENV).make(seed=5)
    model = build_model(cfg, env.observation_space, env.action_space)
    model.load_state_dict(enjoy.select_checkpoint(cfg, "latest")[0]["model"])
    model.eval()
    here = [enjoy.play_episode(env, model, 5 + i, True, None)[1] for i in range(2)]
    env.close()
    assert here == lengths

    capture = cv2.VideoCapture(video)
    frames, size = 0, None
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        frames += 1
        size = (frame.shape[1], frame.shape[0])
    capture.release()
    assert frames == sum(length + 1 for length in lengths)  # one frame after each reset and each step
    assert size == (600, 400)  # CartPole's rgb_array render
    assert f"video: {video} ({frames} frames, 600x400)" in proc.stdout


def test_enjoy_refuses_a_missing_experiment_or_checkpoint(tmp_path, capsys):
    train_dir = str(tmp_path / "train")
    assert enjoy.main(["--env", ENV, "--experiment", "nope", "--train_dir", train_dir]) == 2
    assert "No experiment at" in capsys.readouterr().err

    cfg = _make_experiment(train_dir)
    assert enjoy.main(["--env", ENV, "--experiment", "tiny", "--train_dir", train_dir, "--checkpoint", "best"]) == 2
    assert "has no best checkpoint" in capsys.readouterr().err
    missing = str(tmp_path / "missing.pt")
    assert enjoy.main(["--env", ENV, "--experiment", "tiny", "--train_dir", train_dir, "--checkpoint", missing]) == 2
    assert f"Checkpoint {missing} does not exist; pass --checkpoint latest" in capsys.readouterr().err

    for name in os.listdir(checkpoint_dir(cfg)):
        os.unlink(os.path.join(checkpoint_dir(cfg), name))
    assert enjoy.main(["--env", ENV, "--experiment", "tiny", "--train_dir", train_dir]) == 2
    assert "has no usable checkpoint" in capsys.readouterr().err


def _events(exp_dir: str, returns) -> None:
    mon = Monitor(Config(env=ENV), exp_dir)
    for i, ret in enumerate(returns):
        mon.log(1000 * (i + 1), float(i), {"train/return_mean_100": ret})
    mon.close()


def test_plot_draws_two_runs_from_their_events(tmp_path, capsys):
    a, b = str(tmp_path / "run_a"), str(tmp_path / "run_b")
    _events(a, [10.0, 20.0, 40.0])
    _events(b, [15.0, 25.0])
    curve = plot.read_curve(a)
    assert (curve.label, curve.frames, curve.values) == ("run_a", [1000, 2000, 3000], [10.0, 20.0, 40.0])
    assert curve.seconds[0] == 0.0 and curve.seconds == sorted(curve.seconds)

    out = str(tmp_path / "plots" / "curves.png")
    assert plot.main([a, b, "--out", out]) == 0
    image = cv2.imread(out)
    assert image is not None and image.shape == (450, 1200, 3)
    assert image.std() > 0  # something was drawn
    assert "wrote" in capsys.readouterr().out


def test_plot_refuses_missing_or_empty_experiments(tmp_path, capsys):
    out = str(tmp_path / "curves.png")
    assert plot.main([str(tmp_path / "nowhere"), "--out", out]) == 2
    assert "has no TensorBoard folder" in capsys.readouterr().err

    empty = str(tmp_path / "empty")
    Monitor(Config(env=ENV), empty).close()  # a run that stopped before its first report
    assert plot.main([empty, "--out", out]) == 2
    assert "has no 'train/return_mean_100' values yet" in capsys.readouterr().err
    assert not os.path.exists(out)
