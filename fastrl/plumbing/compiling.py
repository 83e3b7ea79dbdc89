"""What the learner's compiled step and a rollout worker's compiled forward share:
which models `auto` compiles, the bar a compiled call must clear, inductor's cache
and what it is known to hold, the heartbeat kept while a compile blocks, and error
reports."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import threading
import time
from typing import Callable, Optional

from fastrl.plumbing.files import not_safely_ours, user_cache, write_json


# `auto` compiles image models with a GRU core on a CPU: the unrolled loop is one graph
# to fuse. Smaller models gain too little to repay the compile's CPU time. On a GPU the
# eager step already outpaces what the actors produce, so `on` is for a GPU whose
# learner is the limit.
def auto_compiles(images: bool, use_rnn: bool, device_type: str) -> bool:
    """Whether `auto` tries the compile for this model and device."""
    return images and use_rnn and device_type == "cpu"


MAX_RATIO = 0.95  # compiled kept only below this fraction of eager's time
# Where inductor keeps what it compiled, unless TORCHINDUCTOR_CACHE_DIR says otherwise:
# its default under /tmp is emptied at boot, and a cold compile costs minutes of a
# core. The price is disk space.
INDUCTOR_CACHE = "inductor"


def use_inductor_cache() -> None:
    """Point inductor at fastrl's cache folder unless the user named one. Importing
    torch._dynamo sets the variable to inductor's default, which counts as unnamed.
    Inductor loads the code it finds there, so a folder another user could write is
    replaced by a fresh private one: this process then compiles from scratch."""
    named = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if named is None or named == _inductors_default():
        folder = user_cache(INDUCTOR_CACHE)
        with contextlib.suppress(OSError):
            os.makedirs(folder, mode=0o700, exist_ok=True)
        if not_safely_ours(folder, folder=True):
            folder = tempfile.mkdtemp(prefix="fastrl-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder


def _inductors_default() -> Optional[str]:
    """Inductor's default folder if torch may have set the variable to it, else None;
    read only if its module is imported already, as importing it takes a second."""
    module = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    default = getattr(module, "default_cache_dir", None)
    return default() if default is not None else None


# Files that each say inductor's cache holds one compile, which inductor itself can
# tell only by tracing again; a run that knows can skip the background compile.
CACHE_MARKS = "inductor_marks"


def cache_mark(setup_key: str, inputs: dict, **what) -> Optional[str]:
    """The mark file of a compile: the setup `setup_key` names, called on tensors
    shaped, strided and typed as `inputs`, with `what` (thread count, flags), into the
    inductor cache in use. None without a setup key."""
    if not setup_key:
        return None
    use_inductor_cache()
    key = json.dumps({"setup": setup_key, "inputs": _signature(inputs), "cache": os.environ["TORCHINDUCTOR_CACHE_DIR"],
                      **what}, sort_keys=True)
    return os.path.join(user_cache(CACHE_MARKS), hashlib.sha1(key.encode()).hexdigest()[:20] + ".json")


def _signature(value):
    if isinstance(value, dict):
        return {k: _signature(v) for k, v in value.items()}
    return [list(value.shape), list(value.stride()), str(value.dtype)]


def cache_holds(mark: Optional[str]) -> bool:
    """Whether a run marked this compile done and the cache folder is not emptied (a
    cold compile in place would pause the learner for minutes)."""
    if not mark or not os.path.isfile(mark):
        return False
    try:
        return bool(os.listdir(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")))
    except OSError:
        return False


def set_cache_mark(mark: Optional[str], held: bool) -> None:
    """Mark the compile done, or no longer; a failed write only slows the next start."""
    if not mark:
        return
    try:
        if held:
            os.makedirs(os.path.dirname(mark), exist_ok=True)
            write_json(mark, {"marked_at": time.time()})
        else:
            os.remove(mark)
    except OSError:
        pass


# How often a thread marks a process alive while its own compile blocks it.
BEAT_EVERY_S = 1.0


@contextlib.contextmanager
def beating(beat: Callable[[], None]):
    """Call `beat` every BEAT_EVERY_S from a thread while the block runs, so the
    supervisor does not restart a process that a compile blocks."""
    done = threading.Event()

    def beat_until_done():
        while not done.wait(BEAT_EVERY_S):
            beat()

    thread = threading.Thread(target=beat_until_done, name="fastrl: beat while compiling", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def short_error(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]
