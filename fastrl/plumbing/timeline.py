"""Where a run's start-up seconds go, for benchmarks/startup.py.

With FASTRL_TIMELINE=PATH in the environment, every process of a run appends one
line per `mark` to PATH: wall time, pid, event. Off (the default), a mark costs one
dict lookup. A file rather than a queue: the marks that matter come before any
queue exists (imports, the profile) and from processes the runner does not talk
to yet, and lines under PIPE_BUF appended with O_APPEND never interleave.
"""
from __future__ import annotations

import os
import time

ENV_VAR = "FASTRL_TIMELINE"


def mark(event: str) -> None:
    """Note that `event` happened now in this process, when a timeline is asked for."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return
    line = f"{time.time():.6f}\t{os.getpid()}\t{event}\n".encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return  # a timeline that cannot be written must not stop a run
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read(path: str) -> list:
    """The marks in `path` as (wall time, pid, event), in time order."""
    marks = []
    with open(path) as fh:
        for line in fh:
            t, pid, event = line.rstrip("\n").split("\t", 2)
            marks.append((float(t), int(pid), event))
    return sorted(marks)
