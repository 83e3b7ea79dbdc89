"""The learner's ActorCritic.evaluate compiled with torch.compile where that is
faster (compile_vs_eager in benchmarks/experiments/README.md). No run waits for it:

1. the learner trains eagerly; after its first step a separate process compiles a
   replica on a copy of that minibatch (same shapes and strides), filling inductor's
   on-disk cache, unless an earlier run already did (plumbing/compiling.py);
2. between two steps the learner compiles its own evaluate from the cache and times
   real steps compiled and eager in turn;
3. `auto` keeps compiled only below MAX_RATIO of eager's time, judged with earlier
   runs' ratios; `on` keeps compiled. Any error leaves the step eager.
"""
from __future__ import annotations

import copy
import io
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import torch

from fastrl.plumbing.compiling import (
    MAX_RATIO,
    auto_compiles,
    beating,
    cache_holds,
    cache_mark,
    set_cache_mark,
    short_error,
    use_inductor_cache,
)

MODES = ("auto", "on", "off")
# The metrics message in which the learner reports the choice (describe_compile's input).
COMPILE_KEY = "learner_compile"
# The metrics message that says the compile has begun; its value is a key of
# COMPILE_STARTED_LINES.
COMPILE_STARTED_KEY = "learner_compile_started"
# What a run prints then: the rate it shows until the choice is made is not its own.
COMPILE_STARTED_LINES = {
    "background": ("compiling the learner's step in the background; until it is done the run trains eagerly, "
                   "slower beside the compile (seconds once inductor's cache holds this setup, minutes the first "
                   "time on a machine)"),
    "in_place": ("compiling the learner's step from inductor's cache, which an earlier run of this setup filled: "
                 "the learner pauses for seconds"),
}
# Real steps timed each way, alternating, before `auto` decides: a step's time on busy
# cores varies with what the actors do beside it.
TIMED_STEPS = 5
# A ratio this close to MAX_RATIO is timed for as many steps again before the choice.
CLOSE_CALL = 0.05
# Earlier runs' ratios (fastrl.tuning.compiled_costs) that join this run's in `auto`'s
# median: one run's timing is too noisy to decide alone, and a step that truly turned
# slower still wins the vote within a few runs.
PRIOR_RUNS = 4
EVALUATE_INPUTS = ("obs", "rnn_state0", "episode_start", "actions")


class CompileMemory(NamedTuple):
    """The compiled-over-eager step ratios earlier runs of a setup measured on this
    machine, oldest first, and the key naming the setup (cache_mark's)."""
    prior: Tuple[float, ...] = ()
    setup_key: str = ""


def will_compile(mode: str, images: bool, use_rnn: bool, device_type: str) -> bool:
    """Whether a learner in `mode` tries the compile at all."""
    return mode == "on" or (mode == "auto" and auto_compiles(images, use_rnn, device_type))


def compile_in_child(replica: torch.nn.Module, inputs: dict, uniform_kl: bool, threads: int) -> Optional[str]:
    """Compile `replica.evaluate` forward and backward on `inputs` in a fresh process
    (fastrl.learning.warm_compile) with the learner's thread count (inductor's cache
    keys on it), filling the on-disk cache; returns None or what failed. A process,
    not a thread, so nothing of the compile reaches the learner's steps; the payload
    goes through a pipe, so a killed learner leaves no file behind."""
    payload = io.BytesIO()
    torch.save({"model": replica, "inputs": inputs, "uniform_kl": uniform_kl, "threads": threads}, payload)
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    pythonpath = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    child = subprocess.Popen([sys.executable, "-m", "fastrl.learning.warm_compile", str(os.getpid())],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env=dict(os.environ, PYTHONPATH=pythonpath))
    _, err = child.communicate(payload.getvalue())
    if child.returncode == 0:
        return None
    if child.returncode < 0:  # a signal (the OOM killer, a chaos run): what it printed last is not why
        return f"the compiling process was killed ({signal.Signals(-child.returncode).name})"
    said = err.decode(errors="replace").strip().splitlines()
    return said[-1] if said else f"the compiling process exited with code {child.returncode}"


