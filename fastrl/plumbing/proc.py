"""What every fastrl child process does first and last: name itself, bound its
threads, die with its parent, and report its own death with a traceback."""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
import traceback

from fastrl.plumbing.polling import put_many_polling

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
    # Ctrl-C reaches every process of the terminal's group. A child forked from the
    # server starts with the server's SIGINT handler, Python's, and ignores SIGINT
    # only once init_child runs; one hit in between (a Ctrl-C during start-up) died
    # silently with exit code 1, which the runner took for a crash (and restarted
    # from, with --max_restarts). Launched with SIGINT ignored, the server keeps it
    # ignored (Python installs its handler only over the default action), and so
    # does every child it forks. Meanwhile the runner blocks SIGINT too, so that a
    # Ctrl-C during the launch stays pending for it rather than being dropped (Linux
    # keeps a blocked signal pending whatever its action).
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return multiprocessing.get_context("forkserver")


def stop_process_server() -> None:
    """End the process server now, for a run refused after start_process_server (a
    checkpoint that does not fit the model, an experiment to resume with other
    options): no child was forked yet.

    Left alone, the server notices that its runner is gone only once its imports are
    done. A run refused before then (one whose caller had imported torch already is
    refused within half a second) left it importing torch, a core's work, for
    seconds after returning, and a reader of a pipe it held open (`| tee`) waiting
    as long. `_stop` is multiprocessing's own (CPython 3.8 to 3.13; it closes the
    "alive" pipe, reaps the server and removes its socket); the SIGKILL before it
    spares the wait for those imports."""
    import multiprocessing
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None or not hasattr(server, "_stop"):
        return
    if multiprocessing.active_children():  # a child forked from the server dies with it (its parent-death signal)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    server._stop()


class Interrupted(BaseException):
    """Raised inside a child when it is told to stop by a signal. A BaseException,
    like KeyboardInterrupt, so that no `except Exception` on the way swallows it."""


def _raise_interrupted(signum, frame):
    # Once: a second SIGTERM (the runner's and the runner watch's may both come)
    # must not cut short the cleanup the first one started.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(f"signal {signum}")


# How long a child whose runner died may take to unwind before it kills itself:
# as long as a runner waits for its learner, which may be writing the final
# checkpoint of a large model (runner.LEARNER_JOIN_TIMEOUT_S).
ORPHAN_GRACE_S = 60.0


def set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send `sig` to this process when its parent dies. A no-op
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


def let_process_server_end_with_runner() -> None:
    """Close this child's copy of the process server's "alive" pipe, the pipe whose
    closing tells the server that its runner is gone.

    multiprocessing hands every forkserver child a copy, so that the child could
    start processes through the server too (fastrl's children never do). With those
    copies the server, the parent of every child, outlived the runner for as long
    as any child lived, so no child's parent-death signal fired while a sibling, or
    the child itself, was still there: a stopped child kept itself and the server
    alive for good. With the runner's the only copy left, the server exits the
    moment the runner dies, however it dies. The names are multiprocessing's own
    (CPython 3.8 to 3.13); where they are missing nothing is closed and only the
    runner watch guards (die_with_runner)."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None:  # a spawned child (the planner's env benchmark): its parent is the runner itself
        return
    os.close(fd)
    server._forkserver_alive_fd = None


def die_with_runner() -> None:
    """End this process when the runner dies, however it dies (even SIGKILL), and
    even if this process is stopped (SIGSTOP) at that moment.

    One blocked thread waits on the runner's sentinel, which multiprocessing gives
    every child and which closes exactly when the runner dies, and then SIGTERMs
    this process: it unwinds through its finally blocks, so the learner still
    writes its final checkpoint and a rollout worker closes its envs. Should that
    unwinding hang (an env whose close never returns, a collective waiting on a
    dead rank), the thread SIGKILLs the process ORPHAN_GRACE_S later, as the
    runner would have: nobody else is left to.

    A stopped process runs no thread and keeps a SIGTERM pending; only SIGCONT and
    SIGKILL act on it. So the parent-death signal, which the kernel sends when the
    process server dies with the runner (let_process_server_end_with_runner), is
    SIGCONT: harmless to a running child, it wakes a stopped one, whose watch
    thread then ends it like any other. A parent-death SIGKILL would also reach a
    stopped child, but it would race every child's unwinding and lose the
    learner's final checkpoint each time the runner is killed.
    """
    import multiprocessing
    import multiprocessing.connection
    import threading

    runner = multiprocessing.parent_process()
    if runner is None:
        return
    let_process_server_end_with_runner()
    set_parent_death_signal(signal.SIGCONT)

    def watch():
        multiprocessing.connection.wait([runner.sentinel])
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(ORPHAN_GRACE_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="runner-watch", daemon=True).start()


def continue_descendants() -> None:
    """SIGCONT every process this one started, and every one they started (ViZDoom's
    engines among them): a stopped process sees no stop flag and keeps a SIGTERM
    pending, and only once continued can it leave as a running one does. A no-op
    for a process that is not stopped."""
    import psutil

    for process in psutil.Process().children(recursive=True):
        try:
            process.resume()
        except psutil.Error:
            pass  # it ended since it was listed


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


def launched_at() -> float:
    """When this process started, on the time.time() clock.

    psutil's create_time adds the start's ticks since boot to the boot time, which
    /proc/stat gives in whole seconds: on this project's machine it read 0.82 s
    early, so every "seconds from launch" it fed was that much too long. The age
    of the process, read as uptime (10 ms steps) less its start's ticks, has no
    such rounding."""
    try:
        with open("/proc/self/stat") as fh:
            start_ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return time.time() - (uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):  # not Linux
        import psutil

        return psutil.Process().create_time()


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
    runner watch once the runner is gone) unwinds the child through its finally
    blocks.
    """
    try:
        import setproctitle

        setproctitle.setproctitle(f"fastrl: {name}")
    except ImportError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_interrupted)
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
            put_many_polling(error_queue, [(name, traceback.format_exc())], 1.0)
        except Exception:
            print(f"fastrl: {name} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        sys.exit(1)
