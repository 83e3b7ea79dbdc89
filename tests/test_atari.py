"""Atari envs: the preprocessing contract (shapes, frame stack, seeding) and the
episode semantics the trainer relies on (episodic life, true objective, time limit).

Breakout with the NOOP action is the workhorse: FIRE on reset launches the ball, the
idle paddle misses it, and a life is lost every ~24 steps, so a full 5-life game
takes ~120 steps (a fraction of a second).
"""
import json
import re

import numpy as np
import pytest

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from fastrl.envs.atari import AtariEnv  # noqa: E402
from fastrl.envs.registry import UnknownEnvError, get_spec  # noqa: E402

NOOP = 0


@pytest.mark.parametrize("name", ["atari_pong", "atari_breakout"])
def test_construct_and_step(name):
    spec = get_spec(name)
    assert spec.frameskip == 4
    env = spec.make(seed=1)
    try:
        obs, info = env.reset()
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
        assert env.observation_space.contains(obs)
        for _ in range(20):
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            assert env.observation_space.contains(obs)
            assert isinstance(reward, float) and not truncated
            assert "lives" in info
        assert obs.any(), "the screen should not be all black"
    finally:
        env.close()


def _play(env, actions):
    frames = [env.reset()[0]]
    frames += [env.step(a)[0] for a in actions]
    return np.stack(frames)


def test_reset_is_deterministic_given_a_seed():
    actions = np.random.default_rng(0).integers(0, 4, size=40)
    a, b = get_spec("atari_breakout").make(seed=7), get_spec("atari_breakout").make(seed=7)
    try:
        first = _play(a, actions)
        np.testing.assert_array_equal(first, _play(b, actions))
        a.reset(seed=11)
        b.reset(seed=11)
        np.testing.assert_array_equal(a.step(2)[0], b.step(2)[0])
        a.reset(seed=7)  # the make-time seed again: the same game as the first
        np.testing.assert_array_equal(np.stack([a.step(x)[0] for x in actions]), first[1:])
    finally:
        a.close()
        b.close()


def test_frame_stack_shifts_by_one_frame_per_step():
    env = get_spec("atari_pong").make(seed=0)
    try:
        obs, _ = env.reset()
        assert all((obs[i] == obs[0]).all() for i in range(4)), "reset fills the stack with the first frame"
        previous = obs
        for _ in range(10):
            obs = env.step(env.action_space.sample())[0]
            np.testing.assert_array_equal(obs[:3], previous[1:])
            previous = obs
    finally:
        env.close()


def test_losing_a_life_terminates_the_episode_but_not_the_game():
    env = get_spec("atari_breakout").make(seed=3)
    try:
        _, info = env.reset()
        assert info["lives"] == 5
        episodes = []  # (return, lives after, info) per learner episode
        episode_return = 0.0
        for _ in range(2000):
            _, reward, terminated, truncated, info = env.step(env.action_space.sample())
            episode_return += reward
            assert not truncated
            if terminated:
                episodes.append((episode_return, info))
                if "true_objective" in info:
                    break
                _, reset_info = env.reset()
                assert reset_info["lives"] == info["lives"], "reset after a life loss continues the game"
                episode_return = 0.0
        lives = [i["lives"] for _, i in episodes]
        assert lives == [4, 3, 2, 1, 0]
        assert all("true_objective" not in i for _, i in episodes[:-1])
        assert episodes[-1][1]["true_objective"] == pytest.approx(sum(r for r, _ in episodes))
        assert env.reset()[1]["lives"] == 5, "after a game over, reset starts a new game"
    finally:
        env.close()


