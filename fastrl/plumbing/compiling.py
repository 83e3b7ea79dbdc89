"""What both compiled parts of the model share (the learner's step,
fastrl/learning/compiled.py, and a rollout worker's forward,
fastrl/sampling/compiled_act.py): which models `auto` compiles, the bar a
compiled call must clear, where inductor's cache lives, and how a failure is
reported."""
from __future__ import annotations

import os

from fastrl.plumbing.files import user_cache


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
    """Point inductor at fastrl's cache folder, unless the user named one."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", user_cache(INDUCTOR_CACHE))


def short_error(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:200]
