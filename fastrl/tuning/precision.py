"""`--precision auto`: bf16 or fp32 for the image encoders, acting and learning apart, timed here,
since no CPU flag says how fast its bf16 kernels are. Cached per machine and setup apart from the
planner's profile, so that --plan off decides alike; the profile reuses the chosen timings."""
from __future__ import annotations

import json
import statistics
import time

import torch

from fastrl.algo.model import Precision, has_images, native_bf16, obs_layout, resolve_device
from fastrl.plumbing import machine_load
from fastrl.plumbing.caching_allocator import learner_memory
from fastrl.tuning.profiling import (
    DEVICE_FORWARD_BATCHES,
    FORWARD_BATCHES,
    MODEL_OPTIONS,
    OneThreadCosts,
    cache_path,
    learner_timing_cfg,
    model_calls,
    time_interleaved,
    timed_trajectories,
    write_cache,
)

# CPU seconds to time for past time_interleaved's minimum of rounds (its cost: benchmarks/startup.py, cold).
MEASURE_SECONDS = 0.5
# Wall seconds the measurement may take under any load, model building included: twice a quiet Doom model's.
MEASURE_CAP_S = 10.0
# bf16 must save this share of fp32's time: fp32 is exact, and repeated timings spread by a few %.
MIN_GAIN = 0.05
PRECISIONS = ("fp32", "bf16")


def resolve_precision(cfg, obs_space, action_space) -> Precision:
    """cfg.precision for this machine and this model (decide_precision's choice)."""
    return decide_precision(cfg, obs_space, action_space)[0]


def decide_precision(cfg, obs_space, action_space) -> tuple:
    """The Precision for this machine and model, and its CPU costs (OneThreadCosts) if auto timed them."""
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
    """bf16 for each role whose bf16_ratios entry is at most 1 - MIN_GAIN, else fp32."""
    def pick(ratio: float) -> str:
        return "bf16" if ratio <= 1.0 - MIN_GAIN else "fp32"

    return Precision(pick(ratios["acting"]), pick(ratios["learning"]),
                     f"{how}: bf16 takes {ratios['acting']:.2f}x fp32's time acting, "
                     f"{ratios['learning']:.2f}x learning")


def bf16_ratios(timings: dict) -> dict:
    """bf16's time over fp32's per role; acting's is the geometric mean over batch sizes,
    since the layout, and so an actor's batch, is planned only after this."""
    acting, learning = timings["acting"], timings["learning"]
    return {"acting": statistics.geometric_mean(acting["bf16"][b] / acting["fp32"][b] for b in acting["fp32"]),
            "learning": learning["bf16"] / learning["fp32"]}


def measure_precision(cfg, obs_space, action_space, seconds: float, cap_s: float, device: str = "cpu") -> tuple:
    """({"acting": {p: {batch: s}}, "learning": {p: s}}, capped): seconds per sample, all timed in the
    same rounds so a slow second slows both precisions alike; in CPU time on one thread (an actor's) so
    other programs do not count, or on CUDA in wall time, since the GPU's time is what counts."""
    start = time.perf_counter()
    on_gpu = torch.device(device).type == "cuda"
    model_cfg = cfg if on_gpu else learner_timing_cfg(cfg)
    batches = DEVICE_FORWARD_BATCHES if on_gpu else FORWARD_BATCHES
    calls, samples = {}, 0
    with learner_memory(cfg.learner_allocator, device):
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
    """(timings, from the cache, taken on a busy machine); a busy measurement is not cached."""
    layout = {key: [list(shape), str(dtype)] for key, (shape, dtype) in obs_layout(obs_space).items()}
    setup = {"precision": {k: getattr(cfg, k) for k in MODEL_OPTIONS}, "obs": layout, "actions": str(action_space)}
    if device != "cpu":
        setup.update(device=device, minibatch=cfg.batch_size // cfg.num_minibatches)
    else:
        setup.update(learner_trajectories=timed_trajectories(cfg))
    path = cache_path(setup, cfg.modules)
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
        pass
    before = machine_load.sample()
    timings, capped = measure_precision(cfg, obs_space, action_space, MEASURE_SECONDS, MEASURE_CAP_S, device)
    busy = capped or machine_load.disturbed_since(before)
    if not busy:
        write_cache(path, timings)
    return timings, False, busy
