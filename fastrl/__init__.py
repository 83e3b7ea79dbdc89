"""fastrl: asynchronous APPO, as fast as one machine allows. docs/design.md maps
the subpackages and the rules they keep."""
import importlib.util
import os
import sys

# The envs live in the repository's top-level envs/ folder and install as fastrl.envs
# (setup.py's package_dir), so that installing fastrl adds no generic top-level name.
# A source tree used without installing it (on PYTHONPATH, or under an editable
# install made before that mapping) has no fastrl/envs: there the name resolves to the
# envs/ folder beside this package. Installed, fastrl/envs exists and this stays out.
# First on sys.meta_path: an editable install of another checkout maps fastrl.envs
# to that checkout's envs/, and this package must not run with another's envs.
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
