"""A task that needs nothing but sight: each observation is an image that is all
black or all white, and the step pays 1 when the action names its colour (0 for
black, 1 for white), else 0; the next colour is a coin flip. An agent that sees
scores 32 per episode, a blind one 16. Any pixel model that fails it is not
looking, whatever else it learns.

Registered as "react_env:ReactImage-v0" (tests/ on the children's PYTHONPATH,
as for slow_env)."""
import gymnasium as gym
import numpy as np

EPISODE_STEPS = 32
SIDE = 36  # the smallest square the conv encoder takes


class ReactImageEnv(gym.Env):
    observation_space = gym.spaces.Box(0, 255, (3, SIDE, SIDE), np.uint8)
    action_space = gym.spaces.Discrete(2)
    metadata = {"render_modes": ["rgb_array"]}  # what fastrl.enjoy makes every env with

    def __init__(self, reward=1.0, render_mode=None):
        self.reward, self.render_mode = reward, render_mode
        self._frames = [np.zeros((3, SIDE, SIDE), np.uint8), np.full((3, SIDE, SIDE), 255, np.uint8)]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t, self._colour = 0, int(self.np_random.integers(2))
        return self._frames[self._colour], {}

    def step(self, action):
        reward = self.reward * float(int(action) == self._colour)
        self._t += 1
        self._colour = int(self.np_random.integers(2))
        return self._frames[self._colour], reward, False, self._t >= EPISODE_STEPS, {}

    def render(self):
        return self._frames[self._colour].transpose(1, 2, 0)  # [H, W, C], as a video frame


gym.register(id="ReactImage-v0", entry_point="react_env:ReactImageEnv")
