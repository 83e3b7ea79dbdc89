"""Moving the learner's batches to its device without stalling its compute.

The learner gathers a batch out of shared memory on the host, then trains on it. On
a GPU the upload is split in two so that batch k+1 travels while batch k trains:

    handle = stager.start(next_batch)    # host copy into pinned memory, async upload
    batch = stager.finish(handle)        # compute stream waits for the upload only

Why pinned memory: a copy from pageable memory is staged by the driver through its
own pinned bounce buffer and blocks the host, so `non_blocking=True` would not hold.
Pinning is expensive (page locking, about a millisecond per MB), so each batch key
gets one pinned block, reused and only ever grown: most of a batch keeps its shape
from batch to batch (the config fixes it), but the truncated steps' final
observations change rows every batch, and re-pinning for them would cost more than
their copy. A staged tensor keeps its source's memory layout (channels-last images
stay channels-last), so the host copy is a straight memcpy and the model sees on
the GPU what it sees on a CPU.

Why a side stream: copies enqueued on the compute stream would wait behind the
training kernels already queued there. On their own stream they run on the copy
engine at the same time, and an event hands the result to the compute stream.

On a CPU there is nothing to move, and `PassThroughStager` returns the batch itself.

Given a clock (fastrl.cuda.timing), the stager reports each upload's device time
as `h2d_s`: the pinned host copies all happen before the first upload is enqueued,
so the span between its two events is the copy engine's alone.
"""

from abc import ABC, abstractmethod
from typing import Any, Dict, NamedTuple, Optional, Tuple

import torch

from fastrl.cuda import cuda_available

Batch = Dict[str, Any]  # {key: tensor or nested Batch}


class BatchStager(ABC):
    """Two-phase batch upload: `start` begins it, `finish` hands over the result.

    A batch is a dict whose values are CPU tensors or dicts of the same form. Call
    `finish` exactly once per handle, on the thread and stream that will use the
    batch.
    """

    @staticmethod
    def for_device(device, clock=None) -> "BatchStager":
        """A pass-through stager for a CPU device, a `CudaStager` for a CUDA one
        (reporting its uploads to `clock`, a DeviceClock, when given)."""
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
    """Uploads through reusable pinned host buffers on a dedicated side stream.

    One pinned block per batch key (nested keys form a path). A start overwrites
    those buffers, so it first waits on the host for the previous start's copies to
    finish reading them. One buffer set rather than two keeps pinned memory at one
    batch: the learner gathers the next batch on the host between two starts, which
    usually takes longer than the previous upload, so the wait is rarely felt.
    """

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
            # Device memory is allocated here, on the side stream; `finish` tells the
            # caching allocator about its use on the compute stream.
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
        # Without record_stream the allocator would consider these blocks free as
        # soon as their tensors die, judged by the side stream alone, and could hand
        # them to the next upload while the compute stream still reads them.
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
            # Doubling bounds the re-pinning of a key whose rows vary to log2 of its largest size.
            grown = max(nbytes, 2 * block.numel()) if block is not None else nbytes
            block = torch.empty(grown, dtype=torch.uint8, pin_memory=True)
            self._pinned[path] = block
        # empty_like keeps a dense tensor's strides (channels-last included) and makes
        # anything else contiguous: the layout the pinned copy takes.
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
