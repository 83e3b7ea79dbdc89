"""Whether a run's shared memory fits /dev/shm. Trajectory buffers and each ViZDoom game's
screen buffers live there; a container's default of 64 MB fails a Doom run with SIGBUS or
a bare allocation error minutes in, so start-up compares the need with the free space."""
from __future__ import annotations

import os
from typing import NamedTuple, Optional

from fastrl.plumbing import files

SHM_DIR = "/dev/shm"
# The queues (runner.py sizes them: ~9 MB for one policy and a few workers) and the stats board.
OTHER_BYTES = 16 << 20
MB = 1 << 20


def free_bytes(path: str = SHM_DIR) -> Optional[int]:
    """Free bytes of the shared-memory mount; None where there is none (not Linux)."""
    if not os.path.isdir(path):
        return None
    try:
        return files.free_bytes(path)
    except OSError:
        return None


class SharedMemoryNeed(NamedTuple):
    buffers: int  # trajectory buffers
    envs: int  # how many envs the run makes
    per_env: int  # what one env keeps there (measured: the free space before and after making one)
    weights: int  # published weights, all policies


def shortfall(need: SharedMemoryNeed, free: Optional[int]) -> str:
    """One sentence saying why the run cannot fit, or "" when it can (or nothing can tell)."""
    total = need.buffers + need.envs * need.per_env + need.weights + OTHER_BYTES
    if free is None or total <= free:
        return ""
    envs = f" and {need.envs} envs at {need.per_env / MB:.1f} MB each" if need.per_env else ""
    return (f"This run needs about {total / MB:,.0f} MB of shared memory ({SHM_DIR}: {need.buffers / MB:,.0f} MB of "
            f"trajectory buffers{envs}) but {SHM_DIR} has {free / MB:,.0f} MB free; give it more (in a container, "
            f"docker run --shm-size={_suggested_gb(total)}g) or run fewer envs (--num_workers, --num_envs_per_worker).")


def _suggested_gb(total: int) -> int:
    return max(1, -(-2 * total // (1 << 30)))  # twice the need, in whole GB
