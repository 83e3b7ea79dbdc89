"""A trained agent's files, read from an experiment folder (a checkpoint) or from an
export folder (`python -m fastrl.export`: safetensors weights, config.json and
export.json), as one TrainedAgent: the Config, the env's spaces and the weights.

An export records its env's spaces as JSON, so it loads where the env is not
installed; an experiment's spaces come from making its env once.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import NamedTuple

import gymnasium as gym
import numpy as np

from fastrl.config import Config, ConfigError, config_from_saved, env_failure, env_options, module_list
from fastrl.learning.checkpoint import (
    BEST_NAME,
    CheckpointError,
    RefusedCheckpointError,
    UnsafeTorchError,
    checkpoint_dir,
    load_checkpoint,
    load_latest_checkpoint,
)
from fastrl.registering import ran_here

EXPORT_FORMAT = "fastrl-export/1"
EXPORT_INFO = "export.json"
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class AgentLoadError(Exception):
    """A folder or name that holds no loadable agent; the message says what to give instead."""


class Named(NamedTuple):
    """What the user named on this command line (or to load_policy). A saved config's own code
    (--modules) and files (--doom_scenario) are followed only where named here, so that an
    experiment or export handed over runs nothing its config alone asks for."""

    modules: str = ""
    doom_scenario: str = ""


NOTHING_NAMED = Named()


def _same_reference(a: str, b: str) -> bool:
    return a == b or (a.endswith(".py") and b.endswith(".py") and os.path.realpath(a) == os.path.realpath(b))


def _already_imported(reference: str) -> bool:
    """Whether this process already ran `reference` (a module name or a .py path): importing it
    again runs no code the user did not."""
    return ran_here(reference) if reference.endswith(".py") else reference in sys.modules


def _module_of(reference) -> list:
    """The module a "module:name" env or model imports, as a one-item list; [] for a plain name."""
    return [str(reference).rsplit(":", 1)[0]] if reference and ":" in str(reference) else []


def add_naming_options(parser) -> None:
    """--modules and --doom_scenario, for the commands that load a saved agent (enjoy, export)."""
    parser.add_argument("--modules", default="",
                        help="Modules or .py files registering the agent's env or model: a saved config's are "
                             "imported only when named here.")
    parser.add_argument("--doom_scenario", default="", metavar="PATH.cfg",
                        help="The ViZDoom scenario the agent was trained on: a saved config's is opened only when "
                             "named here.")


def naming(modules: str, env: str = "") -> Named:
    """What a command names: its --modules, and the module of an --env given as module:name."""
    return Named(",".join([*module_list(modules), *_module_of(env)]))


def followed(saved: dict, named: Named, where: str) -> dict:
    """`saved` (a config.json) once every module and file it names is named by the user too (or
    its module already ran here); AgentLoadError naming what to pass otherwise."""
    modules = [*module_list(saved.get("modules")), *_module_of(saved.get("env")), *_module_of(saved.get("model"))]
    given = module_list(named.modules)
    unnamed = [m for m in dict.fromkeys(modules)
               if not any(_same_reference(m, g) for g in given) and not _already_imported(m)]
    if unnamed:
        raise AgentLoadError(f"{where} was trained with code of its own ({', '.join(unnamed)}: what registered its env "
                             "or model), which fastrl runs only when you name it; if you trust it, pass --modules "
                             f"{','.join(unnamed)} (modules= to fastrl.load_policy).")
    scenario = str(saved.get("doom_scenario") or "")
    if scenario and not _same_reference(scenario, named.doom_scenario):
        raise AgentLoadError(f"{where} plays the ViZDoom scenario {scenario} its config names, which fastrl opens only "
                             f"when you name it; if you trust it, pass --doom_scenario {scenario} (doom_scenario= to "
                             "fastrl.load_policy).")
    return saved


class TrainedAgent(NamedTuple):
    """What a policy is rebuilt from. info: env_frames, policy_version and where the
    weights came from (source), as far as the files tell."""

    cfg: Config
    observation_space: gym.Space
    action_space: gym.Space
    weights: dict  # the model's state_dict, CPU tensors
    info: dict


def is_export(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, EXPORT_INFO))


def experiment_folder(source: str, train_dir: str) -> str:
    """The experiment folder `source` names: a folder holding config.json, else an
    experiment name under `train_dir`."""
    if os.path.isfile(os.path.join(source, CONFIG_FILE)):
        return source
    return os.path.join(train_dir, source)


def load_agent(source: str, train_dir: str = "train_dir", checkpoint: str = "latest", policy: int = 0,
               named: Named = NOTHING_NAMED) -> TrainedAgent:
    """The agent in an export folder, an experiment folder, or the experiment named
    `source` under `train_dir` (its `checkpoint`: latest, best or a path; `policy` of several)."""
    source = os.fspath(source)
    if is_export(source):
        return read_export(source, named)
    folder = experiment_folder(source, train_dir)
    if os.path.isdir(source) and not os.path.isfile(os.path.join(folder, CONFIG_FILE)):
        raise AgentLoadError(f"{source} is neither an export folder (it has no {EXPORT_INFO}) nor an experiment "
                             f"folder (it has no {CONFIG_FILE}); give the folder python -m fastrl.export wrote, or "
                             "an experiment's folder or name.")
    return read_experiment(folder, checkpoint, policy, named)


def load_experiment_config(experiment_dir: str, named: Named = NOTHING_NAMED) -> Config:
    """The Config an experiment was trained with, from its config.json."""
    path = os.path.join(experiment_dir, "config.json")
    if not os.path.isfile(path):
        raise AgentLoadError(f"No experiment at {experiment_dir} (it has no config.json); "
                             "check --experiment and --train_dir, or train it first with python -m fastrl.train.")
    try:
        with open(path) as fh:
            saved = json.load(fh)
    except (OSError, ValueError) as err:  # ValueError: not JSON, or not even text
        raise AgentLoadError(f"{path} cannot be read as the JSON fastrl writes ({err}); "
                             "restore it, or train the experiment again.") from None
    if not isinstance(saved, dict):
        raise AgentLoadError(f"{path} holds a JSON {type(saved).__name__}, not the options fastrl writes; "
                             "restore it, or train the experiment again.")
    try:
        return config_from_saved(followed(saved, named, f"Experiment {experiment_dir}"))
    except ConfigError as err:  # the modules that registered its env or model (--modules) are not here
        raise AgentLoadError(f"Experiment {experiment_dir} was trained with an env or model of its own, and "
                             f"{err}") from None


def select_checkpoint(cfg: Config, which: str, policy: int = 0) -> tuple:
    """(state, path) of policy `policy`'s checkpoint: latest, best or a path."""
    if not 0 <= policy < cfg.num_policies:
        raise AgentLoadError(f"--policy {policy} does not exist: experiment {cfg.experiment_dir} trained "
                             f"{cfg.num_policies} polic{'y' if cfg.num_policies == 1 else 'ies'}; pass 0 to "
                             f"{cfg.num_policies - 1}.")
    ckpt_dir = checkpoint_dir(cfg, policy)
    if which == "latest":
        try:
            state, path = load_latest_checkpoint(ckpt_dir)
        except UnsafeTorchError as err:
            raise AgentLoadError(str(err)) from None
        except RefusedCheckpointError as err:
            raise AgentLoadError(f"{err}; fastrl writes no such file, so delete it or pass --checkpoint PATH.") \
                from None
        except CheckpointError as err:  # every checkpoint is damaged
            raise AgentLoadError(f"{err}; pass --checkpoint best or the path of a good checkpoint.") from None
        if state is None:
            raise AgentLoadError(f"Experiment {cfg.experiment_dir} has no usable checkpoint in {ckpt_dir}; "
                                 "train it longer (one is written at exit) or pass --checkpoint PATH.")
        return state, path
    path = os.path.join(ckpt_dir, BEST_NAME) if which == "best" else which
    if which == "best" and not os.path.isfile(path):
        raise AgentLoadError(f"Experiment {cfg.experiment_dir} has no best checkpoint ({path}); it is written by "
                             "evaluation during training (--eval_every_frames), or use --checkpoint latest.")
    try:
        return load_checkpoint(path), path
    except UnsafeTorchError as err:
        raise AgentLoadError(str(err)) from None
    except CheckpointError as err:
        raise AgentLoadError(f"{err}; pass --checkpoint latest, best or the path of another checkpoint.") from None


