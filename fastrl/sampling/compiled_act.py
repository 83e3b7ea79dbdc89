"""A rollout worker's forward (ActorCritic.act, `--inference local`) compiled with
torch.compile where that is faster: eager, much of an actor's forward is elementwise
passes (activations, the pixel z-score, copies) that inductor fuses
(compile_vs_eager in benchmarks/experiments/README.md).

1. the worker acts eagerly for START_AFTER_S, so the first batches and the learner's
   compile come first;
2. it compiles on the inputs of that call, blocking for seconds with a thread
   keeping its heartbeat;
3. it times eager and compiled forwards in turn and keeps the faster (compiled only
   below MAX_RATIO), or with `on` the compiled one.

Unlike the learner's, this compile runs in the worker itself: nothing runs beside it
that it could disturb, and a separate process would only add its start-up and a
second trace. Any error leaves the forward eager.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch

from fastrl.plumbing.compiling import MAX_RATIO, auto_compiles, beating, short_error, use_inductor_cache

# Seconds of acting before the compile starts (`auto`; `on` starts at once): past the
# first batch and the learner's compile, so as not to take their cores.
START_AFTER_S = 30.0
# Forwards timed each way, alternating, before `auto` decides.
TIMED_FORWARDS = 25
# The metrics message in which a rollout worker reports its choice to the runner.
ACT_COMPILE_KEY = "actor_compile"


def actors_compile(mode: str, images: bool, use_rnn: bool, device_type: str, inference: str,
                   acting_precision: str) -> bool:
    """Whether a rollout worker in `mode` tries the compile: local inference on a CPU
    only (policy workers' batch sizes vary, GPUs use CUDA graphs), and for `auto` the
    models the learner compiles, acting in fp32. bf16 acting refreshes its weight
    copies in Python, which the compiled graph guards on, so it recompiled at every
    weight reload."""
    if mode == "off" or inference != "local" or device_type != "cpu":
        return False
    return mode == "on" or (auto_compiles(images, use_rnn, device_type) and acting_precision == "fp32")


class CompiledAct:
    """Stands in for `model.act` and switches it between eager and compiled as the
    module docstring says. beat: keeps the worker's heartbeat while its compile
    blocks it; clock: the time source (tests drive it)."""

    def __init__(self, model: torch.nn.Module, mode: str, beat: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.perf_counter):
        if mode not in ("auto", "on"):
            raise ValueError(f"CompiledAct takes mode 'auto' or 'on' (with 'off' there is nothing to install), "
                             f"not {mode!r}")
        self.model, self.mode, self.beat, self.clock = model, mode, beat, clock
        self.eager = type(model).act.__get__(model)
        self.start_after_s = 0.0 if mode == "on" else START_AFTER_S
        self.state = "waiting"
        self._first_call: Optional[float] = None
        self._compile_s = 0.0
        self._compiled = None
        self._times: dict = {"eager": [], "compiled": []}
        self._report: Optional[dict] = None
        model.act = self

    def __call__(self, obs: dict, rnn_state: torch.Tensor, deterministic: bool = False):
        if self.state == "compiled":
            return self._call_compiled(obs, rnn_state, deterministic)
        if self.state == "waiting":
            now = self.clock()
            self._first_call = now if self._first_call is None else self._first_call
            if now - self._first_call >= self.start_after_s:
                return self._switch(obs, rnn_state, deterministic)
        elif self.state == "timing":
            return self._timed(obs, rnn_state, deterministic)
        return self.eager(obs, rnn_state, deterministic)

    def take_report(self) -> Optional[dict]:
        """The report of the choice (a dict for the run's summary), once, when made."""
        report, self._report = self._report, None
        return report

    # -- stages -------------------------------------------------------------------------
    def _switch(self, obs: dict, rnn_state: torch.Tensor, deterministic: bool):
        """The worker's compile, on this call's inputs; its output is this call's."""
        use_inductor_cache()
        self._compiled = torch.compile(self.eager)
        self.state = "compiling"
        start = self.clock()
        with beating(self.beat):
            out = self._call_compiled(obs, rnn_state, deterministic)
        self._compile_s = self.clock() - start
        if self.state == "eager":  # the compiled call failed (_call_compiled finished eager)
            return out
        if self.mode == "on":
            self._finish("compiled", "asked for (--compile_actors on)")
        else:
            self.state = "timing"
        return out

    def _call_compiled(self, obs: dict, rnn_state: torch.Tensor, deterministic: bool):
        try:
            return self._compiled(obs, rnn_state, deterministic)
        except Exception as err:  # noqa: BLE001 - whatever inductor raises, the worker acts on eagerly
            self._finish("eager", f"compiling failed ({short_error(err)})" if self.state == "compiling"
                         else f"the worker's compiled forward failed ({short_error(err)})")
            return self.eager(obs, rnn_state, deterministic)

    def _timed(self, obs: dict, rnn_state: torch.Tensor, deterministic: bool):
        which = "compiled" if len(self._times["compiled"]) <= len(self._times["eager"]) else "eager"
        start = self.clock()
        out = self._call_compiled(obs, rnn_state, deterministic) if which == "compiled" else \
            self.eager(obs, rnn_state, deterministic)
        if self.state != "timing":  # the compiled call failed
            return out
        self._times[which].append(self.clock() - start)
        if min(len(t) for t in self._times.values()) >= TIMED_FORWARDS:
            self._decide()
        return out

    def _decide(self) -> None:
        eager = statistics.median(self._times["eager"])
        compiled = statistics.median(self._times["compiled"])
        if compiled / eager < MAX_RATIO:
            self._finish("compiled", "faster", eager, compiled)
        else:
            self._finish("eager", f"not faster than eager (needs under {MAX_RATIO:.2f}x)", eager, compiled)

    def _finish(self, chosen: str, why: str, eager: Optional[float] = None,
                compiled: Optional[float] = None) -> None:
        self.state = chosen
        if chosen == "eager":
            self._compiled = None  # and the compiled graphs with it
        self._report = {"chosen": chosen, "why": why, "eager_forward_s": eager, "compiled_forward_s": compiled,
                        "ratio": compiled / eager if eager and compiled else None,
                        "compile_s": round(self._compile_s, 2)}


def describe_actor_compiles(reports: list) -> str:
    """The line a run prints once every rollout worker has chosen, from their reports."""
    compiled = [r for r in reports if r["chosen"] == "compiled"]
    head = (f"the rollout workers' forward runs compiled in {len(compiled)} of {len(reports)}"
            if compiled else f"the rollout workers' forward stays eager in all {len(reports)}")
    timed = [r for r in reports if r["ratio"] is not None]
    if timed:
        eager = statistics.median(r["eager_forward_s"] for r in timed)
        comp = statistics.median(r["compiled_forward_s"] for r in timed)
        head += f": {comp * 1e3:.1f} ms a forward against eager's {eager * 1e3:.1f} ({comp / eager:.2f}x, medians)"
    reasons = sorted({r["why"] for r in reports})
    return f"{head}; {', '.join(reasons)}"