def test_seeded_resets_continue_the_game_and_load_the_rom_once():
    # The trainer seeds every episode's reset (fastrl/sampling/env_split.py). A seed
    # after a life lost must not start a new game: every episode would be a first
    # life, no game would end (no true objective), and ALE reloads its ROM to take a
    # seed, which cost 76% of a rollout worker's time on Breakout.
    env = get_spec("atari_breakout").make(seed=3)
    loads = []
    load_game = env._game.load_game
    env._game.load_game = lambda: (loads.append(1), load_game())
    try:
        _, info = env.reset(seed=100)
        lives, games, seed = [info["lives"]], 0, 101
        for _ in range(3000):
            _, _, terminated, truncated, info = env.step(NOOP)
            if terminated or truncated:
                games += "true_objective" in info
                if games == 2:
                    break
                _, info = env.reset(seed=seed)
                seed += 1
                lives.append(info["lives"])
        assert games == 2
        assert lives == [5, 4, 3, 2, 1, 5, 4, 3, 2, 1], "each seeded reset after a life lost continued the game"
        assert len(loads) == 1, "ALE took its seed once, at the first game"
    finally:
        env.close()


def test_full_game_episodes_without_episodic_life():
    env = get_spec("atari_breakout").make(seed=3, atari_episodic_life=False)
    try:
        env.reset()
        lives_seen, steps = set(), 0
        while True:
            _, _, terminated, truncated, info = env.step(NOOP)
            steps += 1
            lives_seen.add(info["lives"])
            if terminated or truncated:
                break
        assert terminated and info["lives"] == 0 and info["true_objective"] == 0.0
        assert lives_seen == {5, 4, 3, 2, 1, 0} and steps > 100, "the game went on through every life (FIRE relaunches)"
    finally:
        env.close()


def test_time_limit_is_truncation_and_reports_the_game():
    env = AtariEnv("breakout", seed=0, max_game_frames=60)  # the ball needs ~90 frames to get past the paddle
    try:
        env.reset()
        for steps in range(1, 100):  # noqa: B007 (read after the loop: the step the game ended on)
            _, _, terminated, truncated, info = env.step(NOOP)
            if terminated or truncated:
                break
        assert truncated and not terminated and steps < 15
        assert info["true_objective"] == 0.0 and info["lives"] == 5
        env.reset()
        assert not any(env.step(NOOP)[2:4]), "reset after the time limit starts a new game"
    finally:
        env.close()


def test_options_and_rendering():
    env = get_spec("atari_pong").make(seed=0, atari_sticky_actions=True, render_mode="rgb_array")
    try:
        assert env.unwrapped._ale.getFloat("repeat_action_probability") == pytest.approx(0.25)
        env.reset()
        assert env.render().shape == (210, 160, 3)
    finally:
        env.close()
    with pytest.raises(ValueError, match="did you mean atari_sticky_actions"):
        get_spec("atari_pong").make(atari_sticky_action=True)


def test_unknown_atari_name_suggests_the_closest():
    with pytest.raises(UnknownEnvError, match="did you mean 'atari_breakout'"):
        get_spec("atari_breakot")
    with pytest.raises(UnknownEnvError, match="did you mean 'atari_space_invaders'"):
        get_spec("atari_spaceinvaders")


def test_the_atari_preset_trains_on_policy_as_a_user_runs_it(tmp_path):
    # The family's defaults end to end on a real game: batches sampled with the newest
    # weights only (lag 0), minibatches of single steps, ReLU encoder, signed rewards.
    from helpers import TrainRun, read_summary

    run = TrainRun(["--env", "atari_breakout", "--train_dir", str(tmp_path), "--train_for_env_frames", "16000",
                    "--status_every_seconds", "1"])
    assert run.wait(timeout=150) == 0, run.output()
    cfg = json.loads((tmp_path / "atari_breakout" / "config.json").read_text())
    assert (cfg["max_batches_ahead"], cfg["minibatch_split"], cfg["use_rnn"], cfg["reward_clip"]) == (0, "samples",
                                                                                                         False, 1.0)
    lags = [int(m.group(1)) for m in map(re.compile(r"lag min/mean/max \d+/[\d.]+/(\d+)").search, run.lines) if m]
    assert lags and max(lags) == 0, run.output()
    assert read_summary(tmp_path, "atari_breakout")["env_frames"] >= 16000
    assert run.leftover_processes() == [] and run.new_shm_entries() == set()