def read_experiment(folder: str, checkpoint: str = "latest", policy: int = 0,
                    named: Named = NOTHING_NAMED) -> TrainedAgent:
    """An experiment's checkpoint as a TrainedAgent; its env is made once for the spaces."""
    from fastrl.envs.registry import UnknownEnvError, get_spec

    cfg = _relocated(load_experiment_config(folder, named), folder)
    state, path = select_checkpoint(cfg, checkpoint, policy)
    try:
        env = get_spec(cfg.env).make(seed=cfg.seed, **env_options(cfg))
    except UnknownEnvError as err:
        raise AgentLoadError(str(err)) from None
    except Exception as err:  # noqa: BLE001 - the env's own failure, whatever it is (see env_failure)
        raise AgentLoadError(env_failure(cfg.env, err)) from None
    try:
        spaces = env.observation_space, env.action_space
    finally:
        env.close()
    if "model" not in state:
        raise AgentLoadError(f"The checkpoint {path} holds no model weights; pass another checkpoint.")
    info = {"env_frames": int(state.get("env_frames", 0)), "policy_version": state.get("version"), "source": path,
            "best_score": state.get("best_score")}
    return TrainedAgent(cfg, *spaces, dict(state["model"]), info)


def _relocated(cfg: Config, folder: str) -> Config:
    """cfg pointing at `folder`, wherever the run saved it from (the folder may have moved)."""
    parent, name = os.path.split(os.path.normpath(os.path.abspath(folder)))
    return dataclasses.replace(cfg, train_dir=parent, experiment=name)


