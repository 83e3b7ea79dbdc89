"""ViZDoom environments: DoomEnv and the scenario table.

Importing this package does not import vizdoom; DoomEnv and make_doom_env do,
on first use, so the registry can name Doom envs where the Doom extra is not
installed and say how to install it.
"""
from fastrl.envs.doom.scenarios import SCENARIOS, DoomScenario, get_scenario

# Episodes a ViZDoom engine plays before DoomEnv replaces it with a fresh one (the
# trainer's --doom_engine_recycle_episodes defaults to it too).
# Measured with benchmarks/doom_engine_memory.py (AMD EPYC, 2 cores): an engine grows
# 1.6-1.9 MB per million frames it renders, and a replacement costs 0.12-0.13 s. On the
# shortest episodes seen (doom_basic under random actions, 13 ms of bare stepping each)
# 1000 episodes keep that cost at 1% of the engine's own stepping time, far less of a
# trainer's, where each frame also waits for the model; and an engine then never grows
# by more than ~8 MB (1000 of doom_battle's longest episodes, 4,200 frames each).
ENGINE_RECYCLE_EPISODES = 1000

__all__ = ["ENGINE_RECYCLE_EPISODES", "SCENARIOS", "DoomScenario", "get_scenario", "DoomEnv", "make_doom_env",
           "cleanup_stale_doom_shm"]


def __getattr__(name):
    if name == "DoomEnv":
        from fastrl.envs.doom.doom_env import DoomEnv

        return DoomEnv
    if name == "make_doom_env":
        from fastrl.envs.doom.make import make_doom_env

        return make_doom_env
    if name == "cleanup_stale_doom_shm":
        from fastrl.envs.doom.engine import cleanup_stale_doom_shm

        return cleanup_stale_doom_shm
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
