"""An env whose return rises, then falls to nothing, whatever the policy does: the
shape of a run that unlearns, for the drift warning's end-to-end test. Each episode
is one step, paying t / RISE_S at t seconds after the instance's first step, 1 from
RISE_S on, and 0 from FALL_AT_S on: by the clock, so a fast machine's many episodes
do not climb before the run's first status line. Registered as "fading_env:Fading-v0"
(tests/ on the children's PYTHONPATH)."""
import time

import gymnasium as gym
import numpy as np

RISE_S = 3.0
FALL_AT_S = 4.5


class FadingEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self):
        self._first_step_at = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(4, np.float32), {}

    def step(self, action):
        now = time.monotonic()
        self._first_step_at = self._first_step_at or now
        since = now - self._first_step_at
        reward = 0.0 if since >= FALL_AT_S else min(since / RISE_S, 1.0)
        return np.zeros(4, np.float32), reward, True, False, {}


gym.register(id="Fading-v0", entry_point="fading_env:FadingEnv")
