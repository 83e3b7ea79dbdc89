"""A rollout worker's forward (ActorCritic.act, `--inference local`) compiled with
torch.compile where that measures faster.

Eager, an actor's forward spends a third of its time outside the matrix products:
doom_battle's at 32 samples on one thread of an Intel Xeon (family 6 model 207)
took 261 us a sample, of which the convolutions' ELUs 38 (expm1, one pass each),
the pixel z-score's subtract, multiply and clamp ~21 and copies ~16. Inductor
fuses each of those into one pass over the activations: the compiled forward
took 231 us against eager's 281 in the same interleaved rounds (0.82x), 9.9
against 12.7 ms a forward inside a run; doom_battle at 2 x 32 (150-s runs,
alternating with --compile_actors off, two rounds) trained 1,312 and 1,312
samples/s against 1,267 and 1,271 (benchmarks/README.md, forty-first session).

The cost is the compile, paid by the worker that acts, so:

1. the worker acts eagerly for START_AFTER_S seconds: the run's first batches,
   and the learner's own compile, come first;
2. then it compiles its forward on the inputs of that call, which blocks it for
   seconds (2-4 s on 2 cores with inductor's cache warm: the first compile in a
   process sets up dynamo and inductor; ~11 s cold), with a thread keeping its
   heartbeat;
3. it times eager and compiled forwards in turn, TIMED_FORWARDS each, and keeps
   the faster (compiled only below MAX_RATIO of eager's time), or with `on` the
   compiled one, untimed.

Unlike the learner's, this compile runs in the worker itself, not first in a
process of its own: on cores that every process keeps busy a blocked worker's
core goes to its compile, and a process of its own only added its start (~2 s of
a core for the interpreter and torch) and a second trace of the forward: in a
doom_battle run (2 x 32, inductor's cache warm) the two workers' compiles done
that way held the run at 1,800-2,600 env frames/s for 20 s, against ~5,000;
compiling in themselves (2.3 and 2.8 s each) they cost one 5-s status window.
The learner compiles apart because a thread compiling beside its steps broke
them (fastrl/learning/warm_compile.py); here nothing runs beside the compile.

Any error (no C++ compiler, an op inductor cannot lower) leaves the forward eager
and the report says why. A restarted worker starts from step 1 again, with the
cache warm.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch

from fastrl.plumbing.compiling import MAX_RATIO, auto_compiles, beating, short_error, use_inductor_cache

# Seconds of acting before the compile starts (with `auto`; `on` starts at once).
# doom_battle's first batch comes ~10 s after launch on 2 cores and the learner's
# compile runs for ~15 s after it; the workers' compiles, started later, take
# neither's cores.
START_AFTER_S = 30.0
# Forwards timed each way, alternating, before `auto` decides: 50 doom_battle
# forwards at 32 samples are ~0.5 s of a worker's time. In runs on 2 busy cores a
# worker's compiled median came out 17-22% under its eager one.
TIMED_FORWARDS = 25
# The metrics message in which a rollout worker reports its choice to the runner.
ACT_COMPILE_KEY = "actor_compile"


def actors_compile(mode: str, images: bool, use_rnn: bool, device_type: str, inference: str,
                   acting_precision: str) -> bool:
    """Whether a rollout worker in `mode` tries the compile at all. `auto`: local
    inference on a CPU, for the models the learner compiles (an image encoder and a
    GRU), acting in fp32. bf16 acting keeps weight copies that the forward refreshes
    in Python when the weights move (ConvEncoder._bf16_layers), which the compiled
    graph guards on: a weight reload recompiled it (1.85 s), and compiled it took
    515 us a sample against eager's 409 on an Intel Xeon. Policy workers' batches
    change size from one forward to the next, and a GPU's acting already runs as
    CUDA graphs: `on` compiles only local CPU inference too."""
    if mode == "off" or inference != "local" or device_type != "cpu":
        return False
    return mode == "on" or (auto_compiles(images, use_rnn, device_type) and acting_precision == "fp32")


class CompiledAct:
    """Stands in for `model.act` (installed on the instance) and switches it between
    eager and compiled as the module's docstring says.

    beat: called every BEAT_EVERY_S (plumbing/compiling.py) while the worker's own
    compile blocks it (the supervisor restarts a worker silent for
    --worker_timeout_seconds). clock: the time source (tests drive it)."""

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
