"""--decorrelate_envs: envs whose episodes always run to their time limit start at
spread-out steps of their first episode, the same ones for the same seeds, and the
cut-into first episodes stay out of the episode statistics."""
import gymnasium
import numpy as np
from fastrl.envs.registry import get_spec

from fastrl.algo.distributions import GaussianSpec
from fastrl.sampling.env_split import MAX_STEPS_INTO_EPISODE, SplitEnvs, SplitOptions, make_envs

LIMIT = 200  # Pendulum-v1's max_episode_steps: every episode runs to it
N, T = 8, 16


def _split(decorrelate: bool, seeds=tuple(range(100, 100 + N)), limit: int = LIMIT, on_progress=lambda: None) -> tuple:
    spec = get_spec("Pendulum-v1")
    if limit == LIMIT:
        envs = make_envs(spec, {}, list(seeds))
    else:
        envs = [gymnasium.make("Pendulum-v1", max_episode_steps=limit) for _ in seeds]
        for env, seed in zip(envs, seeds):
            env.reset(seed=seed)
            env.action_space.seed(seed)
    space = envs[0].observation_space
    views = {
        "obs": {"obs": np.zeros((1, T + 1, N, *space.shape), np.float32)},
        "final_obs": {"obs": np.zeros((1, T + 1, N, *space.shape), np.float32)},
        "actions": np.zeros((1, T + 1, N, 1), np.float32),
        "rewards": np.zeros((1, T + 1, N), np.float32),
        "terminated": np.zeros((1, T + 1, N), bool),
        "truncated": np.zeros((1, T + 1, N), bool),
        "episode_start": np.zeros((1, T + 1, N), bool),
    }
    split = SplitEnvs(spec, {}, list(seeds), envs, views, GaussianSpec(envs[0].action_space),
                      SplitOptions(decorrelate=decorrelate, on_progress=on_progress))
    return split, views


def _elapsed(env) -> int:
    while not isinstance(env, gymnasium.wrappers.TimeLimit):
        env = env.env
    return env._elapsed_steps


def _run(split, steps: int) -> None:
    for step in range(steps):
        split.receive(0, step % T)


def test_time_limited_envs_start_at_spread_out_steps_the_same_for_the_same_seeds():
    split, views = _split(decorrelate=True)
    again, _ = _split(decorrelate=True)
    plain, _ = _split(decorrelate=False)
    try:
        for s in (split, again, plain):
            s.reset_all(0, 0)
        into = [_elapsed(env) for env in split.envs]
        assert len(set(into)) > N // 2 and all(0 <= k < LIMIT for k in into), into
        assert into == [_elapsed(env) for env in again.envs]
        assert [_elapsed(env) for env in plain.envs] == [0] * N
        assert views["episode_start"][0, 0].all()
        # The recorded first observation is where the env is, not its reset's.
        for i, env in enumerate(split.envs):
            theta, theta_dot = env.unwrapped.state
            assert np.allclose(views["obs"]["obs"][0, 0, i], [np.cos(theta), np.sin(theta), theta_dot], atol=1e-5)
    finally:
        for s in (split, again, plain):
            s.close()


def test_only_whole_episodes_are_counted():
    split, _ = _split(decorrelate=True)
    plain, _ = _split(decorrelate=False)
    try:
        split.reset_all(0, 0)
        plain.reset_all(0, 0)
        into = [_elapsed(env) for env in split.envs]
        # In 2 x LIMIT steps an env that started k > 0 steps in ends its cut-into
        # episode (not counted) and one whole one; one that started at 0 ends two.
        _run(split, 2 * LIMIT)
        _run(plain, 2 * LIMIT)
        lengths = [length for _, length, _ in split.drain_finished()]
        assert len(lengths) == sum(2 if k == 0 else 1 for k in into), (into, lengths)
        assert set(lengths) == {LIMIT}
        assert [length for _, length, _ in plain.drain_finished()] == [LIMIT] * (2 * N)
    finally:
        split.close()
        plain.close()


def test_a_long_limit_is_stepped_into_no_further_than_the_cap_and_each_env_is_progress():
    beats = []
    split, _ = _split(decorrelate=True, limit=100_000, on_progress=lambda: beats.append(1))
    try:
        split.reset_all(0, 0)
        into = [_elapsed(env) for env in split.envs]
        assert all(0 <= k < MAX_STEPS_INTO_EPISODE for k in into) and max(into) > MAX_STEPS_INTO_EPISODE // 4, into
        assert len(beats) == N
    finally:
        split.close()
