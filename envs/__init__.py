"""Environments fastrl trains on, behind one registry (fastrl.envs.registry).
They know nothing of the trainer."""
from fastrl.envs.registry import EnvSpec, UnknownEnvError, get_spec, known_env_names

__all__ = ["EnvSpec", "UnknownEnvError", "get_spec", "known_env_names"]
