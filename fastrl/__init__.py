"""fastrl: asynchronous APPO, as fast as one machine allows. docs/design.md maps
the subpackages and the rules they keep."""
import importlib.util
import os
import sys

# envs/ installs as fastrl.envs (setup.py's package_dir). A source checkout used without
# installing has no fastrl/envs, so the name resolves to the checkout's envs/; first on
# sys.meta_path, so another checkout's editable install cannot supply its envs instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
_CHECKOUT_ENVS = os.path.join(os.path.dirname(_HERE), "envs")


class _CheckoutEnvsFinder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "fastrl.envs":
            return None
        return importlib.util.spec_from_file_location(name, os.path.join(_CHECKOUT_ENVS, "__init__.py"),
                                                      submodule_search_locations=[_CHECKOUT_ENVS])


if not os.path.isdir(os.path.join(_HERE, "envs")) and os.path.isfile(os.path.join(_CHECKOUT_ENVS, "__init__.py")):
    sys.meta_path.insert(0, _CheckoutEnvsFinder)

# The Python API (docs/python-api.md), imported when first used so that `import fastrl` stays
# cheap: name -> the module that defines it. "train" is the module fastrl.train itself, which is
# callable (see fastrl/train.py).
_LAZY = {
    "Config": "fastrl.config",
    "ConfigError": "fastrl.config",
    "train": "fastrl.train",
    "TrainSummary": "fastrl.api",
    "TrainingError": "fastrl.api",
    "load_policy": "fastrl.api",
    "Policy": "fastrl.policy",
    "AgentLoadError": "fastrl.agent",
    "register_env": "fastrl.envs.registry",
    "register_model": "fastrl.algo.model_registry",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'fastrl' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    value = module if _LAZY[name] == f"{__name__}.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
