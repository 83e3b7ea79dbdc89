"""Policy inference replayed from CUDA graphs: a policy worker's forward is dozens of
small kernels whose launch cost exceeds their run time; a graph replays them in one call.

A graph is frozen three ways, and each shapes this module:
- Shapes: it captures a ladder of batch sizes, pads a batch up to the next (rows are
  independent, so padding never touches real rows) and slices the outputs.
- Addresses: inputs are copied into static buffers; parameters must be reloaded in
  place (`load_flat_state`), as `model.to()` or a new model leaves the graph reading
  old memory.
- Host work cannot be captured: one eager run under sync debug mode "error" turns it
  into a GraphCaptureError (and eager fallback) rather than a corrupt capture. This is
  why the categorical sampler avoids torch.multinomial.

Sampling inside a graph uses the default CUDA generator, which the capture registers,
so every replay draws fresh numbers.
"""

import bisect
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from fastrl.algo.model import ActOutput, ObsLayout
from fastrl.cuda import cuda_available

WARMUP_ITERS = 3  # eager runs before capture: cuBLAS/cuDNN handles and workspaces exist by then


class GraphCaptureError(RuntimeError):
    """The model's act() does host work that a CUDA graph cannot record."""


class EagerPolicy:
    """`model.act` without autograd on the model's device: the CPU path and the
    fallback whenever graphs are unavailable or refused."""

    def __init__(self, model: nn.Module, device, deterministic: bool = False):
        self.model, self.device, self.deterministic = model, torch.device(device), deterministic
        self._inputs = None  # what host_inputs last handed out

    @torch.no_grad()
    def __call__(self, obs: Dict[str, torch.Tensor], rnn_state: torch.Tensor) -> ActOutput:
        obs = {key: value.to(self.device) for key, value in obs.items()}
        return self.model.act(obs, rnn_state.to(self.device), deterministic=self.deterministic)

    def host_inputs(self, batch: int) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
        """Host tensors of `batch` rows for the caller to fill before `act_on_host`."""
        self._inputs = ({key: torch.empty((batch, *shape), dtype=dtype)
                         for key, (shape, dtype) in self.model.layout.items()},
                        torch.empty(batch, self.model.rnn_state_size))
        return self._inputs

    def act_on_host(self, clock) -> ActOutput:
        """act() on what `host_inputs` handed out, outputs on the host; `clock` times
        the forward ("gpu_s") and the copies back ("d2h_s")."""
        obs, rnn = self._inputs
        with clock.span("gpu_s"):
            out = self(obs, rnn)
        with clock.span("d2h_s"):
            return ActOutput(*(value.cpu() for value in out))


