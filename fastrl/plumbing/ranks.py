"""Where this process stands among the ranks of a torchrun launch, its share of the
machine, and the counters the ranks add up to.

Each torchrun rank is a whole fastrl run; only the learners talk to each other
(fastrl.plumbing.collectives). Without torchrun's variables, or with WORLD_SIZE 1, a
run is a run of one. Ranks on one machine split its cores (`claim_cores`) rather than
each planning for all of them.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional

if TYPE_CHECKING:
    import torch

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_SYS_CPU = "/sys/devices/system/cpu"


@dataclass(frozen=True)
class Rank:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    restarts: int = 0  # how many times torchrun restarted every rank (--max_restarts)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        """Rank 0 reports for the run: the status line, TensorBoard, W&B, checkpoints, summary.json."""
        return self.rank == 0

    def name(self) -> str:
        """'rank 1' in a multi-rank run, '' in a run of one: the prefix a rank's messages carry."""
        return f"rank {self.rank}" if self.distributed else ""


SOLO = Rank()


class RankError(ValueError):
    """torchrun's variables are incomplete or make no sense; the message says what to do."""


def detect_rank(environ: Optional[dict] = None) -> Rank:
    """This process's Rank, from torchrun's environment variables (SOLO without them)."""
    env = os.environ if environ is None else environ
    restarts = int(env.get("TORCHELASTIC_RESTART_COUNT", 0) or 0)
    if int(env.get("WORLD_SIZE", 1) or 1) <= 1:
        return Rank(restarts=restarts)
    missing = [name for name in TORCHRUN_VARS if not env.get(name)]
    if missing:
        raise RankError(f"WORLD_SIZE is {env['WORLD_SIZE']} but {', '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} not set; "
                        "start a multi-rank run with torchrun, or unset WORLD_SIZE to train alone.")
    rank = Rank(rank=int(env["RANK"]), world_size=int(env["WORLD_SIZE"]), local_rank=int(env["LOCAL_RANK"]),
                local_world_size=int(env["LOCAL_WORLD_SIZE"]), restarts=restarts)
    if not (0 <= rank.rank < rank.world_size and 0 <= rank.local_rank < rank.local_world_size <= rank.world_size):
        raise RankError(f"torchrun's variables are inconsistent ({rank}); launch through torchrun rather than "
                        "setting them by hand.")
    return rank


# --------------------------------------------------------------------------------------
# Each rank's share of the machine

def _physical_cores(cpus: List[int], sys_cpu: str = _SYS_CPU) -> List[List[int]]:
    """`cpus` grouped by the physical core they run on (hyperthread siblings together),
    groups in the order of their lowest cpu; one group per cpu where sysfs does not say."""
    groups: Dict[tuple, List[int]] = {}
    for cpu in cpus:
        try:
            with open(f"{sys_cpu}/cpu{cpu}/topology/physical_package_id") as fh:
                package = fh.read().strip()
            with open(f"{sys_cpu}/cpu{cpu}/topology/core_id") as fh:
                core = fh.read().strip()
            key = (package, core)
        except OSError:
            key = ("cpu", str(cpu))
        groups.setdefault(key, []).append(cpu)
    return sorted(groups.values(), key=min)


def core_share(cpus: List[int], physical: List[List[int]], local_rank: int, local_world_size: int) -> List[int]:
    """The cpus local rank `local_rank` of `local_world_size` takes: whole physical
    cores where there are enough, so two ranks never share a core's hyperthreads;
    else single cpus; else one cpu round-robin. Uneven counts give later ranks more."""
    n = local_world_size
    if len(physical) >= n:
        mine = physical[local_rank * len(physical) // n:(local_rank + 1) * len(physical) // n]
        return sorted(cpu for group in mine for cpu in group)
    if len(cpus) >= n:
        return cpus[local_rank * len(cpus) // n:(local_rank + 1) * len(cpus) // n]
    return [cpus[local_rank % len(cpus)]]


def rank_cpus(local_rank: int, local_world_size: int) -> List[int]:
    """This process's usable cpus that local rank `local_rank` takes (`core_share`)."""
    cpus = sorted(os.sched_getaffinity(0))
    return core_share(cpus, _physical_cores(cpus), local_rank, local_world_size)


def claim_cores(rank: Rank) -> Optional[List[int]]:
    """Confine this process and its future children to its rank's share of the cores,
    so the planner counts that share; call before the process server starts. Returns
    the cpus claimed, or None for the only rank on the machine or where unsupported."""
    if rank.local_world_size <= 1 or not hasattr(os, "sched_setaffinity"):
        return None
    share = rank_cpus(rank.local_rank, rank.local_world_size)
    try:
        os.sched_setaffinity(0, share)
    except OSError:
        return None  # a sandbox that forbids it: the ranks then share every core
    return share


# --------------------------------------------------------------------------------------
# What the ranks add up to

# Each counter the ranks sum, and the stats-board row prefix it is summed from.
SUMMED = {
    "env_frames": "rollout_",
    "episodes": "runner",
    "samples_trained": "learner",
    "samples_dropped": "learner",
    "env_restarts": "rollout_",
    "trajectories_discarded": "rollout_",
}


class RunTotals:
    """The run's counters summed over every rank and whether the ranks agreed to stop,
    in shared memory: the learner writes after each agreement, the runner and
    evaluator read. In a run of one, `run_count` reads the stats board instead."""

    def __init__(self):
        import torch  # here, not at the top: train.py reads the rank before torch is imported

        self._values = torch.zeros(len(SUMMED) + 1, dtype=torch.float64).share_memory_()

    def write(self, summed: torch.Tensor, stop_requested: bool) -> None:
        """summed: float64 [len(SUMMED)], in SUMMED's order."""
        self._values[:-1] = summed
        if stop_requested:
            self._values[-1] = 1.0

    def get(self, field: str) -> float:
        return float(self._values[list(SUMMED).index(field)])

    def stop_requested(self) -> bool:
        """Whether the ranks agreed to stop: the learner has left, or is leaving, the loop."""
        return bool(self._values[-1])


def local_counts(board) -> torch.Tensor:
    """This rank's SUMMED counters from its stats board, float64 [len(SUMMED)]."""
    import torch

    return torch.tensor([board.total(field, prefix) for field, prefix in SUMMED.items()], dtype=torch.float64)


def run_count(board, totals: Optional[RunTotals], field: str) -> float:
    """A SUMMED counter of the whole run: from `totals` in a multi-rank run, else the board."""
    return totals.get(field) if totals is not None else board.total(field, SUMMED[field])
