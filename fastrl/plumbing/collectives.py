"""The learners of a multi-rank run acting as one: joining the process group, and the
collectives that keep every rank's weights bit-identical. Gradients are averaged
before clipping, and every decision that changes a step comes from all-reduced values,
never one rank's own. One flat all-reduce rather than DDP, so the step's decisions
ride along (benchmarks/scale_out.py measures what DDP's overlap could save).
Collectives match by order: a rank that wants to stop says so in `agree`.
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
DIGEST_BYTES = 32  # SHA-256
SHOWN_BYTES = 200  # what a refusal quotes of each rank's differing value


def _wait_taking_signals(work) -> None:
    """Wait for a Gloo collective in slices, running signal handlers between them (a
    whole blocking wait runs none, so a learner could ignore SIGTERM until the
    timeout); raise its error, if it had one. A completed work's own outcome decides,
    not the slice's timeout, which may race the completion. NCCL's timed wait
    aborts the communicator, so it is not used there."""
    while True:
        try:
            work.wait(WAIT_SLICE)
            return
        except RuntimeError:
            if work.is_completed():
                # Returns at once if it succeeded, raises its own error if not.
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
    """The store the ranks meet in (torchrun's, at MASTER_ADDR:MASTER_PORT), its keys
    prefixed by this torchrun attempt: torchrun keeps one store across restarts, and
    unprefixed keys gave a restarted rank its dead predecessor's address. Rank 0
    serves it where torchrun's agent does not."""
    agent_serves = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), rank.world_size,
                          is_master=not agent_serves and rank.main, timeout=timeout, multi_tenant=True)
    return dist.PrefixStore(f"fastrl/attempt_{rank.restarts}", store)


class Peers:
    """This learner's membership in the run's process group (from torchrun's
    environment). Every method is a collective that every rank calls in the same
    order; their seconds go to `row`'s sync_s."""

    def __init__(self, rank: Rank, backend: str, timeout_s: float, device: torch.device, row: BoardRow):
        self.rank, self.device = rank, device
        self._timer = Timer(row)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL's object collectives use the current device
        # The Gloo all-reduce being waited on: still incomplete at leave() means it was
        # abandoned by a signal. Dropped after its wait, as it holds the reduced tensor.
        self._waited = None
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            dist.init_process_group(backend, store=attempt_store(rank, timeout), rank=rank.rank,
                                    world_size=rank.world_size, timeout=timeout)
        except (RuntimeError, ValueError) as err:
            raise PeerError(f"{rank.name()} could not join the other ranks ({_first_line(err)}); start every rank with "
                            "the same torchrun command, on machines that reach MASTER_ADDR:MASTER_PORT.") from None

    def leave(self) -> None:
        """Leave the process group, unless a collective was abandoned: destroying the
        group would wait for it until the timeout, leaving an orphan. Not destroying it
        costs nothing, as the process ends with os._exit."""
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

    def _all_gather_bytes(self, data: bytes, size: int, what: str) -> List[bytes]:
        """Every rank's `data` (at most `size` bytes, zero-padded), in rank order: fixed-size
        tensors, never pickles, so a peer's bytes can only ever be read, not run."""
        mine = torch.zeros(size, dtype=torch.uint8)
        mine[:len(data)] = torch.frombuffer(bytearray(data[:size]), dtype=torch.uint8)
        gathered = [torch.zeros_like(mine, device=self.device) for _ in range(self.rank.world_size)]
        with self._timer("sync_s"):
            try:
                dist.all_gather(gathered, mine.to(self.device))
            except RuntimeError as err:
                raise self._lost(what, err) from None
        return [bytes(t.cpu().numpy()) for t in gathered]

    # -- the start and the end ----------------------------------------------------------
    def check_agreement(self, values: Dict[str, Any], hints: Dict[str, str], hint: str) -> None:
        """Raise PeerError on every rank, naming the first of `values` where a rank
        differs from rank 0, with its hint. The ranks compare digests of each name and
        value; only a difference is quoted, as text of bounded length."""
        names = list(values)
        counts = self._all_gather_bytes(len(names).to_bytes(4, "little"), 4, "the start-up check")
        for r, count in enumerate(counts):
            if count != counts[0]:
                raise PeerError(f"rank {r} checks {int.from_bytes(count, 'little')} values at start-up but rank 0 "
                                f"checks {int.from_bytes(counts[0], 'little')}: install one fastrl version on every "
                                "machine.")
        shown = [f"{name}={values[name]!r}".encode() for name in names]
        digests = b"".join(hashlib.sha256(text).digest() for text in shown)
        size = DIGEST_BYTES * len(names)
        gathered = self._all_gather_bytes(digests + bytes(size - len(digests)), size, "the start-up check")
        for r, theirs in enumerate(gathered):
            for i, name in enumerate(names):
                at = slice(i * DIGEST_BYTES, (i + 1) * DIGEST_BYTES)
                if theirs[at] != gathered[0][at]:
                    quoted = self._all_gather_bytes(repr(values[name]).encode(), SHOWN_BYTES, "the start-up check")
                    text = [q.rstrip(b"\0").decode("utf-8", "replace") for q in quoted]
                    raise PeerError(f"rank {r}'s {name} is {text[r]} but rank 0's is {text[0]}; "
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
        raw = bytes.fromhex(weights_digest(model))
        return [d.hex() for d in self._all_gather_bytes(raw, DIGEST_BYTES, "the final weights check")]

    # -- every batch --------------------------------------------------------------------
    def agree(self, stop: bool, counts: torch.Tensor) -> Tuple[bool, torch.Tensor]:
        """Before each batch, one small all-reduce: whether any rank wants to stop, and
        `counts` summed over ranks."""
        vector = torch.cat([counts.to(torch.float64), torch.tensor([float(stop)], dtype=torch.float64)])
        vector = self._all_reduce(vector.to(self.device), "the per-batch agreement").cpu()
        return bool(vector[-1] > 0), vector[:-1]

    def average_gradients(self, params: Iterable[torch.nn.Parameter], weight: float, extras: Sequence[float],
                          riders: Optional[torch.Tensor] = None) -> Tuple[float, List[float], Optional[torch.Tensor]]:
        """Replace each gradient with the mean over ranks weighted by each rank's valid
        samples, so the result is the gradient of one batch of them all; zero if none.
        One all-reduce, with `extras` (the step's decisions) and `riders` (normaliser
        moments) behind the gradients in float32. Returns the summed weight, extras
        and riders."""
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
