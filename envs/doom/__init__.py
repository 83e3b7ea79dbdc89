"""ViZDoom environments: DoomEnv and the scenario table. Importing this package does
not import vizdoom, so the registry can name Doom envs where the extra is missing."""
from fastrl.envs.doom.scenarios import ENGINE_RECYCLE_EPISODES, SCENARIOS, DoomScenario, get_scenario

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
