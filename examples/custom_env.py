"""Train fastrl on an env of your own: a corridor the agent must walk to its far end.

    python examples/custom_env.py                          # a few seconds of training
    python examples/custom_env.py --env_option length=20   # any fastrl.train option works too
    python -m fastrl.enjoy --env corridor --modules examples/custom_env.py   # then watch it

The env is registered at the top level of this file, so that fastrl's worker processes,
which import it again, find it too; its options are set with --env_option key=value.
"""
import sys

import gymnasium
import numpy as np

import fastrl


class Corridor(gymnasium.Env):
    """`length` cells in a row. The agent starts at the left end and steps left or right
    (with probability `slip` the other way); reaching the right end gives reward 1 and ends
    the episode, which is cut off after 4 x length steps. It sees its cell, one-hot."""

    def __init__(self, length: int, slip: float):
        if length < 2 or not 0.0 <= slip < 1.0:
            raise ValueError(f"Corridor needs length >= 2 and slip in [0, 1), got length={length}, slip={slip}.")
        self.length, self.slip = length, slip
        self.observation_space = gymnasium.spaces.Box(0.0, 1.0, (length,), np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)  # 0: left, 1: right
        self.position = self.steps = 0

    def _observation(self) -> np.ndarray:
        seen = np.zeros(self.length, np.float32)
        seen[self.position] = 1.0
        return seen

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.steps = 0
        return self._observation(), {}

    def step(self, action):
        move = 1 if int(action) == 1 else -1
        if self.np_random.random() < self.slip:
            move = -move
        self.position = min(max(self.position + move, 0), self.length - 1)
        self.steps += 1
        arrived = self.position == self.length - 1
        return self._observation(), float(arrived), arrived, self.steps >= 4 * self.length, {}


fastrl.register_env("corridor", Corridor, options={
    "length": (8, "Cells in the corridor; the reward waits at the far end."),
    "slip": (0.1, "Chance that a step goes the other way."),
}, description="Walk to the far end of a corridor (examples/custom_env.py)")


if __name__ == "__main__":
    from fastrl.train import main

    # A tiny budget; options given after this file's name are added, and win.
    sys.exit(main(["--env", "corridor", "--env_option", "length=12", "--train_for_env_frames", "30000",
                   *sys.argv[1:]]))
