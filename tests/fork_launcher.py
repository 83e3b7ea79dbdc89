"""Many short command lines, each run as `python -m fastrl.<command> ARGS` runs it,
without paying for a new interpreter and torch's import every time.

This process imports what the commands share once, then forks one child per command
line. The child takes the command's working folder, a process group of its own
(setsid) and output files, sets sys.argv, runs the module as __main__ (runpy, as
`-m` does) and exits with the code the interpreter would give, after the thread
joins, atexit handlers and stream flushes of a normal exit. What it skips is the interpreter's start-up,
torch's import and the teardown of the modules at exit; a failure there is for the
end-to-end tests that start real interpreters.

Why: test_bad_input's rows are each refused within a second of start-up, and
started as 77 fresh interpreters they took ~60 s of a 2-core machine: ~1.1 s each
importing torch and ~0.7 s tearing it down at exit.

Input, one JSON object on stdin:
    {"jobs": [{"module": "fastrl.train", "args": [...], "cwd": "..."}, ...],
     "parallel": 2, "timeout": 60}
Output, on stdout: a JSON list, one {"returncode", "stdout", "stderr", "seconds"}
per job, in order. The environment (PYTHONPATH, PYTHONDONTWRITEBYTECODE) is this process's, so
start it with the environment the command lines need.
"""
from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import sys
import tempfile
import threading
import time

# What the commands import on their way to refusing bad input; importing them here
# is the saving. Not fastrl.train / enjoy / bench / plot themselves: runpy warns (on
# stderr) when a module it runs as __main__ is already imported.
import gymnasium  # noqa: F401
import numpy  # noqa: F401
import torch  # noqa: F401

import fastrl.config  # noqa: F401
import fastrl.learning.checkpoint  # noqa: F401


def _run_child(job: dict, out_path: str, err_path: str) -> None:
    """In the forked child: become the command line, run it, and leave with its exit code."""
    os.setsid()
    os.chdir(job["cwd"])
    for fd, path in ((1, out_path), (2, err_path)):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    sys.path[0] = job["cwd"]  # where `python -m` puts the working folder
    sys.argv = [job["module"], *job["args"]]  # runpy replaces argv[0] with the module's file
    try:
        runpy.run_module(job["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:  # as the interpreter reads sys.exit's argument
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        sys.excepthook(*sys.exc_info())  # the traceback an uncaught exception prints
        code = 1
    _leave(code)


def _leave(code: int) -> None:
    """Exit as the interpreter does, but for tearing down its modules: 0.7 s with
    torch imported, most of a refused row's time. Non-daemon threads are joined,
    atexit handlers run and the streams flushed first, as at a normal exit."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _collect(pid: int, status: int, running: dict, results: dict) -> None:
    index, out_path, err_path, started, _ = running.pop(pid)
    with open(out_path) as out, open(err_path) as err:
        results[index] = {"returncode": os.waitstatus_to_exitcode(status), "stdout": out.read(),
                          "stderr": err.read(), "seconds": time.monotonic() - started}


def main() -> None:
    request = json.load(sys.stdin)
    jobs, parallel, timeout = request["jobs"], request.get("parallel", 2), request.get("timeout", 60)
    scratch = tempfile.mkdtemp(prefix="fork_launcher_")
    results: dict = {}
    running: dict = {}  # pid -> (job index, stdout path, stderr path, start, deadline)
    next_job = 0
    sys.stdout.flush()
    sys.stderr.flush()
    while next_job < len(jobs) or running:
        while next_job < len(jobs) and len(running) < parallel:
            out_path = os.path.join(scratch, f"{next_job}.out")
            err_path = os.path.join(scratch, f"{next_job}.err")
            pid = os.fork()
            if pid == 0:
                _run_child(jobs[next_job], out_path, err_path)
            started = time.monotonic()
            running[pid] = (next_job, out_path, err_path, started, started + timeout)
            next_job += 1
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            _collect(pid, status, running, results)
            continue
        for pid, (index, out_path, err_path, started, deadline) in list(running.items()):
            if time.monotonic() > deadline:  # not refused: it went on running
                os.killpg(pid, signal.SIGKILL)
                with open(err_path, "a") as err:
                    err.write(f"\n(still running after {timeout} s: not refused)")
                running[pid] = (index, out_path, err_path, started, float("inf"))
        time.sleep(0.01)
    for name in os.listdir(scratch):
        os.unlink(os.path.join(scratch, name))
    os.rmdir(scratch)
    json.dump([results[i] for i in range(len(jobs))], sys.stdout)


if __name__ == "__main__":
    main()