class GraphedPolicy:
    """`model.act` captured in one CUDA graph per padded batch size.

    batch_sizes: a batch of B rows replays the smallest one >= B. deterministic is
    fixed per instance, as it changes the recorded kernels. example_obs: a valid
    observation for the static inputs (zeros if omitted, which a Discrete space with
    start > 0 would reject). Replays go on the current stream; outputs are fresh tensors.
    """

    def __init__(
        self,
        model: nn.Module,
        batch_sizes: Sequence[int],
        obs_layout: ObsLayout,
        rnn_size: int,
        device,
        deterministic: bool = False,
        example_obs: Optional[Dict[str, torch.Tensor]] = None,
    ):
        if not self.supported():
            raise RuntimeError("GraphedPolicy needs a CUDA device; use make_policy_runner to fall back.")
        self.sizes = sorted({int(size) for size in batch_sizes})
        if not self.sizes or self.sizes[0] < 1:
            raise ValueError(f"batch_sizes must be positive integers, got {list(batch_sizes)}.")
        self.device = torch.device(device)
        self.model, self.deterministic = model, deterministic
        self._eager = EagerPolicy(model, self.device, deterministic)

        top = self.sizes[-1]
        self._obs = {}
        for key, (shape, dtype) in obs_layout.items():
            static = torch.zeros((top, *shape), dtype=dtype, device=self.device)
            if example_obs is not None:
                static.copy_(example_obs[key].expand_as(static))
            self._obs[key] = static
        self._rnn = torch.zeros(top, rnn_size, device=self.device)
        self._graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: Dict[int, ActOutput] = {}
        self._capture()
        # Pinned host mirrors: pinned copies are DMA, so the host enqueues upload,
        # replay and download and sleeps on one blocking event, where a pageable
        # `.cpu()` would spin a core for the whole forward.
        self._host_obs = {key: torch.empty(static.shape, dtype=static.dtype, pin_memory=True)
                          for key, static in self._obs.items()}
        self._host_rnn = torch.empty(self._rnn.shape, pin_memory=True)
        self._host_out = ActOutput(*(torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
                                     for out in self._outputs[top]))
        self._answered = torch.cuda.Event(blocking=True)
        self._host_batch = 0

    @staticmethod
    def supported() -> bool:
        return cuda_available()

    def _act_static(self, size: int) -> ActOutput:
        obs = {key: static[:size] for key, static in self._obs.items()}
        return self.model.act(obs, self._rnn[:size], deterministic=self.deterministic)

    @torch.no_grad()
    def _capture(self) -> None:
        # Warm-up on a side stream (as torch's docs advise): lazy init stays out of the capture.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for size in self.sizes:
                for _ in range(WARMUP_ITERS):
                    self._act_static(size)
            self._refuse_host_sync()
        torch.cuda.current_stream(self.device).wait_stream(side)

        # One memory pool, captured largest first so smaller graphs reuse its blocks. A
        # graph's temporaries may then overlap another's outputs, so __call__ copies
        # outputs out before the next replay.
        pool = None
        for size in reversed(self.sizes):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[size] = self._act_static(size)
            pool = graph.pool()
            self._graphs[size] = graph

    def _refuse_host_sync(self) -> None:
        # After the plain warm-up, so a real model error has surfaced as itself already.
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings():  # torch warns at every start that the mode is a prototype
            warnings.filterwarnings("ignore", message="Synchronization debug mode is a prototype")
            torch.cuda.set_sync_debug_mode("error")
        try:
            self._act_static(self.sizes[0])
        except RuntimeError as err:
            raise GraphCaptureError(
                f"model.act(deterministic={self.deterministic}) synchronises with the host, "
                f"which a CUDA graph cannot record ({err})"
            ) from err
        finally:
            torch.cuda.set_sync_debug_mode(previous)

    @torch.no_grad()
    def __call__(self, obs: Dict[str, torch.Tensor], rnn_state: torch.Tensor) -> ActOutput:
        """Same contract as `model.act(obs, rnn_state, self.deterministic)`."""
        batch = rnn_state.shape[0]
        if batch > self.sizes[-1]:
            return self._eager(obs, rnn_state)
        if obs.keys() != self._obs.keys():
            raise ValueError(f"Observation keys {sorted(obs)} differ from the captured {sorted(self._obs)}.")
        for key, value in obs.items():
            if value.shape[0] != batch:
                raise ValueError(f"Observation '{key}' has {value.shape[0]} rows but rnn_state has {batch}.")
            self._obs[key][:batch].copy_(value)
        self._rnn[:batch].copy_(rnn_state)
        size = self.sizes[bisect.bisect_left(self.sizes, batch)]
        self._graphs[size].replay()
        return ActOutput(*(out[:batch].clone() for out in self._outputs[size]))

    def host_inputs(self, batch: int) -> Tuple[Dict[str, torch.Tensor], torch.Tensor]:
        """Pinned host views of `batch` rows to fill before `act_on_host`; valid until
        the next call of either."""
        self._host_batch = batch
        if batch > self.sizes[-1]:
            return self._eager.host_inputs(batch)
        return {key: host[:batch] for key, host in self._host_obs.items()}, self._host_rnn[:batch]

    @torch.no_grad()
    def act_on_host(self, clock) -> ActOutput:
        """act() on what `host_inputs` handed out, answered in pinned host tensors valid
        until the next call; sleeps, rather than spins, while the GPU works."""
        batch = self._host_batch
        if batch > self.sizes[-1]:
            return self._eager.act_on_host(clock)
        size = self.sizes[bisect.bisect_left(self.sizes, batch)]
        with clock.span("gpu_s"):
            for key, static in self._obs.items():
                static[:batch].copy_(self._host_obs[key][:batch], non_blocking=True)
            self._rnn[:batch].copy_(self._host_rnn[:batch], non_blocking=True)
            self._graphs[size].replay()
        with clock.span("d2h_s"):
            for host, out in zip(self._host_out, self._outputs[size]):
                host[:batch].copy_(out[:batch], non_blocking=True)
        self._answered.record()
        self._answered.synchronize()
        return ActOutput(*(host[:batch] for host in self._host_out))


def pad_ladder(max_batch: int) -> List[int]:
    """Powers of two below `max_batch`, then `max_batch`: padding stays under 2x the
    real batch with only log2(max_batch) graphs."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}.")
    sizes = []
    size = 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return sizes + [max_batch]


def make_policy_runner(
    model: nn.Module,
    device,
    max_batch: int,
    deterministic: bool = False,
    example_obs: Optional[Dict[str, torch.Tensor]] = None,
):
    """A callable (obs, rnn_state) -> ActOutput on `device`: a GraphedPolicy on CUDA,
    else (or if capture fails for any reason, with a warning) an EagerPolicy. Slower
    inference beats a policy worker that dies."""
    device = torch.device(device)
    if device.type != "cuda":
        return EagerPolicy(model, device, deterministic)
    try:
        return GraphedPolicy(
            model, pad_ladder(max_batch), model.layout, model.rnn_state_size, device,
            deterministic=deterministic, example_obs=example_obs,
        )
    except RuntimeError as err:  # GraphCaptureError, or a failed capture
        warnings.warn(f"CUDA-graph inference is off, running eagerly: {err}", RuntimeWarning, stacklevel=2)
        return EagerPolicy(model, device, deterministic)
