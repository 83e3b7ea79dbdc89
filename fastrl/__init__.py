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
