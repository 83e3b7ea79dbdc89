"""One registry for every env fastrl trains on.

    spec = get_spec("doom_battle")          # or any gymnasium id: "CartPole-v1"
    env = spec.make(seed=1, **options)      # one gymnasium.Env, never autoresetting
    agents = spec.make_match(seed=1, agents=2, **options)  # deathmatch: one env per agent

Names resolve as fastrl's Doom scenarios, then atari_<game>, then gymnasium ids
("module:EnvId" imports the module first); an unknown name raises UnknownEnvError
with a suggestion. The trainer passes every env the same options and each ignores
those not its own:
    doom_scenario=PATH.cfg   a ViZDoom config (required by doom_custom; with another
                             doom_* name, the name keeps its reward and objective)
    doom_measurements, doom_episode_timeout, doom_num_bots, doom_hang_timeout,
    doom_engine_recycle_episodes (default scenarios.ENGINE_RECYCLE_EPISODES; 0: never)
    atari_sticky_actions, atari_episodic_life (see envs/atari.py)
    render_mode="rgb_array"  frames for videos (the only option gymnasium ids get)
"""
from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field, replace
from typing import Callable

import gymnasium


class UnknownEnvError(ValueError):
    """The env name is neither a fastrl env nor a registered gymnasium id."""


@dataclass(frozen=True)
class EnvSpec:
    name: str
    make: Callable[..., gymnasium.Env] = field(repr=False)  # make(seed: int | None = None, **options)
    frameskip: int = 1  # env frames per agent step
    description: str = ""
    # Whether threads may make envs at once and gain from it: only where making one
    # mostly waits with the GIL released (a ViZDoom engine starting).
    parallel_make: bool = False
    # Games holding several learning agents: make_match(seed, agents, **options) gives
    # one env per agent of a new game; spec.make makes one agent's game alone.
    make_match: Callable[..., list] | None = field(default=None, repr=False)

    def spaces(self, **options) -> tuple:
        """(observation_space, action_space) of one env made with `options`, then closed."""
        env = self.make(seed=0, **options)
        try:
            return env.observation_space, env.action_space
        finally:
            env.close()


def _doom_spec(name: str) -> EnvSpec:
    from fastrl.envs.doom.scenarios import SCENARIOS

    scenario = SCENARIOS[name]

    def make(seed: int | None = None, **options) -> gymnasium.Env:
        from fastrl.envs.doom.make import make_doom_env

        return make_doom_env(name, seed, **options)

    def make_match(seed: int | None = None, agents: int | None = None, **options) -> list:
        from fastrl.envs.doom.make import make_doom_match

        return make_doom_match(name, seed, agents, **options)

    return EnvSpec(name=name, make=make, frameskip=4, description=scenario.description, parallel_make=True,
                   make_match=make_match if scenario.deathmatch else None)


def _gymnasium_spec(env_id: str) -> EnvSpec:
    def make(seed: int | None = None, **options) -> gymnasium.Env:
        render_mode = options.get("render_mode")
        env = gymnasium.make(env_id, render_mode=render_mode) if render_mode else gymnasium.make(env_id)
        if seed is not None:
            # Seed now: the first reset() without a seed then continues this stream.
            env.reset(seed=seed)
            env.action_space.seed(seed)
            env.observation_space.seed(seed)
        return env

    gym_spec = gymnasium.registry[env_id]
    return EnvSpec(name=env_id, make=make, frameskip=1,
                   description=f"gymnasium {env_id} ({gym_spec.entry_point})")


def _module_spec(name: str) -> EnvSpec:
    """gymnasium's "module:EnvId" form: importing the module registers EnvId, in every
    process that calls get_spec, so the user's own envs exist in spawned workers too."""
    module, env_id = name.split(":", 1)
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if not f"{module}.".startswith(f"{err.name}."):  # the module is there, but something it imports is not
            raise UnknownEnvError(f"Env {name!r}: module {module!r} failed to import ({describe_error(err)}); "
                                  "install what it needs.") from None
        raise UnknownEnvError(f"Env {name!r}: module {module!r} cannot be imported ({err}); "
                              "put its folder on PYTHONPATH.") from None
    except Exception as err:  # noqa: BLE001 - the user's module failed on import, however it did
        raise UnknownEnvError(f"Env {name!r}: module {module!r} failed to import ({describe_error(err)}); "
                              "fix that module.") from None
    if env_id not in gymnasium.registry:
        raise UnknownEnvError(f"Env {name!r}: importing {module!r} did not register {env_id!r}; "
                              f"call gymnasium.register(id={env_id!r}, entry_point=...) in that module.")
    return replace(_gymnasium_spec(env_id), name=name)


def _atari_spec(name: str) -> EnvSpec:
    from fastrl.envs import atari

    def make(seed: int | None = None, **options) -> gymnasium.Env:
        return atari.make_atari_env(name, seed, **options)

    return EnvSpec(name=name, make=make, frameskip=atari.FRAMESKIP, description=atari.describe(name))


def fastrl_env_names() -> list:
    from fastrl.envs.atari import atari_env_names
    from fastrl.envs.doom.scenarios import SCENARIOS

    return list(SCENARIOS) + list(atari_env_names())


def known_env_names() -> list:
    """fastrl's names, then gymnasium's registered ids."""
    return fastrl_env_names() + sorted(gymnasium.registry)


def get_spec(name: str) -> EnvSpec:
    from fastrl.envs.atari import PREFIX, atari_env_names
    from fastrl.envs.doom.scenarios import SCENARIOS

    if name in SCENARIOS:
        return _doom_spec(name)
    if name.startswith(PREFIX) and name in atari_env_names():
        return _atari_spec(name)
    if ":" in name:
        return _module_spec(name)
    if name in gymnasium.registry:
        return _gymnasium_spec(name)
    raise UnknownEnvError(_unknown_message(name))


def _unknown_message(name: str) -> str:
    names = known_env_names()
    guess = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    if not guess:  # doom-basic, cartpole-v1, DOOM_BATTLE
        folded = {n.lower().replace("-", "_"): n for n in names}
        guess = difflib.get_close_matches(name.lower().replace("-", "_"), list(folded), n=1, cutoff=0.5)
        guess = [folded[g] for g in guess]
    if guess:
        return f"Unknown env {name!r}: did you mean {guess[0]!r}?"
    from fastrl.envs.doom.scenarios import SCENARIOS

    return (f"Unknown env {name!r}: it is neither a fastrl env ({', '.join(SCENARIOS)}, atari_<game> "
            "like atari_pong) nor a registered gymnasium id.")


def describe_error(err: BaseException) -> str:
    """An env's exception in one line: its type and its message's first line."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
