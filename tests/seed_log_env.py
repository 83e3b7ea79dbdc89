"""An env that writes down the randomness it meets, for the seeding tests: every
observation is the same zeros, so a policy gives every env the same action
probabilities, and the actions an env receives differ from another's only by the
sampling noise of the process that drew them. Each instance appends one JSON line
per ended episode to $SEED_LOG_DIR/<pid>-<n>.jsonl: the seed its reset got and
the actions it was sent. Registered as "seed_log_env:SeedLogEnv-v0" (tests/ on the
children's PYTHONPATH, as for slow_env)."""
import itertools
import json
import os

import gymnasium as gym
import numpy as np

EPISODE_STEPS = 40
_instances = itertools.count()


class SeedLogEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(8)

    def __init__(self):
        self._path = os.path.join(os.environ["SEED_LOG_DIR"], f"{os.getpid()}-{next(_instances)}.jsonl")
        self._seed, self._actions = None, []

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._seed, self._actions = seed, []
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self._actions.append(int(action))
        ended = len(self._actions) >= EPISODE_STEPS
        if ended:
            with open(self._path, "a") as fh:
                fh.write(json.dumps({"seed": self._seed, "actions": self._actions}) + "\n")
        return np.zeros(4, np.float32), 0.0, False, ended, {}


gym.register(id="SeedLogEnv-v0", entry_point="seed_log_env:SeedLogEnv")
