"""What earlier runs of a setup trained at, against what the planner predicted.

The planner ranks layouts on costs profiled in a few quiet seconds, and its model
of a layout errs the same way run after run on one machine: doom_battle on this
project's Intel Xeon (family 6 model 207) planned 2 workers x 64 envs with a CPU
policy worker, which trained at 94-100% of its prediction, where 2 x 32 with local
inference, predicted 3% slower, trained at 116-128% of its own, 1.24-1.31x the
plan's rate in steady state, alternating (benchmarks/README.md, thirty-eighth
session; the twenty-first found the same ranking on doom_basic). What a policy
worker costs in a run that keeps every core busy (its wake-ups, the caches the
engines and the other processes leave it, the batch it finds waiting) is not in a
quiet profile.

So every run that trained long enough to say keeps, per machine and setup as the
profile is, its trained rate over the model's prediction, by inference mode
(the rate of its training's second half, as steady as the prediction is: the
first half holds compiles that a setup's first run pays and the next does not)
(local or policy workers): those errors are the model's of the mode, not of one
worker count. The next plan scales each candidate's prediction by the median of
its mode's last runs. A mode no run has tried takes the other's scale, and the
planner runs it once if it then comes near the best (planner.UNTRIED_MARGIN): a
plan that measured only one mode would otherwise keep it for good whenever its
runs beat the model's word for it. The bounds on the scale keep one disturbed run
from ruling a mode out for good when the model puts it far ahead.
"""
from __future__ import annotations

import statistics
from typing import Dict

from fastrl.algo.model import Precision
from fastrl.tuning.profiling import PROFILED_OPTIONS, read_cache, setup_cache_path, write_cache

# A run that trained for less than this says more about its start (the compile,
# the first batches) than about its layout: tests' runs, a quick look.
MIN_TRAINING_S = 60.0
KEPT_RUNS = 5  # per mode: the median of the last few follows a machine that changes
# The most a mode's memory moves its prediction: the errors measured were 0.9-1.3x.
SCALE_BOUNDS = (0.7, 1.4)
# What, beside the profiled costs, sets the rate a layout trains at.
OPTIONS = (*PROFILED_OPTIONS, "batch_size", "num_minibatches", "rollout", "compile_learner", "compile_actors",
           "num_policies", "max_batches_ahead")


def _path(cfg, precision: Precision) -> str:
    return setup_cache_path("layout_runs", cfg, precision, OPTIONS)


def _ratios(path: str) -> Dict[str, list]:
    """{inference mode: its runs' ratios} kept at `path`, whatever else the file holds dropped."""
    return {mode: [float(r) for r in ratios if isinstance(r, (int, float)) and r > 0]
            for mode, ratios in read_cache(path).items() if isinstance(ratios, list)}


def remember(cfg, precision: Precision, inference: str, predicted_steps_per_s: float,
             trained_steps_per_s: float, training_s: float) -> bool:
    """Keep a run's trained rate over its model prediction for its inference mode;
    False (nothing kept) for a run that trained under MIN_TRAINING_S."""
    if training_s < MIN_TRAINING_S or predicted_steps_per_s <= 0 or trained_steps_per_s <= 0:
        return False
    path = _path(cfg, precision)
    kept = _ratios(path)
    kept[inference] = (kept.get(inference, []) + [trained_steps_per_s / predicted_steps_per_s])[-KEPT_RUNS:]
    write_cache(path, kept)
    return True


def scales(cfg, precision: Precision) -> Dict[str, float]:
    """{inference mode: the factor its layouts' predictions take}, for the modes
    earlier runs of this setup on this machine tried."""
    low, high = SCALE_BOUNDS
    return {mode: min(high, max(low, statistics.median(ratios)))
            for mode, ratios in _ratios(_path(cfg, precision)).items() if ratios}
