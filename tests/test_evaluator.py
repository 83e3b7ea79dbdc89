"""The evaluator, run in-process (in a thread) against real shared params, a real
stats board and real stop flags (the run's, and its own `abandon`), on CartPole with hand-made policies whose scores
are known: "always push left" falls in ~10 steps, "push toward the lean" (pole
angle + angular velocity > 0 -> right) balances for hundreds.
"""
import os
import threading
import time
from types import SimpleNamespace

import faster_fifo
import gymnasium
import numpy as np
import pytest
import torch
from fastrl.envs.registry import get_spec

from fastrl.algo.model import Precision, build_model, flat_state, flat_state_size
from fastrl.config import Config
from fastrl.learning import evaluator
from fastrl.learning.checkpoint import checkpoint_dir, load_checkpoint, save_best
from fastrl.learning.evaluator import evaluator_main
from fastrl.plumbing.params import SharedParams, StopFlag
from fastrl.plumbing.stats_board import StatsBoard

RESULT_TIMEOUT_S = 30.0
EVERY = 1000


class NeverEnding(gymnasium.Env):
    """CartPole's spaces, a reward of 1 a step, and no end: a user's env without a time limit."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        return np.zeros(4, np.float32), 1.0, False, False, {}


NEVER_ENDING = "fastrl_tests/NeverEnding-v0"
gymnasium.register(NEVER_ENDING, entry_point=NeverEnding)


def make_cfg(tmp_path, **overrides):
    return Config(**{"env": "CartPole-v1", "train_dir": str(tmp_path), "eval_every_frames": EVERY, "eval_episodes": 3,
                     **overrides})


def policy_params(model, lean_controller: bool) -> torch.Tensor:
    """Flat params of `model` set to always-left or to the lean controller."""
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        first, second = model.encoders[0].net[0], model.encoders[0].net[2]
        if lean_controller:
            first.weight[0, 2] = first.weight[0, 3] = 1.0  # h = tanh(angle + angular velocity)
            second.weight[0, 0] = 1.0
            model.policy_head.weight[0, 0], model.policy_head.weight[1, 0] = -1.0, 1.0
        else:
            model.policy_head.bias[0] = 1.0  # logits favour action 0 (left) everywhere
    return flat_state(model)


class Harness:
    """A SharedContext-like object and the evaluator running on it in a thread."""

    def __init__(self, cfg):
        env = get_spec(cfg.env).make()
        env.close()
        self.model = build_model(cfg, env.observation_space, env.action_space)
        self.params = SharedParams(flat_state_size(self.model))
        self.board = StatsBoard(["runner", "learner", "rollout_0", "rollout_1"])
        self.ctx = SimpleNamespace(obs_space=env.observation_space, action_space=env.action_space,
                                   params=[self.params], board=self.board, stop=StopFlag(),
                                   precision=Precision("fp32", "fp32", "no image encoder"), totals=None)
        self.results = faster_fifo.Queue(max_size_bytes=100_000)  # the runner's eval queue
        self.abandon = StopFlag()
        self.cfg = cfg
        self.thread = None

    def publish(self, lean_controller: bool, version: int) -> None:
        self.params.publish(policy_params(self.model, lean_controller), version)

    def set_frames(self, frames: int) -> None:
        self.board.row("rollout_0").set("env_frames", frames // 2)
        self.board.row("rollout_1").set("env_frames", frames - frames // 2)

    def start(self, frames_offset: int = 0) -> None:
        args = (self.cfg, self.ctx, self.results, self.abandon, frames_offset)
        self.thread = threading.Thread(target=evaluator_main, args=args, daemon=True)
        self.thread.start()

    def next_result(self) -> dict:
        return self.results.get(timeout=RESULT_TIMEOUT_S)

    def stop(self) -> float:
        """Abandon: seconds until the evaluator left."""
        self.abandon.set()
        return self.end_training()

    def end_training(self, timeout: float = 5.0) -> float:
        """Set the run's stop flag alone, as a run that ended normally does: seconds until the evaluator left."""
        t0 = time.perf_counter()
        self.ctx.stop.set()
        self.thread.join(timeout=timeout)
        assert not self.thread.is_alive()
        return time.perf_counter() - t0


@pytest.fixture
def harness(tmp_path):
    h = Harness(make_cfg(tmp_path))
    yield h
    if h.thread is not None and h.thread.is_alive():
        h.stop()


def best_state(cfg) -> dict:
    return load_checkpoint(os.path.join(checkpoint_dir(cfg), "best.pt"))


