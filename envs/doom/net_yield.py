"""The network shim a match's engines run with (net_yield.c): built once per machine
with the C compiler into fastrl's private temp folder and preloaded by the launcher
into network-game engines only, so their spinning network loop yields its core.
Without a compiler the engines spin as ViZDoom has them, and games run slower.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading

from fastrl.envs.doom.engine import private_dir

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "net_yield.c")
ENV_VAR = "FASTRL_DOOM_NET_YIELD"  # the launcher preloads the library it names into seats' engines
BUILD_TIMEOUT_S = 60.0

_lock = threading.Lock()
_built: str | None = None
_tried = False


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def library_path() -> str | None:
    """The built shim (built on first need), or None where it cannot be built."""
    global _built, _tried
    with _lock:
        if _tried:
            return _built
        _tried = True
        compiler, directory = _compiler(), private_dir()
        if compiler is None or directory is None or not os.path.isfile(SOURCE):
            return None
        with open(SOURCE, "rb") as fh:
            key = hashlib.sha1(fh.read() + compiler.encode()).hexdigest()[:12]
        path = os.path.join(directory, f"doom-net-yield-{key}.so")
        if not os.path.isfile(path):
            # Built beside its name and renamed in, so concurrent builds never preload half a file.
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=directory)
            os.close(fd)
            try:
                done = subprocess.run([compiler, "-O2", "-shared", "-fPIC", SOURCE, "-o", tmp, "-ldl"],
                                      capture_output=True, timeout=BUILD_TIMEOUT_S)
                if done.returncode != 0:
                    return None
                os.replace(tmp, path)
            except (OSError, subprocess.TimeoutExpired):
                return None
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        _built = path
        return path


def offer_to_engines() -> None:
    """Name the shim in this process's environment, which the engines it starts
    inherit; the launcher preloads it into those that are seats of a match."""
    path = library_path()
    if path is not None:
        os.environ[ENV_VAR] = path