def read_export_info(folder: str) -> dict:
    """export.json of an export folder, checked to be one this version reads."""
    path = os.path.join(folder, EXPORT_INFO)
    try:
        with open(path) as fh:
            info = json.load(fh)
    except OSError as err:
        raise AgentLoadError(f"{path} cannot be read ({err.strerror}); export the agent again.") from None
    except ValueError as err:
        raise AgentLoadError(f"{path} is not JSON ({err}); export the agent again.") from None
    if not isinstance(info, dict) or info.get("format") != EXPORT_FORMAT:
        found = info.get("format") if isinstance(info, dict) else type(info).__name__
        raise AgentLoadError(f"{path} is not a {EXPORT_FORMAT} export (its format is {found!r}); export the agent "
                             "again with this version of fastrl.")
    return info


def read_export(folder: str, named: Named = NOTHING_NAMED) -> TrainedAgent:
    """An export folder as a TrainedAgent: no pickle is read, only JSON and safetensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    info = read_export_info(folder)
    missing = [name for name in (WEIGHTS_FILE, CONFIG_FILE) if not os.path.isfile(os.path.join(folder, name))]
    if missing:
        raise AgentLoadError(f"The export folder {folder} lacks {' and '.join(missing)}; export the agent again.")
    try:
        with open(os.path.join(folder, CONFIG_FILE)) as fh:
            saved = json.load(fh)
        if not isinstance(saved, dict):
            raise ValueError(f"it holds a JSON {type(saved).__name__}")
        cfg = config_from_saved(followed(saved, named, f"The agent in {folder}"))
        spaces = space_from_json(info["observation_space"]), space_from_json(info["action_space"])
    except ConfigError as err:  # the modules that registered its env or model (--modules) are not here
        raise AgentLoadError(f"The agent in {folder} was trained with an env or model of its own, and {err}") \
            from None
    except (OSError, ValueError, TypeError, KeyError) as err:
        raise AgentLoadError(f"The export folder {folder} has a damaged {CONFIG_FILE} or {EXPORT_INFO} ({err}); "
                             "export the agent again.") from None
    try:
        weights = load_file(os.path.join(folder, WEIGHTS_FILE), device="cpu")
    except (SafetensorError, OSError) as err:
        raise AgentLoadError(f"{os.path.join(folder, WEIGHTS_FILE)} is not a readable safetensors file ({err}); "
                             "export the agent again.") from None
    details = {k: info.get(k) for k in ("env_frames", "policy_version", "best_score")}
    return TrainedAgent(cfg, *spaces, weights, {**details, "source": os.path.join(folder, WEIGHTS_FILE)})


def space_to_json(space: gym.Space) -> dict:
    """A space fastrl trains on (Box, Discrete, MultiDiscrete, MultiBinary, and Dict or Tuple of
    them) as JSON; a Box's bounds as one number where every element shares it."""
    if isinstance(space, gym.spaces.Box):
        return {"type": "Box", "shape": list(space.shape), "dtype": str(space.dtype),
                "low": _bound(space.low), "high": _bound(space.high)}
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "start": space.start.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):  # an action mask may come as one
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {key: space_to_json(sub) for key, sub in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_json(sub) for sub in space.spaces]}
    raise ValueError(f"the space {space} has no JSON form in fastrl's exports")


def _bound(values: np.ndarray):
    """A Box bound: one number if uniform (inf as a string, which JSON lacks), else nested lists."""
    flat = np.unique(values)
    if flat.size == 1:
        return _number(flat[0])
    return [_bound(row) if row.ndim else _number(row) for row in values]


def _number(value):
    value = value.item()
    return str(value) if isinstance(value, float) and not np.isfinite(value) else value


def space_from_json(data: dict) -> gym.Space:
    """The space space_to_json wrote."""
    kind = data["type"]
    if kind == "Box":
        shape = tuple(data["shape"])
        dtype = np.dtype(data["dtype"])
        low, high = (np.broadcast_to(np.asarray(data[k], dtype=np.float64), shape).astype(dtype)
                     for k in ("low", "high"))
        return gym.spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
    if kind == "Discrete":
        return gym.spaces.Discrete(data["n"], start=data["start"])
    if kind == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(np.asarray(data["nvec"]), start=np.asarray(data["start"]))
    if kind == "MultiBinary":
        return gym.spaces.MultiBinary(data["n"])
    if kind == "Dict":
        return gym.spaces.Dict({key: space_from_json(sub) for key, sub in data["spaces"].items()})
    if kind == "Tuple":
        return gym.spaces.Tuple([space_from_json(sub) for sub in data["spaces"]])
    raise ValueError(f"unknown space type {kind!r}")
