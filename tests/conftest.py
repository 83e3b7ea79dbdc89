"""What every test runs inside."""
import os
import shutil
import tempfile

# The suite's own ~/.cache (XDG_CACHE_HOME) and benchmark records folder, for it and
# every run it starts. A run keeps what it measured of the machine there (the
# planner's profile, the precision choice, the compiled step's timings), and tests'
# short runs beside other work must not steer a user's later runs; a benchmark a
# test runs end to end must not add a line to the repository's results.
_OWN = {"XDG_CACHE_HOME": "cache", "FASTRL_BENCHMARK_RESULTS": "benchmark_results"}
_root = None
_saved: dict = {}


def pytest_configure(config):
    global _root
    _root = tempfile.mkdtemp(prefix="fastrl-tests-")
    for var, name in _OWN.items():
        _saved[var] = os.environ.get(var)
        os.environ[var] = os.path.join(_root, name)
        os.makedirs(os.environ[var])


def pytest_unconfigure(config):
    for var, value in _saved.items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    if _root:
        shutil.rmtree(_root, ignore_errors=True)
