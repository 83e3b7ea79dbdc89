"""The compiled learner step's time over eager's, kept per machine and setup: the profile
times the step eagerly, and a plan from eager costs starves a compiling learner of actors."""
from __future__ import annotations

import dataclasses
import os
from typing import List, Optional

import torch

from fastrl.algo.model import resolve_device
from fastrl.learning.compiled import PRIOR_RUNS, CompileMemory, will_compile
from fastrl.tuning.profiling import MODEL_OPTIONS, cache_path, read_cache, write_cache

SETUP_OPTIONS = (*MODEL_OPTIONS, "env", "doom_measurements", "doom_hud", "doom_scenario", "batch_size",
                 "num_minibatches", "exploration_loss", "compile_learner")


def _path(cfg, learning_precision: str) -> str:
    return cache_path({"learner_compile": {k: getattr(cfg, k) for k in SETUP_OPTIONS},
                       "precision": learning_precision, "device": torch.device(resolve_device(cfg)).type},
                      cfg.modules)


def remember(cfg, learning_precision: str, report: dict) -> None:
    """Keep a compile report's judged ratio (1.0 if eager) and measured one; a report with
    no ratio (`on`) keeps nothing unless its compile failed."""
    path = _path(cfg, learning_precision)
    measured = _measured(read_cache(path))
    if report.get("chosen") == "eager" and report.get("compiled_step_s") is None:
        ratio = 1.0  # the compile failed: the next run's learner will be eager too
    elif report.get("ratio") is None:
        return
    else:
        measured = (measured + [report["ratio"]])[-PRIOR_RUNS:]
        judged = report.get("judged_ratio") or report["ratio"]
        ratio = judged if report["chosen"] == "compiled" else 1.0
    write_cache(path, {"ratio": ratio, "measured": measured})


def forget(cfg, learning_precision: str) -> None:
    """Drop what earlier runs of this setup measured (--plan fresh)."""
    write_cache(_path(cfg, learning_precision), {})


def _measured(kept: dict) -> List[float]:
    values = kept.get("measured")
    if not isinstance(values, list):
        return []
    return [float(v) for v in values if isinstance(v, (int, float)) and v > 0]


def memory(cfg, learning_precision: str) -> CompileMemory:
    """Earlier runs' measured ratios, oldest first, and the key of inductor's cache marks."""
    path = _path(cfg, learning_precision)
    return CompileMemory(tuple(_measured(read_cache(path))), os.path.splitext(os.path.basename(path))[0])


def remembered_ratio(cfg, learning_precision: str, images: bool) -> Optional[float]:
    """The ratio to plan with, or None before a measurement or for a learner that will not compile."""
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
