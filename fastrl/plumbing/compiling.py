"""What both compiled parts of the model share (the learner's step,
fastrl/learning/compiled.py, and a rollout worker's forward,
fastrl/sampling/compiled_act.py): which models `auto` compiles, the bar a
compiled call must clear, where inductor's cache lives and what it is known to
hold, the heartbeat kept while a compile blocks a process, and how a failure is
reported."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
from typing import Callable, Optional

from fastrl.plumbing.files import user_cache, write_json


# `auto` compiles only image models with a GRU core, on a CPU. With a GRU the
# unrolled loop is one graph to fuse, forward and backward. doom_basic's image
# model has none (and no input z-score) and gained 0.87x, and its runs reach their
# target in two minutes, during which the compile's CPU seconds would cost more
# than the steps win back; a vector model's step takes a few ms.
# On a GPU the compiled step is faster (doom_defend_the_center on an H200: 15 ms
# against eager's 29), but the compile is what cost: the eager GPU step is the
# host launching kernels, holding the GIL, and the compile, then a thread of the
# learner, took it away while it traced, so for the 35 s of the compile the learner
# trained 0-2,500 samples/s where it trains 20-25k, and the actors waited on it
# (the compile's own process, since, leaves the GIL alone; not measured on a GPU
# yet). Eager already consumes faster than 16 cores produce (29 ms per 1,024
# samples is ~140k env frames/s), so the compiled step wins nothing there; `on`
# is for a GPU whose learner is the limit (benchmarks/README.md, twenty-eighth
# session).
def auto_compiles(images: bool, use_rnn: bool, device_type: str) -> bool:
    """Whether `auto` tries the compile for this model and device."""
    return images and use_rnn and device_type == "cpu"


MAX_RATIO = 0.95  # compiled kept only below this fraction of eager's time
# Where inductor keeps what it compiled, unless the user says (TORCHINDUCTOR_CACHE_DIR).
# Its own default is /tmp/torchinductor_<user>, which most Linux systems empty at boot,
# so every reboot meant a cold compile again: minutes of a core beside the run on 2
# cores (doom_battle's took 164.5 s on a Zen 3 EPYC, and doom_defend_the_center's had
# not finished 150 s after launch on an Intel Xeon, the run meanwhile slower than
# Sample Factory's; benchmarks/README.md). A warm one takes 7-16 s. The price is disk:
# ~160 MB for the Doom models' setups on one machine.
INDUCTOR_CACHE = "inductor"


def use_inductor_cache() -> None:
    """Point inductor at fastrl's cache folder, unless the user named one.

    Importing torch._dynamo sets the variable to inductor's default itself (torch
    2.13 does it at import, and anything compiled, or a custom op's first call,
    imports it), so the default counts as unnamed."""
    named = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if named is None or named == _inductors_default():
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = user_cache(INDUCTOR_CACHE)


def _inductors_default() -> Optional[str]:
    """Inductor's default folder where torch may have set the variable to it, else None.
    Only the module that sets it knows the default, and importing it takes a second
    (it imports torch._dynamo; the learner's first batch waited for it), so where
    it is not imported yet torch set nothing."""
    module = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    default = getattr(module, "default_cache_dir", None)
    return default() if default is not None else None


# Files that each say inductor's cache holds one compile. Inductor can only tell by
# tracing the function again, the slow half of a warm compile; a run that knows
# beforehand can skip what guards against a cold one (the learner's compile in a
# process of its own: fastrl/learning/compiled.py).
CACHE_MARKS = "inductor_marks"


def cache_mark(setup_key: str, inputs: dict, **what) -> Optional[str]:
    """The mark file of a compile: of the setup `setup_key` names (machine, torch,
    fastrl's code, the model and its options: fastrl.tuning.compiled_costs), called on
    tensors shaped, strided and typed as `inputs`' (a dict of tensors or of dicts of
    them), with `what` (thread count, flags) as well, into the inductor cache in use.
    None without a setup key."""
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
    """Whether a run marked this compile done, with inductor's cache folder still
    there and not emptied (a cold compile in place would pause the learner for
    minutes, where in the background it costs a slower start)."""
    if not mark or not os.path.isfile(mark):
        return False
    try:
        return bool(os.listdir(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")))
    except OSError:
        return False


def set_cache_mark(mark: Optional[str], held: bool) -> None:
    """Say that inductor's cache holds the compile `mark` names, or no longer does.
    A mark that cannot be written is only a slower next start."""
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
    """Call `beat` every BEAT_EVERY_S from a thread while the block runs: a compile
    blocks its process's loop, and the supervisor restarts a child silent for its
    heartbeat timeout (seconds warm, but minutes cold)."""
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
