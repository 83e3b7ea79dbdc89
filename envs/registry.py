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

Your own envs join with `register_env(name, make_fn, frameskip, options)` (see its
docstring); their declared options come from the trainer's --env_option key=value.
"""
from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import os
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping, NamedTuple

import gymnasium

from fastrl.registering import calling_module, file_of, import_users_module, one_line, ran_here, same_module


class UnknownEnvError(ValueError):
    """The env name is neither a fastrl env nor a registered gymnasium id."""


class EnvRegistrationError(ValueError):
    """register_env was given a name, maker or options it cannot take; the message says which."""


class EnvOptionError(ValueError):
    """An env option its env does not declare, or a value its declared type cannot take."""


class EnvOption(NamedTuple):
    """One option a registered env declares: its default (a bool, int, float or str, which
    also fixes the type its values are read as) and one line of help."""

    default: object
    help: str = ""

    def read(self, name: str, value):
        """`value` (a command line's string, or already of the default's type) as that type."""
        kind = type(self.default)
        if isinstance(value, kind) and not (kind is not bool and isinstance(value, bool)):
            return value
        text = str(value).strip()
        try:
            if kind is bool:
                lowered = text.lower()
                if lowered not in _BOOL_WORDS:
                    raise ValueError(text)
                return _BOOL_WORDS[lowered]
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                return float(value)
            return kind(text)
        except ValueError:
            raise EnvOptionError(f"{name}={value} is not {_TYPE_WORDS[kind]}, which {name} takes "
                                 f"(default {self.default!r}).") from None


_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_TYPE_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


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
    # The options a registered env declares ({name: EnvOption}), set with --env_option.
    options: Mapping[str, EnvOption] = field(default_factory=dict)
    # The module whose import registers the env (register_env's caller); "" for fastrl's own.
    origin: str = ""

    def read_options(self, given: Mapping) -> dict:
        """Every declared option's value: the defaults, with `given` ({name: value or its
        text}) over them. A name not declared raises EnvOptionError with the ones that are."""
        for name in given:
            if name not in self.options:
                raise EnvOptionError(_undeclared_message(self, name))
        return {name: option.read(name, given[name]) if name in given else option.default
                for name, option in self.options.items()}

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


def _seeded(env: gymnasium.Env, seed: int | None) -> gymnasium.Env:
    if seed is not None:
        # Seed now: the first reset() without a seed then continues this stream.
        env.reset(seed=seed)
        env.action_space.seed(seed)
        env.observation_space.seed(seed)
    return env


def _gymnasium_spec(env_id: str) -> EnvSpec:
    def make(seed: int | None = None, **options) -> gymnasium.Env:
        render_mode = options.get("render_mode")
        env = gymnasium.make(env_id, render_mode=render_mode) if render_mode else gymnasium.make(env_id)
        return _seeded(env, seed)

    gym_spec = gymnasium.registry[env_id]
    return EnvSpec(name=env_id, make=make, frameskip=1,
                   description=f"gymnasium {env_id} ({gym_spec.entry_point})")


def _module_spec(name: str) -> EnvSpec:
    """The "module:name" form: importing the module registers the env (with register_env, or
    gymnasium's register for an id) in every process that calls get_spec, so the user's own
    envs exist in spawned workers too."""
    module, env_id = name.split(":", 1)
    try:
        import_user_module(module)
    except ImportError as err:
        raise UnknownEnvError(f"Env {name!r}: {err}") from None
    if env_id in _REGISTERED:
        return replace(_REGISTERED[env_id], name=name)
    if env_id not in gymnasium.registry:
        raise UnknownEnvError(f"Env {name!r}: importing {module!r} did not register {env_id!r}; call "
                              f"fastrl.register_env({env_id!r}, make_fn) or gymnasium.register(id={env_id!r}, "
                              "entry_point=...) at the top level of that module.")
    return replace(_gymnasium_spec(env_id), name=name)


def import_user_module(reference: str) -> None:
    """Import one of the user's modules: a dotted name, or the path of a .py file, which runs as a
    module beside its folder (as `python FILE` would see its neighbours) unless that file already ran
    here (as the main script). Raises ImportError with one sentence saying what to do."""
    if not reference.endswith(".py"):
        import_users_module(reference)
        return
    path = os.path.realpath(reference)
    if ran_here(path):
        return
    if not os.path.isfile(path):
        raise ImportError(f"the file {reference} is gone; put it back or name its module instead.")
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(f"{_FILE_MODULE}{stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - the user's file failed on import, however it did
        del sys.modules[spec.name]
        raise ImportError(f"the file {reference} failed to import ({describe_error(err)}); fix it.") from None


# The name a user's .py file is imported under (import_user_module): other processes find it by its path.
_FILE_MODULE = "fastrl_user_"


def module_reference(module_name: str) -> str:
    """How another process imports the module now loaded as `module_name`: its name, or for a
    script run as the main module or a file --modules named, its path; "" where no file backs it
    (an interactive interpreter, a notebook)."""
    module = sys.modules.get(module_name)
    if module_name.startswith(_FILE_MODULE):
        return file_of(module)
    if module_name not in ("__main__", "__mp_main__"):
        return module_name
    spec = getattr(module, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", "__mp_main__"):  # python -m package.module
        return spec.name
    return file_of(module)


# Envs registered with register_env in this process, by name.
_REGISTERED: dict = {}
_ENV_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*\Z")
# Families whose presets and options go by name prefix (fastrl/presets.py, config.env_options).
_FAMILY_PREFIXES = ("doom_", "atari_")
# Arguments fastrl itself gives a maker that takes them, so no option may be named so.
_MAKER_ARGUMENTS = ("seed", "render_mode")


def register_env(name: str, make_fn: Callable[..., gymnasium.Env], frameskip: int = 1,
                 options: Mapping | None = None, description: str = "") -> EnvSpec:
    """Make `name` an env fastrl trains (`--env name`) and plays, and return its EnvSpec.

    make_fn(**options) returns one gymnasium.Env; it gets every declared option, and `seed` and
    `render_mode` where it takes parameters of those names (or **kwargs). fastrl seeds the env through
    reset(seed=...), as it does gymnasium ids. frameskip: the env frames one step counts for.
    options: {name: (default, one-line help)}, set with --env_option name=value; the default's
    type (bool, int, float or str) is the type values are read as.

    Register at the top level of a module or script: fastrl's worker processes and fastrl.enjoy
    import it to find the env. The same module registering a name again replaces it; a name that
    fastrl, gymnasium or another module has raises EnvRegistrationError.
    """
    origin = calling_module()
    _check_name(name, origin)
    if not callable(make_fn):
        raise EnvRegistrationError(f"register_env({name!r}, ...) needs a callable that makes the env, "
                                   f"not {type(make_fn).__name__}.")
    if isinstance(frameskip, bool) or not isinstance(frameskip, int) or frameskip < 1:
        raise EnvRegistrationError(f"register_env({name!r}, ...): frameskip={frameskip!r} must be a whole number "
                                   ">= 1, the env frames one step counts for.")
    declared = _declared_options(name, options or {})
    takes = _maker_arguments(make_fn)
    missing = [key for key in declared if takes is not None and key not in takes]
    if missing:
        raise EnvRegistrationError(f"register_env({name!r}, ...): make_fn takes no parameter {missing[0]!r}, which "
                                   "it declares as an option; add it to make_fn's parameters.")

    def make(seed: int | None = None, **given) -> gymnasium.Env:
        # Options of fastrl's families, and render_mode, are the trainer's to every env; the rest must be ours.
        own = {k: v for k, v in given.items() if k != "render_mode" and not k.startswith(_FAMILY_PREFIXES)}
        kwargs = spec.read_options(own)
        if takes is None or "seed" in takes:
            kwargs["seed"] = seed
        if (takes is None or "render_mode" in takes) and given.get("render_mode"):
            kwargs["render_mode"] = given["render_mode"]
        env = make_fn(**kwargs)
        if not isinstance(env, gymnasium.Env):
            raise TypeError(f"the make_fn of env {name!r} returned {type(env).__name__}, not a gymnasium.Env.")
        return _seeded(env, seed)

    maker = getattr(make_fn, "__qualname__", type(make_fn).__name__)
    spec = EnvSpec(name=name, make=make, frameskip=frameskip, options=declared, origin=origin,
                   description=description or f"registered by {origin or 'an unknown module'} ({maker})")
    _REGISTERED[name] = spec
    return spec


def registered_env_names() -> list:
    return sorted(_REGISTERED)


def _check_name(name, origin: str) -> None:
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        raise EnvRegistrationError(f"register_env: the name {name!r} must be letters, digits, '_', '.' or '-', "
                                   "like my_env or MyEnv-v0.")
    from fastrl.envs.doom.scenarios import SCENARIOS

    if name.startswith(_FAMILY_PREFIXES) or name in SCENARIOS:
        taken = "a fastrl Doom or Atari name: those prefixes belong to fastrl's own envs"
    elif name in gymnasium.registry:
        taken = "a gymnasium id"
    elif name in _REGISTERED and not same_module(_REGISTERED[name].origin, origin):
        taken = f"already registered by {_REGISTERED[name].origin}"
    else:
        return
    raise EnvRegistrationError(f"register_env: the env name {name!r} is taken ({taken}); choose another name.")


def _declared_options(env: str, options: Mapping) -> dict:
    declared = {}
    for key, value in options.items():
        where = f"register_env({env!r}, ...): option {key!r}"
        if not isinstance(key, str) or not key.isidentifier() or key in _MAKER_ARGUMENTS \
                or key.startswith(_FAMILY_PREFIXES):
            raise EnvRegistrationError(f"{where} must be a Python identifier other than seed, render_mode or a "
                                       "doom_/atari_ name, since make_fn receives it as a keyword.")
        if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], str)):
            raise EnvRegistrationError(f"{where} must be declared as (default, help), like (5, 'Grid side length.').")
        option = EnvOption(*value)
        if type(option.default) not in _TYPE_WORDS:
            raise EnvRegistrationError(f"{where} has the default {option.default!r}; use a bool, int, float or str, "
                                       "whose type its values are read as.")
        if "\n" in option.help:
            raise EnvRegistrationError(f"{where}: its help must be one line.")
        declared[key] = option
    return declared


def _maker_arguments(make_fn) -> set | None:
    """The keyword parameters make_fn takes; None where it takes any (**kwargs) or its
    signature cannot be read (then it gets seed and render_mode too, and must take them)."""
    try:
        parameters = inspect.signature(make_fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                     inspect.Parameter.KEYWORD_ONLY)}


def _undeclared_message(spec: EnvSpec, key: str) -> str:
    if not spec.options:
        return f"{spec.name} declares no options, so it takes no {key}=...; drop it."
    guess = difflib.get_close_matches(key, list(spec.options), n=1)
    hint = f" Did you mean {guess[0]}?" if guess else ""
    return f"{spec.name} has no option {key!r}; it declares {', '.join(spec.options)}.{hint}"


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
    """fastrl's names, then those registered with register_env, then gymnasium's ids."""
    return fastrl_env_names() + registered_env_names() + sorted(gymnasium.registry)


def get_spec(name: str) -> EnvSpec:
    from fastrl.envs.atari import PREFIX, atari_env_names
    from fastrl.envs.doom.scenarios import SCENARIOS

    if name in SCENARIOS:
        return _doom_spec(name)
    if name.startswith(PREFIX) and name in atari_env_names():
        return _atari_spec(name)
    if name in _REGISTERED:
        return _REGISTERED[name]
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
            "like atari_pong), an env registered with fastrl.register_env in this process, nor a gymnasium id; "
            f"for an env your module registers, pass module:{name}.")


def describe_error(err: BaseException) -> str:
    """An env's exception in one line: its type and its message's first line."""
    return one_line(err)
