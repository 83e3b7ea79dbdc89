"""`--precision auto`: the arithmetic of the image encoders, chosen by timing it here.

bf16 halves the bytes a convolution moves, but it is only as fast as this CPU's
kernels for it, and no CPU flag says how fast those are: two x86 CPUs with the same
AVX512-BF16 flag rank bf16 and fp32 opposite ways. So auto times both on this
machine, the actors' forward and the learner's gradient step, and picks the faster
for each role apart.

Where the CPU has no bf16 instructions at all, oneDNN emulates bf16, slower than
fp32 every time: fp32, without measuring. On a GPU run auto times both on the GPU,
in wall time: the learner's step at the run's own minibatch and the forward at a
GPU policy worker's batch sizes (kernels as small as the Doom model's gain little
from halving their bytes). Local actors on such a machine take the GPU's choice for
acting; the planner puts inference on the GPU there. A model without an image
encoder has nothing that --precision changes.

`decide_precision` runs once per run, in the runner's process before any child
starts (the children get its answer through SharedContext and never measure),
and `resolve_precision` in enjoy. Its measurement is cached per machine and setup
like the planner's profile but apart from it, so that a run with --plan off
decides the same way; the profile then takes the chosen arithmetic's timings
from it (OneThreadCosts) rather than time the same forwards again. A measurement
taken on a busy machine (it hit its wall-clock cap, or other programs took the
cores) decides this run and is not cached.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace

import torch

from fastrl.algo.model import Precision, has_images, native_bf16, obs_layout, resolve_device
from fastrl.plumbing import machine_load
from fastrl.plumbing.caching_allocator import learner_memory
from fastrl.plumbing.proc import usable_cores
from fastrl.tuning.profiling import (
    DEVICE_FORWARD_BATCHES,
    FORWARD_BATCHES,
    MODEL_OPTIONS,
    PROFILE_TRAJECTORIES,
    OneThreadCosts,
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
# Wall seconds the measurement may take whatever the load, model building
# included: about twice what the Doom model takes on a quiet 2-core machine.
MEASURE_CAP_S = 10.0
# bf16 must save at least this share of fp32's time: fp32 is the exact arithmetic,
# and repeated measurements of one model on a busy 2-core machine spread by ~3%.
MIN_GAIN = 0.05
PRECISIONS = ("fp32", "bf16")


def resolve_precision(cfg, obs_space, action_space) -> Precision:
    """cfg.precision for this machine and this model (decide_precision's choice)."""
    return decide_precision(cfg, obs_space, action_space)[0]


def decide_precision(cfg, obs_space, action_space) -> tuple:
    """(Precision, OneThreadCosts or None): cfg.precision for this machine and this
    model, `auto` decided as the module's docstring says, --precision fp32 or bf16
    forcing both roles; and the model's costs in the chosen arithmetic where auto
    timed them (now or on an earlier run), for the planner's profile."""
    if not has_images(obs_space):
        return Precision("fp32", "fp32", "no image encoder"), None
    if cfg.precision != "auto":
        return Precision(cfg.precision, cfg.precision, f"--precision {cfg.precision}"), None
    device = torch.device(resolve_device(cfg)).type
    if device == "cpu" and not native_bf16():
        return Precision("fp32", "fp32", "auto: this CPU has no native bf16"), None
    timings, cached, capped = cached_timings(cfg, obs_space, action_space, device, fresh=cfg.plan == "fresh")
    how = ("measured on this machine earlier" if cached else
           "measured on a busy machine, not cached" if capped else "measured")
    chosen = choose(bf16_ratios(timings), how + (" on the GPU" if device == "cuda" else ""))
    if device == "cuda":  # GPU timings: the profile times the CPU's own costs
        return chosen, None
    return chosen, OneThreadCosts(forward_s=dict(timings["acting"][chosen.acting]),
                                  train_s=timings["learning"][chosen.learning], capped=capped)


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


def measure_precision(cfg, obs_space, action_space, seconds: float, cap_s: float, device: str = "cpu") -> tuple:
    """Seconds per sample of the actors' forward at each of the planner's batch sizes,
    {"fp32": {batch: s}, "bf16": {batch: s}}, and of the learner's gradient step on
    PROFILE_TRAJECTORIES trajectories, {"fp32": s, "bf16": s}, as {"acting": ...,
    "learning": ...}; and whether the measurement hit `cap_s`, its bound in wall
    seconds (time_interleaved).

    All four are timed in the same rounds (time_interleaved), so that a second in
    which the machine is slower slows fp32 and bf16 alike; in CPU time, not wall
    time, so that a program beside it taking the core (a benchmark, the process
    server importing torch at start-up) does not count (on a 2-core machine
    running a Doom benchmark beside it, four repeats gave ratios within 4% of each
    other, where wall-clock timings of one call were off by up to 3x); and on one
    thread: an actor runs one, and what bf16 saves is a property of the core.

    On a CUDA `device`: the learner's step at the run's own minibatch and the
    forwards at DEVICE_FORWARD_BATCHES, timed on the GPU in wall time (each call
    waits for the GPU, whose time is what counts; the host's CPU time would count
    how it waits)."""
    start = time.perf_counter()
    on_gpu = torch.device(device).type == "cuda"
    model_cfg = cfg if on_gpu else replace(cfg, batch_size=cfg.rollout * PROFILE_TRAJECTORIES, num_minibatches=1)
    batches = DEVICE_FORWARD_BATCHES if on_gpu else FORWARD_BATCHES
    calls, samples = {}, 0
    with learner_memory(cfg.learner_allocator, device):  # the learner's allocator, as it will run
        for p in PRECISIONS:
            both = Precision(p, p, "timed")
            forwards, train, samples = model_calls(model_cfg, obs_space, action_space, batches, both, device)
            calls.update({("acting", p, b): (1, fn) for b, fn in forwards.items()})
            calls[("learning", p, None)] = (1, train)
        previous = torch.get_num_threads()
        try:
            timed = time_interleaved(calls, seconds, clock=time.perf_counter if on_gpu else time.process_time,
                                     cap_s=cap_s - (time.perf_counter() - start))
        finally:
            torch.set_num_threads(previous)
    per_call = timed.per_call
    return ({"acting": {p: {b: per_call[("acting", p, b)] / b for b in batches} for p in PRECISIONS},
             "learning": {p: per_call[("learning", p, None)] / samples for p in PRECISIONS}}, timed.capped)


def cached_timings(cfg, obs_space, action_space, device: str = "cpu", fresh: bool = False) -> tuple:
    """(measure_precision's timings, whether they came from the cache, whether they
    were taken on a busy machine), cached per machine and model (cache_path) as the
    planner's profile is, so that only a machine's first run of a model pays the few
    CPU seconds; `fresh` measures again. A measurement that hit the cap or shared the
    cores with other programs is not cached."""
    layout = {key: [list(shape), str(dtype)] for key, (shape, dtype) in obs_layout(obs_space).items()}
    setup = {"precision": {k: getattr(cfg, k) for k in MODEL_OPTIONS}, "obs": layout, "actions": str(action_space)}
    if device != "cpu":  # (CPU profiles cached before the key existed stay valid)
        setup.update(device=device, minibatch=cfg.batch_size // cfg.num_minibatches)
    path = cache_path(setup)
    try:
        if fresh:
            raise FileNotFoundError(path)
        with open(path) as fh:
            saved = json.load(fh)
        timings = {"acting": {p: {int(b): s for b, s in saved["acting"][p].items()} for p in PRECISIONS},
                   "learning": {p: float(saved["learning"][p]) for p in PRECISIONS}}
        bf16_ratios(timings)  # a file that is not a measurement raises here: measure
        return timings, True, False
    except (OSError, ValueError, TypeError, KeyError, AttributeError, ZeroDivisionError):
        pass  # no file yet, or one that is not a measurement: measure
    before = machine_load.sample()
    timings, capped = measure_precision(cfg, obs_space, action_space, MEASURE_SECONDS, MEASURE_CAP_S, device)
    busy = capped or machine_load.disturbed(machine_load.foreign_cores(before, machine_load.sample()), usable_cores())
    if not busy:
        write_cache(path, timings)
    return timings, False, busy
