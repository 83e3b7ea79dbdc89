"""The process that fills inductor's cache with the learner's compiled step, so the
learner's own compile finds everything there: `python -m fastrl.learning.warm_compile
< payload`, the payload a torch.save of {"model", "inputs", "uniform_kl", "threads"}.
Exits 0 once forward and backward compiled, else says why on stderr's last line.

A process, not a learner thread: FX tracing swaps `torch.nn.Module.__call__` for the
whole process, so modules the learner called meanwhile went into the tracer and failed.
"""
from __future__ import annotations

import io
import os
import signal
import sys


def main() -> int:
    from fastrl.plumbing.proc import set_parent_death_signal

    # Killed with the learner that waits for it (SIGKILL: it holds nothing to clean up).
    set_parent_death_signal(signal.SIGKILL)
    expected_parent = int(sys.argv[1]) if len(sys.argv) > 1 else None
    if expected_parent is not None and os.getppid() != expected_parent:
        return 1  # the learner died before the death signal was set
    import torch

    from fastrl.plumbing.compiling import short_error

    payload = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=False)
    torch.set_num_threads(payload["threads"])
    torch.set_num_interop_threads(1)
    model, inputs = payload["model"], payload["inputs"]
    try:
        fn = torch.compile(model.evaluate)
        with torch.enable_grad():
            out = fn(inputs["obs"], inputs["rnn_state0"], inputs["episode_start"], inputs["actions"],
                     uniform_kl=payload["uniform_kl"])
            total = sum(t.float().sum() for t in out if t is not None and t.requires_grad)
            params = [p for p in model.parameters() if p.requires_grad]
            torch.autograd.grad(total, params, allow_unused=True)  # inductor compiles the backward on its first call
    except Exception as err:  # noqa: BLE001 - whatever inductor raises, the learner trains on eagerly
        print(short_error(err), file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
