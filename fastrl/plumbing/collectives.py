"""The learners of a multi-rank run acting as one: joining torch.distributed's process
group, and the few collectives that keep every rank's weights bit-identical.

What must be identical, and how each is kept so:
- the gradient: each rank's is all-reduced into the mean over every rank's valid
  samples (one flat all-reduce per gradient step), before clipping, so that every
  rank clips the same vector by the same norm and Adam takes the same step;
- every decision that changes a step: whether it is skipped for a non-finite loss,
  the frame count a linear schedule reads, whether to stop: each is taken from
  all-reduced values, never from one rank's own, or the ranks would part ways, and
  the next collective would pair one rank's gradient with another's stop;
- the normalisers' statistics: each update folds in the moments of every rank's
  batch (RunningNorm.update's `reduce`), rather than copying rank 0's;
- the start: rank 0's weights are broadcast, and the checkpoint resumed from, the
  model's size and the options are checked equal on every rank.

Trade-offs:
- one flat all-reduce after the backward pass, not DistributedDataParallel: DDP
  overlaps the all-reduce with the backward pass bucket by bucket, but it wraps the
  module that the learner's unroll and the profiler call directly, and the skip
  decision has to ride in the same collective anyway. What the overlap would save
  is the all-reduce's share of a step, which benchmarks/scale_out.py measures;
- collectives are matched by their order, not by a name: every rank must call the
  same ones in the same order. So the learner asks the others once per batch
  (`agree`) before it trains, and a rank that wants to stop says so there instead
  of leaving, which would leave the others waiting in a collective it never joins;
- a collective waits for the slowest rank, so the learners move in lockstep at the
  pace of the slowest rank's batches. The stats board's `sync_s` counts the seconds
  spent in collectives, waiting included. A rank that died breaks the others'
  collective at once (its sockets close); one that hangs does so after
  --dist_timeout_seconds.
"""
from __future__ import annotations

import datetime
import hashlib
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from fastrl.plumbing.ranks import Rank
from fastrl.plumbing.stats_board import BoardRow, Timer

# How long a learner waits in a collective before it looks at its signals again.
WAIT_SLICE = datetime.timedelta(seconds=0.2)


def _wait_taking_signals(work) -> None:
    """Wait for a collective in slices, running this process's signal handlers
    between them; raise its error, if it had one.

    A thread blocked in one whole wait runs no Python signal handler: a learner
    whose peer died without Gloo noticing (it was stopped by SIGSTOP as the peer
    went) ignored its runner's SIGTERM until the collective's 60-s timeout and
    outlived torchrun (tests/test_distributed.py, 2 of 5 runs). A slice that ends
    first raises without cancelling the work, and the next picks it up; one that
    ends with the work wakes at once, so the all-reduce costs what a blocking one
    does (2.09-2.15 against 2.18-2.61 ms on loopback, 2 processes on 2 cores,
    where polling it every 0.1 ms looked 12% slower in a 2-rank CartPole run).
    A slice's "Operation timed out!" may come just as the work completes: so a
    completed work's own outcome decides, not the slice's error. Re-raising that
    error instead stopped 2 of 6 two-rank doom_battle runs on 2 cores, a rank
    leaving an all-reduce that had succeeded while its peer went on to the next
    collective (benchmarks/README.md, twenty-ninth session).
    Gloo only: NCCL's wait with a timeout aborts the communicator when it runs out."""
    while True:
        try:
            work.wait(WAIT_SLICE)
            return
        except RuntimeError:
            if work.is_completed():
                # Done: returns at once if it succeeded, raises its own error if not
                # (never blocking past a slice, whatever the backend's wait does).
                work.wait(WAIT_SLICE)
                return


