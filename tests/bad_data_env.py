"""Envs that send bad data on purpose, for tests/test_reliability_iii.py. Importing this
module registers them, so spawned workers make them by the id "bad_data_env:<Id>" given
tests/ on their PYTHONPATH. Each counts steps per instance; episodes are 50 steps
(truncated) of observations in [-1, 1] and reward 1.
    NanBurst-v0      at its 100th step, a NaN observation and a NaN reward; then well again.
    NanObs-v0       NaN observations from its 100th step on.
    WrongShape-v0   from its first step, observations of shape (1,), which numpy would
                    broadcast into the (4,) its space promises.
    WrongDtype-v0   a Discrete space, whose observations fastrl stores as integers, and a
                    float observation (0.5) from its first reset.
"""
import gymnasium as gym
import numpy as np

EPISODE_STEPS = 50


class BadDataEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, nan_at=None, nan_from=None, wrong_shape=False):
        self.nan_at, self.nan_from, self.wrong_shape = nan_at, nan_from, wrong_shape
        self.steps = 0
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        self.steps += 1
        self._t += 1
        obs = self.np_random.uniform(-1, 1, 1 if self.wrong_shape else 4).astype(np.float32)
        reward = 1.0
        if self.steps == self.nan_at:
            obs[0], reward = np.nan, float("nan")
        if self.nan_from is not None and self.steps >= self.nan_from:
            obs[:] = np.nan
        return obs, reward, False, self._t >= EPISODE_STEPS, {}


class WrongDtypeEnv(gym.Env):
    observation_space = gym.spaces.Discrete(4)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0.5, {}

    def step(self, action):
        return 0.5, 1.0, False, False, {}


gym.register(id="NanBurst-v0", entry_point="bad_data_env:BadDataEnv", kwargs={"nan_at": 100})
gym.register(id="NanObs-v0", entry_point="bad_data_env:BadDataEnv", kwargs={"nan_from": 100})
gym.register(id="WrongShape-v0", entry_point="bad_data_env:BadDataEnv", kwargs={"wrong_shape": True})
gym.register(id="WrongDtype-v0", entry_point="bad_data_env:WrongDtypeEnv")
