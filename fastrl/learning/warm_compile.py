"""The process that fills inductor's cache with the learner's compiled step
(fastrl.learning.compiled), so that the learner's own compile, between two of its
steps, finds everything there.

    python -m fastrl.learning.warm_compile < payload

The payload, on stdin, is a `torch.save` of {"model", "inputs", "uniform_kl",
"threads"}: a replica of the learner's model, a copy of its first minibatch's
evaluate inputs, what the loss passes evaluate, and the learner's torch thread
count (inductor's cache keys on it). Nothing touches the disk but the cache.
Exit 0 when forward and backward compiled; otherwise the last line on stderr
says what failed.

Why a process and not a thread of the learner: FX's tracing, which AOTAutograd
runs on the forward and backward, swaps `torch.nn.Module.__call__` for the whole
process while it traces, so a module the learner called meanwhile in another
thread went into the tracer and failed (`NameError: module is not installed as a
submodule`: one CI run's learner died of it; a test here reproduces it in seconds).
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