class PeerError(RuntimeError):
    """The other ranks could not be reached, or they disagree; the message says what to do."""


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the model's parameters and buffers, in state_dict order: equal on two
    ranks exactly when their weights are bit-identical."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def attempt_store(rank: Rank, timeout: datetime.timedelta) -> dist.Store:
    """The key-value store the ranks meet in (torchrun's, at MASTER_ADDR:MASTER_PORT),
    its keys under a prefix of this torchrun attempt.

    torchrun keeps one store for every attempt of a job (--max_restarts), while
    init_process_group's own env:// store assumes a new one per attempt and writes
    each rank's Gloo address under the same key every time: a restarted rank then
    read its dead predecessor's address, and failed to connect ('Connection
    refused', torch 2.13). Keys prefixed by the restart count keep attempts apart.
    Where torchrun's agent does not serve the store (TORCHELASTIC_USE_AGENT_STORE
    unset, as with a launcher that only sets MASTER_ADDR and MASTER_PORT), rank 0
    serves it, as env:// would."""
    agent_serves = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank.world_size,
                          is_master=not agent_serves and rank.main, timeout=timeout, multi_tenant=True)
    return dist.PrefixStore(f"fastrl/attempt_{rank.restarts}", store)


class Peers:
    """This learner's membership in the run's process group. Construct it in the
    learner process (it reads torchrun's MASTER_ADDR and MASTER_PORT from the
    environment); every method is a collective that every rank must call in the same
    order. Seconds spent in them go to `row`'s sync_s."""

    def __init__(self, rank: Rank, backend: str, timeout_s: float, device: torch.device, row: BoardRow):
        self.rank, self.device = rank, device
        self._timer = Timer(row)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's object collectives use the current device
        # The Gloo all-reduce being waited on (None once its wait returns): one still
        # incomplete when the learner leaves was abandoned, a signal raised out of its
        # sliced wait. (Not kept past its wait: it holds the reduced tensor.)
        self._waited = None
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            dist.init_process_group(backend, store=attempt_store(rank, timeout), rank=rank.rank,
                                    world_size=rank.world_size, timeout=timeout)
        except (RuntimeError, ValueError) as err:
            raise PeerError(f"{rank.name()} could not join the other ranks ({_first_line(err)}); start every rank with "
                            "the same torchrun command, on machines that reach MASTER_ADDR:MASTER_PORT.") from None

    def leave(self) -> None:
        """Leave the process group; a group whose peers are gone is left all the same.

        Not after an abandoned collective: destroying the group waits for its pending
        work, which ends only when every peer joins it, closes its sockets or the
        --dist_timeout_seconds runs out. A learner stopped by SIGSTOP as its peer's
        rank went, then continued and SIGTERMed by its runner, sat there for that
        long after torchrun had ended its rank, an orphan (tests/test_distributed.py,
        3 of 6 runs). Leaving the group undestroyed costs nothing: a child of the
        process server ends with os._exit, and the kernel closes its sockets."""
        if self._waited is not None and not self._waited.is_completed():
            return
        try:
            dist.destroy_process_group()
        except (RuntimeError, ValueError):
            pass

    def _lost(self, what: str, err: BaseException) -> PeerError:
        return PeerError(f"{self.rank.name()} lost the other ranks during {what} ({_first_line(err)}): another rank "
                         "stopped or hung; its own messages, and torchrun's summary, name it and the cause.")

    def _all_reduce(self, tensor: torch.Tensor, what: str) -> torch.Tensor:
        with self._timer("sync_s"):
            try:
                if dist.get_backend() == "gloo":
                    self._waited = dist.all_reduce(tensor, async_op=True)
                    _wait_taking_signals(self._waited)
                    self._waited = None
                else:  # NCCL: a wait with a timeout that runs out aborts its communicator
                    dist.all_reduce(tensor)
            except RuntimeError as err:
                raise self._lost(what, err) from None
        return tensor

    def _all_gather_object(self, value: Any, what: str) -> List[Any]:
        """Every rank's `value` (anything that pickles), in rank order. For the start
        and the end only: it pickles, which a per-step collective must not pay for."""
        gathered: List[Any] = [None] * self.rank.world_size
        with self._timer("sync_s"):
            try:
                dist.all_gather_object(gathered, value)
            except RuntimeError as err:
                raise self._lost(what, err) from None
        return gathered

    # -- the start and the end ----------------------------------------------------------
    def check_agreement(self, values: Dict[str, Any], hints: Dict[str, str], hint: str) -> None:
        """Raise PeerError on every rank, naming the first of `values` in which a rank
        differs from rank 0, followed by its entry in `hints` (else `hint`)."""
        gathered = self._all_gather_object(values, "the start-up check")
        for r, theirs in enumerate(gathered):
            for name, first in gathered[0].items():
                if theirs.get(name) != first:
                    raise PeerError(f"rank {r}'s {name} is {theirs.get(name)!r} but rank 0's is {first!r}; "
                                    f"{hints.get(name, hint)}")

    def broadcast_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Overwrite `tensor` with rank 0's, in place."""
        with self._timer("sync_s"):
            try:
                dist.broadcast(tensor, src=0)
            except RuntimeError as err:
                raise self._lost("the start-up broadcast", err) from None
        return tensor

    def weights_digests(self, model: torch.nn.Module) -> List[str]:
        """Every rank's weights_digest, in rank order."""
        return self._all_gather_object(weights_digest(model), "the final weights check")

    # -- every batch --------------------------------------------------------------------
    def agree(self, stop: bool, counts: torch.Tensor) -> Tuple[bool, torch.Tensor]:
        """Before each batch: whether any rank wants to stop, and `counts` (float64)
        summed over the ranks. One small all-reduce."""
        vector = torch.cat([counts.to(torch.float64), torch.tensor([float(stop)], dtype=torch.float64)])
        vector = self._all_reduce(vector.to(self.device), "the per-batch agreement").cpu()
        return bool(vector[-1] > 0), vector[:-1]

    def average_gradients(self, params: Iterable[torch.nn.Parameter], weight: float, extras: Sequence[float],
                          riders: Optional[torch.Tensor] = None) -> Tuple[float, List[float], Optional[torch.Tensor]]:
        """Replace each parameter's gradient with the weighted mean over the ranks (rank
        r's counting `weight` on that rank, its valid samples: the loss is a mean over
        them, so the result is the gradient of the mean over every rank's samples, as
        one batch of them all would give). Returns (the weights summed, `extras` summed,
        `riders` summed, in float64), over the ranks. One all-reduce: the extras (the
        step's decisions) and the riders (a normaliser's moments) go behind the
        gradients, in their float32. A step where no rank had a valid sample gets zero
        gradients."""
        params = list(params)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        sizes = [g.numel() for g in grads]
        n = sum(sizes)
        head = n + 1 + len(extras)  # the gradients, the weight and the extras; the riders after
        flat = torch.empty(head + (0 if riders is None else riders.numel()), dtype=torch.float32, device=self.device)
        torch.cat([g.reshape(-1) for g in grads], out=flat[:n]).mul_(weight)
        flat[n:head] = torch.tensor([weight, *extras], dtype=torch.float32)
        if riders is not None:
            flat[head:] = riders.reshape(-1)
        self._all_reduce(flat, "the gradient all-reduce")
        tail = flat[n:head].tolist()
        summed_riders = None if riders is None else flat[head:].double().view_as(riders)
        scale = 1.0 / tail[0] if tail[0] > 0 else 0.0
        for p, chunk in zip(params, flat[:n].split(sizes)):
            averaged = chunk.view_as(p).mul_(scale)
            if p.grad is None:
                p.grad = averaged.clone()
            else:
                p.grad.copy_(averaged)
        return tail[0], tail[1:], summed_riders

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the ranks, in place (the normalisers' moments)."""
        return self._all_reduce(tensor, "a normaliser update")
