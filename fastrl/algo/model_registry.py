"""Models users bring: `register_model(name, builder)` and `--model name` or `--model module:factory`.

A builder is called as builder(obs_space, spec) with the observation space and the run's
ModelSpec (algo/model.py) and returns a torch.nn.Module, the encoder: it takes the observation
as its space is shaped (a tensor [N, ...], or a dict of them for a Dict space) and returns
features [N, F]. fastrl keeps the rest of its network around it (build_model checks the fit).
This module imports no torch, so the command line can check a --model before any process starts.
"""
from __future__ import annotations

import re
from typing import Callable

from fastrl.registering import calling_module, import_users_module, same_module


class ModelError(ValueError):
    """A --model fastrl cannot find, or a model that does not fit; the message names it."""


# Builders registered with register_model in this process, by name, with the module that registered each.
_MODELS: dict = {}
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*\Z")


def register_model(name: str, builder: Callable) -> None:
    """Make `name` a --model: builder(obs_space, spec) returns the encoder, an nn.Module whose
    forward maps a batch of observations to features [N, F] (declare F as `out_dim`, or fastrl
    measures it). Register at the top level of a module or script: fastrl's worker processes and
    fastrl.enjoy import it to find the model. The same module registering a name again replaces
    it; a name another module registered raises ModelError."""
    origin = calling_module()
    if not isinstance(name, str) or not _MODEL_NAME.match(name):
        raise ModelError(f"register_model: the name {name!r} must be letters, digits, '_', '.' or '-', like tiny_cnn.")
    if not callable(builder):
        raise ModelError(f"register_model({name!r}, ...) needs a callable that builds the encoder, "
                         f"not {type(builder).__name__}.")
    if name in _MODELS and not same_module(_MODELS[name][1], origin):
        raise ModelError(f"register_model: the model name {name!r} is taken (already registered by "
                         f"{_MODELS[name][1]}); choose another name.")
    _MODELS[name] = (builder, origin)


def registered_model_names() -> list:
    return sorted(_MODELS)


def model_builder(name: str) -> Callable:
    """The builder --model `name` names: a registered name, or module:factory, the module imported
    here (a factory it registered by that name, else its attribute)."""
    if name in _MODELS:
        return _MODELS[name][0]
    if ":" not in name:
        known = ", ".join(registered_model_names()) or "none"
        raise ModelError(f"Unknown model {name!r} (registered in this process: {known}); register it with "
                         f"fastrl.register_model, or pass module:{name} so that its module is imported.")
    module_name, factory = name.split(":", 1)
    try:
        module = import_users_module(module_name)
    except ImportError as err:
        raise ModelError(f"Model {name!r}: {err}") from None
    if factory in _MODELS and same_module(_MODELS[factory][1], module_name):
        return _MODELS[factory][0]
    builder = getattr(module, factory, None)
    if not callable(builder):
        raise ModelError(f"Model {name!r}: module {module_name!r} has no function {factory!r}; define "
                         f"{factory}(obs_space, spec) there, returning the encoder.")
    return builder


def model_origin(name: str) -> str:
    """The module that registered model `name` in this process; "" for fastrl's own and module:factory,
    whose name says where it is."""
    return _MODELS[name][1] if name in _MODELS else ""
