"""Envs that break on purpose, for the reliability tests. Importing this module
registers them, so spawned workers make them by the id "faulty_env:<Id>"
(gymnasium imports the module named before the colon), given tests/ on their
PYTHONPATH.

Each counts steps per instance, so a re-created env starts its count again:
    FlakyStep-v0   raises inside step() at its 40th step, then would again at the
                   40th step of its replacement; training must go on.
    BrokenStep-v0  raises inside every step(); the run must stop naming it.
    NanOnce-v0     one NaN reward, at its 100th step; the update is skipped.
    NanReward-v0   NaN rewards from its 300th step on; the run must stop.
    SelfHealing-v0 at its 3rd step, restarts itself as a ViZDoom env does when its
                   engine dies: the episode ends truncated with info["env_restarts"].
    DiesHoldingALock-v0  at its 20th step in a rollout worker, once in the run (the
                   first to create the file FAULTY_ENV_ONCE names), takes the lock of
                   the run's episode queue, as a put does, and SIGKILLs its worker.
Episodes are 50 steps (truncated), with random observations and reward 1.
"""
import ctypes
import gc
import multiprocessing
import os
import signal

import gymnasium as gym
import numpy as np

EPISODE_STEPS = 50


class EnvBroke(RuntimeError):
    pass


class FaultyEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, raise_at=(), raise_from=None, nan_at=(), nan_from=None, heal_at=()):
        self.raise_at, self.raise_from = set(raise_at), raise_from
        self.heal_at = set(heal_at)
        self.nan_at, self.nan_from = set(nan_at), nan_from
        self.steps = 0  # over this instance's life, across episodes
        self._t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return self.np_random.uniform(-1, 1, 4).astype(np.float32), {}

    def step(self, action):
        self.steps += 1
        self._t += 1
        if self.steps in self.raise_at or (self.raise_from is not None and self.steps >= self.raise_from):
            raise EnvBroke(f"the faulty env broke at its step {self.steps}")
        nan = self.steps in self.nan_at or (self.nan_from is not None and self.steps >= self.nan_from)
        obs = self.np_random.uniform(-1, 1, 4).astype(np.float32)
        if self.steps in self.heal_at:
            return obs, 0.0, False, True, {"env_restarts": 1}
        return obs, float("nan") if nan else 1.0, False, self._t >= EPISODE_STEPS, {}


def _first_in_the_run() -> bool:
    try:
        os.close(os.open(os.environ["FAULTY_ENV_ONCE"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except (KeyError, FileExistsError):
        return False


def _die_holding_the_episode_queue_lock() -> None:
    from fastrl.plumbing.context import SharedContext
    from fastrl.plumbing.queue_locks import queue_header

    ctx = next(o for o in gc.get_objects() if isinstance(o, SharedContext))
    ctypes.CDLL(None).pthread_mutex_lock(ctypes.byref(queue_header(ctx.episode_queue).mutex))
    os.kill(os.getpid(), signal.SIGKILL)


class LockHolderEnv(FaultyEnv):
    def step(self, action):
        if (self.steps == 19 and multiprocessing.current_process().name.startswith("rollout-worker")
                and _first_in_the_run()):
            _die_holding_the_episode_queue_lock()
        return super().step(action)


gym.register(id="FlakyStep-v0", entry_point="faulty_env:FaultyEnv", kwargs={"raise_at": (40,)})
gym.register(id="BrokenStep-v0", entry_point="faulty_env:FaultyEnv", kwargs={"raise_from": 1})
gym.register(id="NanOnce-v0", entry_point="faulty_env:FaultyEnv", kwargs={"nan_at": (100,)})
gym.register(id="NanReward-v0", entry_point="faulty_env:FaultyEnv", kwargs={"nan_from": 300})
gym.register(id="SelfHealing-v0", entry_point="faulty_env:FaultyEnv", kwargs={"heal_at": (3,)})
gym.register(id="DiesHoldingALock-v0", entry_point="faulty_env:LockHolderEnv")
