"""make_doom_env and make_doom_match: the registry's entry points for doom_* names;
they turn the trainer's options into DoomEnv arguments."""
from __future__ import annotations

import difflib

from fastrl.envs.doom.scenarios import get_scenario

# option -> (DoomEnv keyword, converter); a value of None means "not given".
DOOM_OPTIONS = {
    "doom_scenario": ("config_path", str),
    "doom_measurements": ("measurements", bool),
    "doom_hud": ("hud", bool),
    "doom_episode_timeout": ("episode_timeout", int),
    "doom_num_bots": ("num_bots", int),
    "doom_hang_timeout": ("hang_timeout", float),
    "doom_engine_recycle_episodes": ("engine_recycle_episodes", int),
    "render_mode": ("render_mode", str),
}


def make_doom_env(name: str, seed: int | None = None, **options):
    """A DoomEnv for fastrl name `name`. Options other than DOOM_OPTIONS are
    ignored (the trainer passes one set to every env), except misspelt doom_* ones."""
    kwargs = _doom_kwargs(options)
    try:
        from fastrl.envs.doom.doom_env import DoomEnv
    except ImportError as err:
        raise _missing(name, err) from err
    return DoomEnv(get_scenario(name), seed, **kwargs)


def make_doom_match(name: str, seed: int | None = None, agents: int | None = None, **options) -> list:
    """The agents of one DoomMatch of deathmatch scenario `name` (envs/doom/match.py):
    one env per learning agent of the game, in seat order; options as make_doom_env's."""
    kwargs = _doom_kwargs(options)
    try:
        from fastrl.envs.doom.match import DoomMatch
    except ImportError as err:
        raise _missing(name, err) from err
    return DoomMatch(name, seed, agents, **kwargs).agents


def _missing(name: str, err: ImportError) -> ImportError:
    return ImportError(f"{name} needs ViZDoom and OpenCV, which are not installed ({err}); "
                       "install them with: pip install 'fastrl[doom]'")


def _doom_kwargs(options: dict) -> dict:
    """DoomEnv's keyword arguments from the trainer's env options."""
    kwargs = {}
    for key, value in options.items():
        if key in DOOM_OPTIONS:
            if value is None or (key == "doom_scenario" and value == ""):
                continue
            kw, convert = DOOM_OPTIONS[key]
            kwargs[kw] = convert(value)
        elif key.startswith("doom_"):
            close = difflib.get_close_matches(key, list(DOOM_OPTIONS), n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; known: {', '.join(DOOM_OPTIONS)}"
            raise ValueError(f"unknown Doom option {key}{hint}")
    return kwargs
