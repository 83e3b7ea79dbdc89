"""What every fastrl child process does first and last: name itself, bound its
threads, die with its parent, and report its own death with a traceback."""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import traceback

_PR_SET_PDEATHSIG = 1

# What the process server imports once, before it forks any child.
_PRELOAD = ["torch", "fastrl.sampling.rollout_worker", "fastrl.learning.learner", "fastrl.sampling.policy_worker",
            "fastrl.runtime.sink", "fastrl.learning.evaluator"]


def start_process_server():
    """Start the forkserver that every child is forked from, and return its context.

    A child must inherit no threads, locks or CUDA state from the busy runner
    (docs/design.md), which rules out a plain fork and is what spawn gives. The
    forkserver keeps that (it is a fresh, single-threaded interpreter that only
    imports) and pays the ~2 s import of torch once instead of once per child. Called first thing in main, it imports
    on the other core while the runner imports and checks the config: measured
    here, a CartPole run's start-to-finish time fell from 5.9 s to 3.9 s.
    """
    import multiprocessing
    import multiprocessing.forkserver as forkserver

    forkserver.set_forkserver_preload(_PRELOAD)
    forkserver.ensure_running()
    return multiprocessing.get_context("forkserver")


class Interrupted(BaseException):
    """Raised inside a child when it is told to stop by a signal. A BaseException,
    like KeyboardInterrupt, so that no `except Exception` on the way swallows it."""


def _raise_interrupted(signum, frame):
    # Once: a second SIGTERM (the parent-death signal arriving after the runner
    # watch's) must not cut short the cleanup the first one started.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(f"signal {signum}")


def set_parent_death_signal(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send `sig` to this process when its parent dies, so that a
    SIGKILL'd runner never leaves workers (and their Doom games) behind. A no-op
    elsewhere: there the runner's own shutdown path is the only guard."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os.kill(os.getpid(), sig)


def die_with_runner() -> None:
    """SIGTERM this process when the runner dies, however it dies (even SIGKILL).

    The parent-death signal alone is not enough: a forkserver child's parent is
    the forkserver, and the forkserver outlives the runner for as long as any
    child lives (each child holds a copy of the pipe whose closing would tell
    it the runner is gone). The runner's own sentinel, which multiprocessing
    gives every child, closes exactly when the runner dies; one blocked thread
    waits on it and costs nothing until then.
    """
    import multiprocessing
    import multiprocessing.connection
    import threading

    runner = multiprocessing.parent_process()
    if runner is None:
        return

    def watch():
        multiprocessing.connection.wait([runner.sentinel])
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="runner-watch", daemon=True).start()


def use_batch_scheduling(nice: int = 0) -> None:
    """Tell Linux this process, and every process it starts from now on (ViZDoom's
    engines among them), is batch work: its wakeups stop preempting whatever runs,
    and with `nice` above 0 its share of a contended core shrinks too.

    A rollout worker and its engines wake hundreds of times a second (each env step
    is a round trip to an engine), and under the default policy every wakeup may
    preempt the learner mid-GEMM, the costliest and usually the bottleneck process,
    throwing out its caches. Batch tasks get the same share of CPU but wait for the
    next tick to run. Measured on doom_battle, 2 workers x 16 envs on 2 cores, four
    pairs of 100-s runs: 3,864 env frames/s on average against 3,659 without, ahead
    in every pair (+1.5% to +12.7%). The share is the planner's to set (see
    planner.worker_nice). A no-op where the policy does not exist."""
    if not (hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH")):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        if nice:
            os.nice(nice)
    except OSError:
        pass  # a sandbox that forbids it: the default policy only costs throughput


def usable_cores() -> int:
    """Cores this process may run on (a container or taskset may allow fewer than exist)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def pin_to_core(index: int) -> None:
    """Run this process, and every process it starts from now on, on the index-th
    (round-robin) of the cores it may use. A no-op where affinity cannot be set.

    What pinning a rollout worker buys: each env step of ViZDoom is a hand-off to the
    engine's process and back. Left to Linux, the engine often wakes on the other
    core, and waking an idle core is an interrupt that, on a VM, goes through the
    hypervisor. Measured here, one process stepping 4 doom_battle envs, 5-s windows:
    632-753 us a step pinned with its engines against 915-1,061 us unpinned."""
    try:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[index % len(cores)]})
    except (AttributeError, OSError):
        pass  # not Linux, or a sandbox that forbids it: only throughput is lost


@contextlib.contextmanager
def on_one_core(enabled: bool = True):
    """Within the block, run this process (and what it starts) on one core, as a
    pinned rollout worker runs; afterwards on the cores it had."""
    if not (enabled and hasattr(os, "sched_getaffinity")):
        yield
        return
    before = os.sched_getaffinity(0)
    pin_to_core(0)
    try:
        yield
    finally:
        try:
            os.sched_setaffinity(0, before)
        except OSError:
            pass  # a sandbox that forbids it: pin_to_core could not have pinned either


def init_child(name: str, torch_threads: int) -> None:
    """Call first thing in every spawned child.

    Ctrl-C reaches every process of the terminal's group at once; children
    ignore it and let the runner order the shutdown, so that the learner can
    still write its final checkpoint. SIGTERM (from the runner, or from the
    parent-death signal) unwinds the child through its finally blocks.
    """
    try:
        import setproctitle

        setproctitle.setproctitle(f"fastrl: {name}")
    except ImportError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    set_parent_death_signal(signal.SIGTERM)
    die_with_runner()
    import torch

    torch.set_num_threads(torch_threads)
    torch.set_num_interop_threads(1)


def run_child(name: str, torch_threads: int, seed: int | None, error_queue, target, *args) -> None:
    """Entry point of every child: seed torch with `seed` (see fastrl.plumbing.seeding; None
    leaves it as inherited), run `target(*args)`, and if it raises, send (name,
    traceback) to the runner and exit non-zero."""
    from fastrl.plumbing.timeline import mark

    mark(f"{name} started")
    init_child(name, torch_threads)
    if seed is not None:
        import torch

        torch.manual_seed(seed)
    try:
        target(*args)
    except Interrupted:
        pass
    except BaseException:  # report everything, including SystemExit from deep inside an env
        try:
            error_queue.put((name, traceback.format_exc()), block=True, timeout=1.0)
        except Exception:
            print(f"fastrl: {name} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        sys.exit(1)
