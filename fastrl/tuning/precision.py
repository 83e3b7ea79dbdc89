"""`--precision auto`: the arithmetic of the image encoders, chosen by timing it here.

bf16 halves the bytes a convolution moves, but it is only as fast as this CPU's
kernels for it, and no CPU flag says how fast those are: on an Intel Xeon with
AVX512-BF16, bf16 took 1.5x fp32's time (a forward at 32 samples 528 us a sample
against 332 us; the learner's step at 1024 samples 1,236 us against 875 us),
while on an AMD EPYC with the same flag bf16 was the faster. So auto times both
on this machine, the actors' forward and the learner's gradient step, and picks
the faster for each role apart.

Where the CPU has no bf16 instructions at all, oneDNN emulates bf16, slower than
fp32 every time: fp32, without measuring. On CUDA auto stays fp32, also without
measuring: nothing times a GPU's bf16 yet, so nothing backs another choice there
(local actors on such a machine, which compute on its CPU, stay fp32 too). A model
without an image encoder has nothing that --precision changes.

`resolve_precision` runs once per run, in the runner's process before any child
starts (the children get its answer through SharedContext and never measure),
and in enjoy. Its measurement is cached per machine and setup like the planner's
profile but apart from it, so that a run with --plan off decides the same way.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace

import torch

from fastrl.algo.model import Precision, has_images, native_bf16, obs_layout, resolve_device
from fastrl.tuning.profiling import (
    FORWARD_BATCHES,
    MODEL_OPTIONS,
    cache_path,
    model_calls,
    time_interleaved,
    write_cache,
)

# CPU seconds to time for, past time_interleaved's minimum of rounds: a small model
# gets more rounds; a Doom model's round (both precisions, every batch size and a
# learner step each) takes ~0.6 s, so its 3 rounds and 2 warm-up calls take
# ~4 CPU seconds, once per machine and model.
MEASURE_SECONDS = 0.5
# The learner's step is timed on this many trajectories (256 samples at rollout
# 32), since a Doom minibatch of 1024 takes a second a step. A small step
# understates bf16's gain, as the costs it does not change (Adam, the GRU's loop
# over time) weigh more in it: on this project's AMD EPYC bf16 took 0.86x fp32's
# time at 64 samples, 0.72x at 256 and 0.63x at 1024. At 64 samples, on a loaded
# machine, one run measured 0.95x and chose fp32 for a learner that bf16 makes
# 1.6x faster; 256 samples cost ~1.6 CPU seconds more, once.
TRAJECTORIES = 8
# bf16 must save at least this share of fp32's time: fp32 is the exact arithmetic,
# and repeated measurements of one model on a busy 2-core machine spread by ~3%.
MIN_GAIN = 0.05
PRECISIONS = ("fp32", "bf16")


def resolve_precision(cfg, obs_space, action_space) -> Precision:
    """cfg.precision for this machine and this model, `auto` decided as the module's
    docstring says; --precision fp32 or bf16 forces both roles."""
    if not has_images(obs_space):
        return Precision("fp32", "fp32", "no image encoder")
    if cfg.precision != "auto":
        return Precision(cfg.precision, cfg.precision, f"--precision {cfg.precision}")
    if resolve_device(cfg) == "cuda":
        return Precision("fp32", "fp32", "auto: bf16 is not measured on GPUs yet")
    if not native_bf16():
        return Precision("fp32", "fp32", "auto: this CPU has no native bf16")
    ratios, cached = cached_ratios(cfg, obs_space, action_space)
    return choose(ratios, "measured on this machine earlier" if cached else "measured")


def choose(ratios: dict, how: str) -> Precision:
    """bf16 for each role whose ratio (bf16's time over fp32's, bf16_ratios) is at
    most 1 - MIN_GAIN, else fp32; `how` says where the ratios came from."""
    def pick(ratio: float) -> str:
        return "bf16" if ratio <= 1.0 - MIN_GAIN else "fp32"

    return Precision(pick(ratios["acting"]), pick(ratios["learning"]),
                     f"{how}: bf16 takes {ratios['acting']:.2f}x fp32's time acting, "
                     f"{ratios['learning']:.2f}x learning")


def bf16_ratios(timings: dict) -> dict:
    """{"acting": ratio, "learning": ratio}: bf16's time over fp32's in `timings`
    (measure_precision's). Acting's is the geometric mean over the batch sizes:
    the layout, and so the batch an actor runs, is planned after this from costs
    in the chosen precision, so every size counts alike."""
    acting, learning = timings["acting"], timings["learning"]
    return {"acting": statistics.geometric_mean(acting["bf16"][b] / acting["fp32"][b] for b in acting["fp32"]),
            "learning": learning["bf16"] / learning["fp32"]}


def measure_precision(cfg, obs_space, action_space, seconds: float) -> dict:
    """Seconds per sample of the actors' forward at each of the planner's batch sizes,
    {"fp32": {batch: s}, "bf16": {batch: s}}, and of the learner's gradient step on
    TRAJECTORIES trajectories, {"fp32": s, "bf16": s}, as {"acting": ..., "learning": ...}.

    All four are timed in the same rounds (time_interleaved), so that a second in
    which the machine is slower slows fp32 and bf16 alike; in CPU time, not wall
    time, so that a program beside it taking the core (a benchmark, the process
    server importing torch at start-up) does not count (on a 2-core machine
    running a Doom benchmark beside it, four repeats gave ratios within 4% of each
    other, where wall-clock timings of one call were off by up to 3x); and on one
    thread: an actor runs one, and what bf16 saves is a property of the core."""
    small = replace(cfg, batch_size=cfg.rollout * TRAJECTORIES, num_minibatches=1)
    calls, samples = {}, 0
    for p in PRECISIONS:
        both = Precision(p, p, "timed")
        forwards, train, samples = model_calls(small, obs_space, action_space, FORWARD_BATCHES, both)
        calls.update({("acting", p, b): (1, fn) for b, fn in forwards.items()})
        calls[("learning", p, None)] = (1, train)
    previous = torch.get_num_threads()
    try:
        per_call = time_interleaved(calls, seconds, clock=time.process_time)
    finally:
        torch.set_num_threads(previous)
    return {"acting": {p: {b: per_call[("acting", p, b)] / b for b in FORWARD_BATCHES} for p in PRECISIONS},
            "learning": {p: per_call[("learning", p, None)] / samples for p in PRECISIONS}}


def cached_ratios(cfg, obs_space, action_space) -> tuple:
    """(bf16_ratios of measure_precision, whether they came from the cache), the
    timings cached per machine and model (cache_path) as the planner's profile is,
    so that only a machine's first run of a model pays the second or two."""
    layout = {key: [list(shape), str(dtype)] for key, (shape, dtype) in obs_layout(obs_space).items()}
    path = cache_path({"precision": {k: getattr(cfg, k) for k in MODEL_OPTIONS}, "obs": layout,
                       "actions": str(action_space)})
    try:
        with open(path) as fh:
            return bf16_ratios(json.load(fh)), True
    except (OSError, ValueError, TypeError, KeyError, ZeroDivisionError):
        pass  # no file yet, or one that is not a measurement: measure
    timings = measure_precision(cfg, obs_space, action_space, MEASURE_SECONDS)
    write_cache(path, timings)
    return bf16_ratios(timings), False
