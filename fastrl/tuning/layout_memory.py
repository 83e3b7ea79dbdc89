"""Earlier runs' trained rate over the planner's prediction, per machine, setup and inference mode:
the model errs the same way run after run on one machine (a quiet profile misses what a policy
worker costs when every core is busy), so the next plan scales each mode's candidates by it."""
from __future__ import annotations

import statistics
import time
from typing import Dict, List, NamedTuple, Optional

from fastrl.algo.model import Precision
from fastrl.plumbing.machine_load import disturbed
from fastrl.tuning.planner import Recall
from fastrl.tuning.profiling import PROFILED_OPTIONS, read_cache, setup_cache_path, write_cache

# A window shorter than this says more about the run's start than about its layout.
MIN_WINDOW_S = 30.0
KEPT_RUNS = 6  # per mode: enough for a quartile, few enough to follow a machine that changes
MAX_AGE_S = 30 * 24 * 3600.0
# Runs of the other modes before a ruled-out mode is tried again, times the runs it
# already has: each retry that confirms it slower waits longer for the next.
RETRY_AFTER = 10
# The most a mode's memory moves its prediction: a little wider than the model's errors.
SCALE_BOUNDS = (0.7, 1.4)
# The longest the learner may train nothing in the window: seconds, or a few of its steps if slow.
MAX_STALL_S = 5.0
STALL_STEPS = 4
# What, beside the profiled costs, sets the rate a layout trains at.
OPTIONS = (*PROFILED_OPTIONS, "batch_size", "num_minibatches", "rollout", "compile_learner", "compile_actors",
           "num_policies", "max_batches_ahead")


class RunWindow(NamedTuple):
    """What a run saw over the window its trained rate was measured in."""
    seconds: float
    foreign_cores: Optional[float]  # cores other programs kept busy on average (None: unknown)
    cores: int
    longest_stall_s: float
    step_s: float
    restarts: int
    policies: int
    compiling: bool  # a compile ended inside the window


def why_not_a_measure(w: RunWindow) -> str:
    """Why the run's rate does not measure its layout, in a few words; "" when it does."""
    if w.policies > 1:
        return f"a run of {w.policies} policies"
    if w.seconds < MIN_WINDOW_S:
        return f"its steady window was {w.seconds:.0f} s, under {MIN_WINDOW_S:.0f} s"
    if disturbed(w.foreign_cores, w.cores):
        return f"other programs took {w.foreign_cores:.2f} of its {w.cores} cores"
    if w.restarts:
        return f"{w.restarts} restart(s) during the run"
    if w.longest_stall_s > max(MAX_STALL_S, STALL_STEPS * w.step_s):
        return f"the learner trained nothing for {w.longest_stall_s:.0f} s"
    if w.compiling:
        return "a compile ended inside the window"
    return ""


def _path(cfg, precision: Precision) -> str:
    return setup_cache_path("layout_runs", cfg, precision, OPTIONS)


def _runs(path: str, now: float) -> List[dict]:
    runs = read_cache(path).get("runs")
    if not isinstance(runs, list):
        return []
    return [r for r in runs if isinstance(r, dict) and isinstance(r.get("inference"), str)
            and isinstance(r.get("ratio"), (int, float)) and r["ratio"] > 0
            and isinstance(r.get("at"), (int, float)) and now - r["at"] <= MAX_AGE_S
            and isinstance(r.get("n"), int)]


def remember(cfg, precision: Precision, inference: str, predicted_steps_per_s: float,
             trained_steps_per_s: float, now: Optional[float] = None) -> None:
    """Keep a run's trained rate over its prediction; call it only for runs why_not_a_measure accepts."""
    if predicted_steps_per_s <= 0 or trained_steps_per_s <= 0:
        return
    now = time.time() if now is None else now
    path = _path(cfg, precision)
    count = _count(path) + 1
    runs = _runs(path, now) + [{"inference": inference, "ratio": trained_steps_per_s / predicted_steps_per_s,
                                "at": now, "n": count}]
    by_mode: Dict[str, list] = {}
    for r in runs:
        by_mode.setdefault(r["inference"], []).append(r)
    kept = sorted((r for mode_runs in by_mode.values() for r in mode_runs[-KEPT_RUNS:]), key=lambda r: r["n"])
    write_cache(path, {"runs": kept, "count": count})


def _count(path: str) -> int:
    count = read_cache(path).get("count")
    return count if isinstance(count, int) and count >= 0 else 0


def typical(ratios: List[float]) -> float:
    """The upper quartile of a mode's ratios: other work only slows a run, so one slow run barely moves it."""
    if len(ratios) == 1:
        return ratios[0]
    return statistics.quantiles(ratios, n=4, method="inclusive")[2]


def recall(cfg, precision: Precision, now: Optional[float] = None) -> Recall:
    """The planner's view of the runs kept for this setup on this machine."""
    path = _path(cfg, precision)
    runs, count = _runs(path, time.time() if now is None else now), _count(path)
    low, high = SCALE_BOUNDS
    ratios: Dict[str, list] = {}
    newest: Dict[str, int] = {}
    for r in runs:
        ratios.setdefault(r["inference"], []).append(float(r["ratio"]))
        newest[r["inference"]] = max(newest.get(r["inference"], 0), r["n"])
    return Recall({mode: min(high, max(low, typical(values))) for mode, values in ratios.items()},
                  frozenset(mode for mode, n in newest.items() if count - n >= RETRY_AFTER * len(ratios[mode])),
                  untried_due=count >= RETRY_AFTER)


def forget(cfg, precision: Precision) -> None:
    """Drop every run kept for this setup (--plan fresh)."""
    write_cache(_path(cfg, precision), {"runs": [], "count": 0})
