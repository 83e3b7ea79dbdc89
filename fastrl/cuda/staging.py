"""Moving the learner's batches to its device while it trains the previous one:
`start` copies into pinned memory and uploads on a side stream, `finish` makes the
compute stream wait for that upload only.

Pinned, because a pageable copy blocks the host; pinning is costly, so each batch
key keeps one pinned block, reused and only grown. Staged tensors keep their
source's layout (channels-last stays so). A side stream, because copies on the
compute stream would queue behind its kernels. On a CPU `PassThroughStager` returns
the batch itself. With a clock, each upload's device time goes to `h2d_s`.
"""

from abc import ABC, abstractmethod
from typing import Any, Dict, NamedTuple, Optional, Tuple

import torch

from fastrl.cuda import cuda_available

Batch = Dict[str, Any]  # {key: tensor or nested Batch}


class BatchStager(ABC):
    """Two-phase batch upload of a dict of CPU tensors (or nested dicts): `start`
    begins it, `finish`, once per handle, hands over the result on the stream that
    will use it."""

    @staticmethod
    def for_device(device, clock=None) -> "BatchStager":
        """PassThroughStager on a CPU, CudaStager (reporting to `clock`) on CUDA."""
        device = torch.device(device)
        if device.type == "cpu":
            return PassThroughStager()
        if device.type == "cuda":
            if not cuda_available():
                raise RuntimeError(f"Cannot stage batches to {device}: torch sees no CUDA device.")
            return CudaStager(device, clock)
        raise ValueError(f"Batch staging supports cpu and cuda devices, got {device}.")

    @abstractmethod
    def start(self, batch: Batch):
        """Begin moving `batch` to the device; return a handle for `finish`."""

    @abstractmethod
    def finish(self, handle) -> Batch:
        """The batch on the device, safe to use on the current stream."""


class PassThroughStager(BatchStager):
    """CPU device: the batch already lives where it is used, so nothing is copied."""

    def start(self, batch: Batch) -> Batch:
        return batch

    def finish(self, handle: Batch) -> Batch:
        return handle


class _Staged(NamedTuple):
    batch: Batch  # device tensors, written by the side stream
    copied: torch.cuda.Event  # fires when every copy of this batch is done


class CudaStager(BatchStager):
    """Uploads through reusable pinned host buffers on a side stream. A start first
    waits for the previous start's copies, as it overwrites their buffers: one buffer
    set keeps pinned memory at one batch, and the learner's gather between starts
    usually outlasts the upload."""

    def __init__(self, device: torch.device, clock=None):
        self.device = torch.device(device)
        self._stream = torch.cuda.Stream(device=self.device)
        self._pinned: Dict[Tuple[Any, ...], torch.Tensor] = {}
        self._last_copy: Optional[torch.cuda.Event] = None
        self._clock = clock

    def start(self, batch: Batch) -> _Staged:
        if self._last_copy is not None:
            self._last_copy.synchronize()
        pinned = self._pin(batch, ())
        with torch.cuda.stream(self._stream):
            began = torch.cuda.Event(enable_timing=True)
            began.record(self._stream)
            # Allocated on the side stream; `finish` records its use on the compute stream.
            device_batch = _to_device(pinned, self.device)
            copied = torch.cuda.Event(enable_timing=True)
            copied.record(self._stream)
        if self._clock is not None:
            self._clock.add_events("h2d_s", began, copied)
        self._last_copy = copied
        return _Staged(device_batch, copied)

    def finish(self, handle: _Staged) -> Batch:
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(handle.copied)
        # Without record_stream the allocator, judging by the side stream alone, could
        # hand these blocks to the next upload while the compute stream still reads them.
        _record_stream(handle.batch, stream)
        return handle.batch

    def _pin(self, batch: Batch, path: Tuple[Any, ...]) -> Batch:
        """The batch copied into this stager's pinned blocks, same nesting."""
        out = {}
        for key, value in batch.items():
            if isinstance(value, dict):
                out[key] = self._pin(value, path + (key,))
            elif isinstance(value, torch.Tensor) and value.device.type == "cpu":
                out[key] = self._pinned_copy(path + (key,), value)
            else:
                raise TypeError(
                    f"Batch entry {'/'.join(map(str, path + (key,)))} is {type(value).__name__} "
                    f"on {getattr(value, 'device', 'no device')}; stage only CPU tensors or dicts of them."
                )
        return out

    def _pinned_copy(self, path: Tuple[Any, ...], src: torch.Tensor) -> torch.Tensor:
        nbytes = src.numel() * src.element_size()
        block = self._pinned.get(path)  # raw bytes, pinned
        if block is None or block.numel() < nbytes:
            # Doubling bounds re-pinning of a key whose rows vary.
            grown = max(nbytes, 2 * block.numel()) if block is not None else nbytes
            block = torch.empty(grown, dtype=torch.uint8, pin_memory=True)
            self._pinned[path] = block
        # empty_like keeps a dense tensor's strides (channels-last included), else contiguous.
        strides = torch.empty_like(src, device="meta").stride()
        buf = block[:nbytes].view(src.dtype).as_strided(src.shape, strides)
        buf.copy_(src)
        return buf


def _to_device(pinned: Batch, device: torch.device) -> Batch:
    return {key: _to_device(value, device) if isinstance(value, dict) else value.to(device, non_blocking=True)
            for key, value in pinned.items()}


def _record_stream(batch: Batch, stream: torch.cuda.Stream) -> None:
    for value in batch.values():
        if isinstance(value, dict):
            _record_stream(value, stream)
        else:
            value.record_stream(stream)