class CompiledEvaluate:
    """Switches `model.evaluate` between eager and compiled as the steps go. The
    learner calls `before_step(mb)` and `after_step(seconds)` around every gradient
    step; `take_report()` hands over the choice's report once it is made."""

    def __init__(self, model: torch.nn.Module, mode: str, uniform_kl: bool, auto_compiles: bool,
                 prior: Sequence[float] = (), setup_key: str = "", beat: Callable[[], None] = lambda: None):
        """prior: earlier runs' compiled-over-eager ratios, oldest first. setup_key:
        names the setup for the compile-done mark; without one every compile runs in
        the background first. beat: keeps the learner's heartbeat while its own
        compile blocks it."""
        if mode not in MODES:
            raise ValueError(f"compile mode must be one of {MODES}, not {mode!r}")
        self.model, self.mode, self.uniform_kl = model, mode, uniform_kl
        self.prior = list(prior)[-PRIOR_RUNS:]
        self.setup_key, self.beat = setup_key, beat
        self._mark: Optional[str] = None  # cache_mark of this compile, once its inputs are known
        self.state = "eager" if mode == "off" or (mode == "auto" and not auto_compiles) else "start"
        self._report: Optional[dict] = None  # made by _finish, until take_report hands it over
        self._started: Optional[str] = None  # how the compile began, until take_started says so
        self._warm: Optional[threading.Thread] = None
        self._warm_s = 0.0
        self._warm_error: Optional[str] = None
        self._inputs: Optional[dict] = None  # the first minibatch's evaluate inputs, until the compile takes them
        self._switch_s = 0.0
        self._compiled = None
        self._times: dict = {"eager": [], "compiled": []}
        self._current = "eager"
        self._untimed = False

    # -- the learner's two calls ----------------------------------------------------------
    def before_step(self, mb: dict) -> None:
        if self.state == "start":
            self._take_inputs(mb)
        elif self.state == "warming" and (self._warm is None or not self._warm.is_alive()):
            self._switch()
        elif self.state == "timing" and self.mode == "auto":
            self._use("eager" if self._current == "compiled" else "compiled")

    def after_step(self, seconds: float) -> None:
        if self.state == "armed":
            self._start_warm()
            return
        if self.state != "timing":
            return
        if self._untimed:  # the first compiled call includes the learner's own compile
            self._untimed = False
            return
        self._times[self._current].append(seconds)
        timed = min(len(t) for t in self._times.values())
        if self.mode == "on" or (timed >= TIMED_STEPS and not self._close_call(timed)):
            self._decide()

    def _close_call(self, timed: int) -> bool:
        """Whether the judged ratio is within CLOSE_CALL of the bar with room left to
        time more (up to twice TIMED_STEPS a side)."""
        if timed >= 2 * TIMED_STEPS:
            return False
        ratio = statistics.median(self._times["compiled"]) / statistics.median(self._times["eager"])
        return abs(self._judged(ratio) - MAX_RATIO) < CLOSE_CALL

    def _judged(self, ratio: float) -> float:
        """The ratio `auto` decides on: the median of this run's and the prior's."""
        return statistics.median([*self.prior, ratio])

    def take_report(self) -> Optional[dict]:
        report, self._report = self._report, None
        return report

    def take_started(self) -> Optional[str]:
        """Once, after the step that started the compile: "background" or "in_place"."""
        started, self._started = self._started, None
        return started

    # -- stages -------------------------------------------------------------------------
    def _take_inputs(self, mb: dict) -> None:
        """A copy of the first minibatch's inputs, for the compile after its step."""
        self._inputs = {k: ({kk: vv.clone() for kk, vv in mb[k].items()} if isinstance(mb[k], dict)
                            else mb[k].clone()) for k in EVALUATE_INPUTS}
        self.state = "armed"

    def _start_warm(self) -> None:
        use_inductor_cache()
        inputs, self._inputs = self._inputs, None
        # Read here: a thread torch did not start may see its own default.
        threads = torch.get_num_threads()
        self._mark = cache_mark(self.setup_key, inputs, threads=threads, uniform_kl=self.uniform_kl)
        self.state = "warming"
        if cache_holds(self._mark):
            self._started = "in_place"  # before_step compiles at the next step
            return
        replica = copy.deepcopy(self.model)
        self._warm = threading.Thread(target=self._compile_replica, args=(replica, inputs, threads),
                                      name="fastrl: learner compile", daemon=True)
        self._warm.start()
        self._started = "background"

    def _compile_replica(self, replica: torch.nn.Module, inputs: dict, threads: int) -> None:
        """Thread: wait for the process that compiles the replica (compile_in_child)."""
        start = time.perf_counter()
        try:
            self._warm_error = compile_in_child(replica, inputs, self.uniform_kl, threads)
            set_cache_mark(self._mark, self._warm_error is None)
        except Exception as err:  # noqa: BLE001 - a model that does not pickle, no process to start: stay eager
            self._warm_error = short_error(err)
        self._warm_s = time.perf_counter() - start

    def _switch(self) -> None:
        if self._warm_error is not None:
            self._finish("eager", f"compiling failed ({self._warm_error})")
            return
        eager = type(self.model).evaluate.__get__(self.model)
        compiled = torch.compile(eager)

        def guarded(*args, **kwargs):
            # The replica compiled these very shapes, so this should not fail; if it
            # does, the rest goes eager and the next run compiles in the background.
            start = time.perf_counter()
            try:
                if self._untimed:  # the learner's own compile: seconds from the cache, a heartbeat kept
                    with beating(self.beat):
                        return compiled(*args, **kwargs)
                return compiled(*args, **kwargs)
            except Exception as err:  # noqa: BLE001
                set_cache_mark(self._mark, False)
                self._finish("eager", f"the learner's compiled call failed ({short_error(err)})")
                return eager(*args, **kwargs)
            finally:
                if self._untimed:
                    self._switch_s = time.perf_counter() - start

        self._compiled = guarded
        self.state = "timing"
        self._untimed = True
        self._use("compiled")

    def _use(self, which: str) -> None:
        self._current = which
        if which == "compiled":
            self.model.evaluate = self._compiled
        else:
            self.model.__dict__.pop("evaluate", None)

    def _decide(self) -> None:
        eager = statistics.median(self._times["eager"]) if self._times["eager"] else None
        compiled = statistics.median(self._times["compiled"])
        if self.mode == "on":
            self._finish("compiled", "asked for (--compile_learner on)", eager, compiled)
            return
        judged = self._judged(compiled / eager)
        if judged < MAX_RATIO:
            self._finish("compiled", "faster", eager, compiled, judged)
        else:
            self._finish("eager", f"not faster than eager (needs under {MAX_RATIO:.2f}x)", eager, compiled, judged)

    def _finish(self, chosen: str, why: str, eager: Optional[float] = None, compiled: Optional[float] = None,
                judged: Optional[float] = None) -> None:
        self.state = chosen
        self._use(chosen)
        if chosen == "eager":
            self._compiled = None  # and the compiled graphs with it
        self._report = {"chosen": chosen, "why": why, "eager_step_s": eager, "compiled_step_s": compiled,
                        "ratio": compiled / eager if eager and compiled else None, "judged_ratio": judged,
                        "prior_runs": len(self.prior) if judged is not None else 0,  # `on` and a failure judge nothing
                        "background_compile_s": round(self._warm_s, 2), "switch_s": round(self._switch_s, 2),
                        "in_place": self._warm is None and self._mark is not None}


