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
    """Start the forkserver every child is forked from, and return its context.

    A child must inherit no threads, locks or CUDA state from the runner
    (docs/design.md), which rules out fork; the forkserver gives that and imports
    torch once for all children, overlapping the runner's own start-up.
    """
    import multiprocessing
    import multiprocessing.forkserver as forkserver

    forkserver.set_forkserver_preload(_PRELOAD)
    # Launched with SIGINT ignored, the server and every child it forks keep it ignored,
    # so a Ctrl-C during start-up cannot kill a child before init_child (which the
    # runner would take for a crash). The runner blocks SIGINT meanwhile so that such a
    # Ctrl-C stays pending for it.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return multiprocessing.get_context("forkserver")


def stop_process_server() -> None:
    """End the process server now, for a run refused before any child was forked;
    left alone it would keep importing torch (and hold pipes open) for seconds after
    the runner returned. `_stop` is multiprocessing's own; the SIGKILL first spares
    waiting for those imports."""
    import multiprocessing
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None or not hasattr(server, "_stop"):
        return
    if multiprocessing.active_children():  # forked children die with the server (parent-death signal)
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    server._stop()


class Interrupted(BaseException):
    """Raised inside a child told to stop by a signal. A BaseException, so that no
    `except Exception` on the way swallows it."""


def _raise_interrupted(signum, frame):
    # Once: a second SIGTERM (runner and runner watch may both send one) must not cut
    # short the cleanup the first started.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(f"signal {signum}")


# How long an orphaned child may take to unwind before it kills itself: as long as
# the runner waits for a learner writing its final checkpoint.
ORPHAN_GRACE_S = 60.0


def set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send `sig` to this process when its parent dies; a no-op elsewhere."""
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
    """Close this child's copy of the process server's "alive" pipe, so the server
    (every child's parent) exits when the runner dies and the parent-death signals
    fire. Private multiprocessing names; without them only the runner watch guards."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None:  # a spawned child: its parent is the runner itself
        return
    os.close(fd)
    server._forkserver_alive_fd = None


def die_with_runner() -> None:
    """End this process when the runner dies, however it dies, even if stopped.

    A thread waits on the runner's sentinel, SIGTERMs this process so it unwinds
    (the learner writes its final checkpoint), and SIGKILLs it ORPHAN_GRACE_S later.
    The parent-death signal is SIGCONT, which wakes a stopped child so its thread can
    run; a parent-death SIGKILL would race the learner's checkpoint.
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
    """SIGCONT every descendant (ViZDoom's engines among them): a stopped process
    keeps SIGTERM pending and can leave only once continued."""
    import psutil

    for process in psutil.Process().children(recursive=True):
        try:
            process.resume()
        except psutil.Error:
            pass  # it ended since it was listed


def use_batch_scheduling(nice: int = 0) -> None:
    """Make this process and what it starts from now on SCHED_BATCH (and `nice` it):
    the rollout workers' and engines' frequent wakeups then stop preempting the
    learner mid-GEMM. Same CPU share, fewer cache-thrashing preemptions; the planner
    sets `nice` (planner.worker_nice). A no-op where unsupported."""
    if not (hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH")):
        return
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        if nice:
            os.nice(nice)
    except OSError:
        pass  # a sandbox that forbids it: the default policy only costs throughput


def launched_at() -> float:
    """When this process started, on the time.time() clock. Computed from uptime,
    as psutil's create_time rounds the boot time to whole seconds."""
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
    """Run this process and what it starts from now on on the index-th (round-robin)
    usable core, so ViZDoom's engines wake on the worker's core rather than take an
    interrupt to wake another (costly on a VM). A no-op where unsupported."""
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
    """Call first thing in every spawned child. Ctrl-C is ignored (the runner orders
    the shutdown, so the learner still checkpoints); SIGTERM unwinds the child."""
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
    """Entry point of every child: seed torch (None keeps the inherited state), run
    `target(*args)`, and on an exception send (name, traceback, sentence) to the runner
    and exit non-zero. `sentence` is the exception's own text when it is `explained`
    (a full disk: the traceback would say nothing more), else ""."""
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
    except BaseException as err:  # report everything, including SystemExit from deep inside an env
        sentence = str(err) if getattr(err, "explained", False) else ""
        try:
            put_many_polling(error_queue, [(name, traceback.format_exc(), sentence)], 1.0)
        except Exception:
            print(f"fastrl: {name} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
        sys.exit(1)
