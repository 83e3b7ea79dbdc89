"""How much of this process's cores other programs took while it measured something.

A rate measured beside a package install or another job says more about them than
about fastrl, and a cache that keeps it steers every later run wrong. The kernel
counts each core's busy time (/proc/stat) and each process's CPU time; what the
cores spent beyond this process tree (steal from a VM's neighbours included) is
the other programs' share.
"""
from __future__ import annotations

import os
import time
from typing import NamedTuple, Optional

import psutil

from fastrl.plumbing.proc import usable_cores

# The most of the cores other programs may take before a measurement is not kept:
# a desktop's or a VM's background stays well under it, a second job is far over.
MAX_FOREIGN_SHARE = 0.1
# The kernel counts busy time in ticks of 10 ms a core: a shorter span says nothing.
MIN_SPAN_S = 0.5


class CpuSample(NamedTuple):
    at: float  # time.monotonic()
    busy_s: float  # CPU seconds the cores this process may use have spent busy
    ours_s: float  # CPU seconds of this process and every descendant, reaped ones included


def _cores_busy_s(cores: set, stat: str) -> Optional[float]:
    """Busy seconds of `cores` by /proc/stat: user, nice, system, irq, softirq and steal."""
    tick = os.sysconf("SC_CLK_TCK")
    busy = 0
    try:
        with open(stat) as fh:
            for line in fh:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
                    busy += user + nice + system + irq + softirq + steal
    except (OSError, ValueError):
        return None
    return busy / tick


def _tree_cpu_s(root: psutil.Process) -> float:
    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:  # it ended between the listing and the read
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def sample(pid: Optional[int] = None, stat: str = "/proc/stat") -> Optional[CpuSample]:
    """The busy time of the cores process `pid` may use (this process by default)
    and the CPU time of its tree, now; None where the kernel does not say."""
    try:
        cores = os.sched_getaffinity(pid or 0)
        root = psutil.Process(pid)
    except (AttributeError, OSError, psutil.Error):
        return None
    busy = _cores_busy_s(cores, stat)
    return None if busy is None else CpuSample(time.monotonic(), busy, _tree_cpu_s(root))


def foreign_cores(before: Optional[CpuSample], after: Optional[CpuSample]) -> Optional[float]:
    """Cores other programs kept busy on average between two samples; None where
    unknown, or the span too short to tell."""
    if before is None or after is None or after.at - before.at < MIN_SPAN_S:
        return None
    return max(0.0, (after.busy_s - before.busy_s) - (after.ours_s - before.ours_s)) / (after.at - before.at)


def disturbed(foreign: Optional[float], cores: int) -> bool:
    """Whether other programs took more than MAX_FOREIGN_SHARE of `cores`."""
    return foreign is not None and foreign > MAX_FOREIGN_SHARE * cores


def disturbed_since(before: Optional[CpuSample]) -> bool:
    """Whether other programs took more than MAX_FOREIGN_SHARE of this process's cores since `before`."""
    return disturbed(foreign_cores(before, sample()), usable_cores())
