"""What the planner knows of the learner's compiled step.

The start-up profile times the learner eagerly: compiling takes tens of seconds,
far past the profile's budget of a few. But a learner that compiles (see
fastrl/learning/compiled.py) runs most of a long run at a fraction of that cost,
and a plan sized for the eager learner then starves it of actors.

So every run that decides its compile remembers, per machine and setup as the
profile is, the ratio of the step it kept to eager's (1.0 when it stayed eager),
and the next run's plan takes the learner's costs at that ratio. It also keeps the
last few ratios the runs measured, whichever step they kept: the next run's
learner judges its own timing together with them (PRIOR_RUNS in
fastrl/learning/compiled.py). A setup's first run on a machine plans from eager
costs and judges on its own timing alone. A judgement made while other programs
took the cores is not kept (the runner checks).
"""
from __future__ import annotations

import dataclasses
import os
from typing import List, Optional

import torch

from fastrl.algo.model import resolve_device
from fastrl.learning.compiled import PRIOR_RUNS, CompileMemory, will_compile
from fastrl.tuning.profiling import MODEL_OPTIONS, cache_path, read_cache, write_cache

# Everything that shapes the learner's step: the model, the observations (env and
# its options), the minibatch, and the arithmetic.
SETUP_OPTIONS = (*MODEL_OPTIONS, "env", "doom_measurements", "doom_hud", "doom_scenario", "batch_size",
                 "num_minibatches", "exploration_loss", "compile_learner")


def _path(cfg, learning_precision: str) -> str:
    # The device too: on a GPU machine a CPU run's ratio says nothing of a GPU run's.
    return cache_path({"learner_compile": {k: getattr(cfg, k) for k in SETUP_OPTIONS},
                       "precision": learning_precision, "device": torch.device(resolve_device(cfg)).type})


def remember(cfg, learning_precision: str, report: dict) -> None:
    """Keep, from the learner's compile report (fastrl.learning.compiled), the
    ratio of the step it runs to eager's and the ratio it measured, for the next
    run of this setup. A report with nothing timed both ways (`on`) says nothing
    of either."""
    path = _path(cfg, learning_precision)
    measured = _measured(read_cache(path))
    if report.get("chosen") == "eager" and report.get("compiled_step_s") is None:
        ratio = 1.0  # the compile failed: the next run's learner will be eager too
    elif report.get("ratio") is None:
        return
    else:
        measured = (measured + [report["ratio"]])[-PRIOR_RUNS:]
        # The step kept was judged on this run's ratio and the earlier ones: the
        # next run's step is best foretold by the same judgement.
        judged = report.get("judged_ratio") or report["ratio"]
        ratio = judged if report["chosen"] == "compiled" else 1.0
    write_cache(path, {"ratio": ratio, "measured": measured})


def forget(cfg, learning_precision: str) -> None:
    """Drop what earlier runs of this setup measured of the compiled step (--plan fresh)."""
    write_cache(_path(cfg, learning_precision), {})


def _measured(kept: dict) -> List[float]:
    values = kept.get("measured")
    if not isinstance(values, list):
        return []
    return [float(v) for v in values if isinstance(v, (int, float)) and v > 0]


def memory(cfg, learning_precision: str) -> CompileMemory:
    """What the learner's compile takes from earlier runs of this setup on this
    machine: the compiled step's time over eager's that the last ones measured,
    oldest first (at most PRIOR_RUNS; none before the first), and the name of the
    machine and setup (this memory's file name), which keys the marks of what
    inductor's cache holds."""
    path = _path(cfg, learning_precision)
    return CompileMemory(tuple(_measured(read_cache(path))), os.path.splitext(os.path.basename(path))[0])


def remembered_ratio(cfg, learning_precision: str, images: bool) -> Optional[float]:
    """The learner's step time over eager's that a run of this setup on this
    machine measured, or None: not measured yet, or a learner that will not compile."""
    if not will_compile(cfg.compile_learner, images, cfg.use_rnn, torch.device(resolve_device(cfg)).type):
        return None
    try:
        ratio = float(read_cache(_path(cfg, learning_precision))["ratio"])
    except (ValueError, TypeError, KeyError):
        return None
    return ratio if 0 < ratio <= 1 else None


def at_ratio(costs, ratio: float):
    """The planner's Costs with the learner's step at `ratio` of the profiled one."""
    return dataclasses.replace(costs, train_s={t: s * ratio for t, s in costs.train_s.items()})
