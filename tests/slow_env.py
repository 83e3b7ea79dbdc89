"""A deliberately slow env for the bench's env-bound test: 2 ms of sleep per step,
so stepping dominates any model. Importing this module registers it, which lets
spawned children make it by the id "slow_env:SlowEnv-v0" (gymnasium imports the
module named before the colon), given tests/ on their PYTHONPATH."""
import time

import gymnasium as gym
import numpy as np

STEP_SECONDS = 0.002
EPISODE_STEPS = 100


class SlowEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        time.sleep(STEP_SECONDS)
        self._t += 1
        return self.observation_space.sample(), 1.0, False, self._t >= EPISODE_STEPS, {}


gym.register(id="SlowEnv-v0", entry_point="slow_env:SlowEnv")