def describe_compile(report: dict) -> str:
    """The line a run prints once the choice is made."""
    head = "the learner's step runs compiled" if report["chosen"] == "compiled" else "the learner's step stays eager"
    if report["compiled_step_s"] is None:  # the compile failed before any compiled step
        if report.get("in_place"):
            return f"{head}: {report['why']}, compiling from inductor's cache"
        return f"{head}: {report['why']}, after {report['background_compile_s']:.1f} s of compiling in the background"
    timed = f"{report['compiled_step_s'] * 1e3:,.0f} ms a step"
    if report["eager_step_s"]:
        timed += f" against eager's {report['eager_step_s'] * 1e3:,.0f} ({report['ratio']:.2f}x"
        runs = report.get("prior_runs", 0)
        if runs:
            timed += (f"; judged {report['judged_ratio']:.2f}x, the median with the {runs} earlier "
                      f"run{'s' if runs > 1 else ''} of this setup on this machine")
        timed += ")"
    if report.get("in_place"):
        return f"{head}, {report['why']}: {timed}; compiled from inductor's cache in {report['switch_s']:.1f} s"
    return (f"{head}, {report['why']}: {timed}; compiled in the background in {report['background_compile_s']:.1f} s, "
            f"then {report['switch_s']:.1f} s for the learner's first compiled call")
