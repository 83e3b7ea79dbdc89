"""Who registered an env or a model: the user's module that called register_env or
register_model, whether two module names are one source file, and importing a user's module
with a one-sentence error. Shared by the env
registry (envs/registry.py) and the model registry (algo/model_registry.py), which sit on
one layer and so cannot import each other; imports nothing of fastrl."""
from __future__ import annotations

import importlib
import os
import sys


def file_of(module) -> str:
    """The real path of a module's source file; "" where it has none."""
    path = getattr(module, "__file__", None)
    return os.path.realpath(path) if path else ""


def ran_here(path: str) -> bool:
    """Whether a module of this process was loaded from the file at `path`."""
    real = os.path.realpath(path)
    return any(file_of(module) == real for module in list(sys.modules.values()))


def calling_module() -> str:
    """The module that called into fastrl: the first frame up the stack outside fastrl."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module != "fastrl" and not module.startswith("fastrl."):
            return module
        frame = frame.f_back
    return ""


def same_module(a: str, b: str) -> bool:
    """Whether two module names are one source file: a main script runs again as __mp_main__
    in worker processes, or under another name when imported by its path."""
    if a == b:
        return True
    file_a, file_b = (file_of(sys.modules.get(m)) for m in (a, b))
    return bool(file_a) and file_a == file_b


def one_line(err: BaseException) -> str:
    """An exception in one line: its type and its message's first line."""
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__


def import_users_module(name: str):
    """Import the user's module `name`, or raise ImportError saying in one sentence what failed
    and what to do: a module not found, or one that failed on its own import."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if f"{name}.".startswith(f"{err.name}."):
            raise ImportError(f"module {name!r} cannot be imported ({err}); put its folder on PYTHONPATH.") from None
        raise ImportError(f"module {name!r} failed to import ({one_line(err)}); install what it needs.") from None
    except Exception as err:  # noqa: BLE001 - the user's module failed on import, however it did
        raise ImportError(f"module {name!r} failed to import ({one_line(err)}); fix that module.") from None
