"""One registry for every env fastrl trains on.

    spec = get_spec("doom_battle")          # or any gymnasium id: "CartPole-v1"
    env = spec.make(seed=1, **options)      # one gymnasium.Env, never autoresetting
    frames = steps * spec.frameskip         # env frames per agent step
    agents = spec.make_match(seed=1, agents=2, **options)  # doom_duel, doom_deathmatch:
                                            # the learning agents of one game, each an env
                                            # that steps in two halves (envs/doom/match.py)

Names: fastrl's Doom scenarios first (doom_battle, doom_basic, ..., doom_custom;
see envs/doom/scenarios.py), then atari_<game> for every ALE game (atari_pong,
atari_breakout, ...; see envs/atari.py), then any id in gymnasium's registry. An unknown
name raises UnknownEnvError (a ValueError) with one sentence and a suggestion.

Options (`**options` of make; the trainer passes the same set to every env):
    doom_scenario=PATH.cfg   your own ViZDoom config: required by doom_custom;
                             with another doom_* name, its map and buttons replace
                             the scenario's while the name keeps its reward/objective.
    doom_measurements=True   Dict observation {"obs": image, "measurements": (5,)}.
    render_mode="rgb_array"  frames for videos (the only option gymnasium ids get).
    doom_episode_timeout=N   episode timeout in engine tics (default: the config's).
    doom_num_bots=N          bots in doom_deathmatch (default 6) or doom_duel (default 0).
    doom_hang_timeout=S      seconds an engine call may take before the engine is
                             declared hung and restarted (default 20).
    doom_engine_recycle_episodes=N  a fresh engine process after every N episodes
                             on one, for flat memory over days (default 0: never).
    atari_sticky_actions=True   repeat the last action with probability 0.25 per frame.
    atari_episodic_life=False   an episode is a full game, not one life (evaluation).
Other options are ignored, so a trainer can pass Doom options to CartPole.
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
    # Whether several threads may call make at once, and gain from it. True only
    # where making an env mostly waits with the GIL released (a ViZDoom engine
    # starting in its own process); an arbitrary gymnasium env is not known to be
    # thread-safe to make, and a cheap one would only pay for the threads.
    parallel_make: bool = False
    # Games that hold several learning agents (fastrl's deathmatch scenarios):
    # make_match(seed, agents, **options) -> one env per agent of a new game. spec.make
    # then makes one agent's game alone, for its spaces and costs.
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
    """gymnasium's "module:EnvId" form: importing the module registers EnvId. Every
    process that calls get_spec imports it, so an env registered in the user's own
    module also exists in the spawned workers."""
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