def test_results_determinism_and_best_checkpoint(harness):
    harness.publish(lean_controller=False, version=1)
    harness.start()
    time.sleep(0.3)
    assert harness.results.empty(), "no evaluation before eval_every_frames frames"

    harness.set_frames(EVERY + 10)
    first = harness.next_result()
    assert set(first) == {"env_frames", "version", "eval/return", "eval/length", "eval/seconds"}
    assert first["env_frames"] == EVERY + 10 and first["version"] == 1
    assert 5 <= first["eval/return"] <= 20 and first["eval/length"] == first["eval/return"]
    best = best_state(harness.cfg)
    assert best["version"] == 1 and best["best_score"] == best["eval_return"] == first["eval/return"]
    assert best["env"] == "CartPole-v1" and best["config"]["eval_episodes"] == 3 and best["env_frames"] == EVERY + 10
    harness.model.load_state_dict(best["model"])  # loads into a model of the experiment's config

    harness.publish(lean_controller=False, version=2)  # same weights, newer version
    harness.set_frames(3 * EVERY + 5)  # skips the 2*EVERY point it never saw
    second = harness.next_result()
    assert second["version"] == 2 and second["env_frames"] == 3 * EVERY + 5
    assert second["eval/return"] == first["eval/return"], "deterministic episodes of the same params"
    assert best_state(harness.cfg)["version"] == 1, "an equal score does not replace best.pt"

    harness.publish(lean_controller=True, version=3)
    harness.set_frames(4 * EVERY)
    third = harness.next_result()
    assert third["eval/return"] > 200
    best = best_state(harness.cfg)
    assert best["version"] == 3 and best["best_score"] == third["eval/return"]
    assert harness.results.empty(), "one result per grid point"
    assert harness.stop() < 1.0


def test_the_end_of_training_ends_the_loop_promptly_when_no_evaluation_is_due(harness):
    harness.publish(lean_controller=False, version=0)
    harness.start()
    harness.set_frames(EVERY - 1)
    time.sleep(0.2)
    assert harness.end_training() < 0.5
    assert harness.results.empty()
    assert not os.path.exists(os.path.join(checkpoint_dir(harness.cfg), "best.pt"))


def test_an_evaluation_due_when_training_ends_is_still_played(harness):
    """Training outran the evaluator's start (a busy machine, a short run): the
    point it passed is evaluated, on the final weights, before the evaluator leaves."""
    harness.publish(lean_controller=True, version=5)
    harness.set_frames(2 * EVERY + 1)
    harness.ctx.stop.set()
    harness.start()
    harness.end_training(timeout=RESULT_TIMEOUT_S)
    result = harness.next_result()
    assert result["env_frames"] == 2 * EVERY + 1 and result["version"] == 5 and result["eval/return"] > 200
    assert harness.results.empty(), "one evaluation for the points passed, not one per point"
    assert best_state(harness.cfg)["version"] == 5


def _evaluating(tmp_path, episodes: int, settle_s: float) -> Harness:
    """An evaluator given `settle_s` to begin an evaluation of `episodes` balanced
    episodes (~450 steps each) of the lean controller."""
    h = Harness(make_cfg(tmp_path, eval_episodes=episodes))
    h.publish(lean_controller=True, version=0)
    h.start()
    h.set_frames(EVERY)
    time.sleep(settle_s)
    return h


def test_the_end_of_training_lets_an_evaluation_under_way_finish(tmp_path):
    h = _evaluating(tmp_path, episodes=20, settle_s=0.3)  # ~10,000 balanced steps: about a second
    h.end_training(timeout=RESULT_TIMEOUT_S)
    assert h.next_result()["eval/return"] > 200


def test_stop_abandons_an_evaluation_under_way(tmp_path):
    h = _evaluating(tmp_path, episodes=200, settle_s=0.5)  # ~90,000 balanced steps: seconds of work
    assert h.stop() < 0.5
    assert h.results.empty() and not os.path.exists(os.path.join(checkpoint_dir(h.cfg), "best.pt"))


def test_a_resumed_run_counts_from_its_checkpoint_and_keeps_a_better_best(tmp_path):
    cfg = make_cfg(tmp_path)
    save_best(checkpoint_dir(cfg), {"model": {}, "version": 99}, score=1e9)
    h = Harness(cfg)
    h.publish(lean_controller=True, version=100)
    h.start(frames_offset=2 * EVERY + 500)
    try:
        h.set_frames(EVERY - 500)
        result = h.next_result()
        assert result["env_frames"] == 3 * EVERY and result["eval/return"] < 1e9
        assert best_state(cfg)["version"] == 99
    finally:
        h.stop()


def test_an_episode_that_never_ends_is_cut_at_the_step_limit_and_warned_of_once(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluator, "EPISODE_STEP_LIMIT", 500)
    h = Harness(make_cfg(tmp_path, env=NEVER_ENDING))
    h.publish(lean_controller=False, version=1)
    h.start()
    try:
        h.set_frames(EVERY)
        first = h.next_result()
        h.set_frames(2 * EVERY)
        second = h.next_result()
    finally:
        h.stop()
    assert first["eval/length"] == first["eval/return"] == second["eval/length"] == 500
    assert first["warning"].startswith(f"3 of the 3 evaluation episodes of {NEVER_ENDING} ran 500 steps without ending")
    assert "max_episode_steps" in first["warning"]
    assert "warning" not in second, "said once a run"


def test_true_objective_is_reported_on_full_games(tmp_path):
    pytest.importorskip("ale_py")
    h = Harness(Config(env="atari_breakout", train_dir=str(tmp_path), eval_every_frames=EVERY, eval_episodes=1))
    with torch.no_grad():
        for p in h.model.parameters():
            p.zero_()
        h.model.policy_head.bias[0] = 1.0  # NOOP: FIRE launches the ball, the idle paddle misses it, 5 times
    h.params.publish(flat_state(h.model), 7)
    h.start()
    try:
        h.set_frames(EVERY)
        result = h.next_result()
    finally:
        h.stop()
    assert result["eval/true_objective"] == result["eval/return"] == 0.0
    assert result["eval/length"] > 100, "a full game of 5 lives, not one life"
