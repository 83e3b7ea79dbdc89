"""Environments fastrl trains on, behind one registry (fastrl.envs.registry), which
your own join with register_env. They know nothing of the trainer."""
from fastrl.envs.registry import (
    EnvOption,
    EnvOptionError,
    EnvRegistrationError,
    EnvSpec,
    UnknownEnvError,
    get_spec,
    known_env_names,
    register_env,
)

__all__ = ["EnvOption", "EnvOptionError", "EnvRegistrationError", "EnvSpec", "UnknownEnvError", "get_spec",
           "known_env_names", "register_env"]
