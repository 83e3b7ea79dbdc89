"""Policy inference replayed from CUDA graphs.

A policy worker's forward pass is a few dozen small kernels on a batch of tens to
hundreds of rows; on a GPU their launch cost, paid by the Python host, exceeds their
run time. A CUDA graph records the launches once and replays them with one call.

A graph is frozen in three ways, and each shapes this module:

- Shapes. A graph replays exactly the shapes it captured, so `GraphedPolicy`
  captures a ladder of batch sizes, pads a batch up to the next one (rows are
  independent in every layer of the model, so padding rows never touch real ones)
  and slices the outputs. A batch above the largest size runs eagerly.
- Addresses. A graph reads its inputs and the model's parameters from the device
  addresses seen at capture. Inputs are therefore copied into static buffers before
  each replay. Parameters stay valid across reloads because `load_flat_state`
  (fastrl/algo/model.py) writes with `copy_` into the tensors `state_dict()` returns,
  which share storage with the parameters and buffers: same addresses, new values.
  Anything that swaps tensors instead (`model.to(...)`, assigning `.data`, building
  a new model) leaves the graph reading the old memory; capture again after it.
- Host work. Only device work is recorded; an op that reads a value back to the host
  (`.item()`, `.cpu()`, a data-dependent check) cannot be captured at all. Capture is
  therefore preceded by one eager run with torch's sync debug mode set to "error",
  which turns such an op into a clear `GraphCaptureError` instead of a failed or
  corrupted capture. `make_policy_runner` then falls back to eager inference.
  `torch.multinomial` validates its input with `.item()`, which is why the
  categorical sampler draws by inverse CDF instead (fastrl/algo/distributions.py):
  discrete and Gaussian sampling, and `deterministic=True`, all capture.

Random numbers: sampling inside a graph draws from the default CUDA generator's
Philox stream. `torch.cuda.graph` registers that generator with the capture and the
graph reads seed and offset from device memory that every replay advances, so each
replay draws fresh numbers and eager code after it does not repeat them. A generator
other than the default would have to be registered with the graph explicitly; the
model uses only the default one.
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
    """`model.act` without autograd, on inputs moved to the model's device.

    The CPU path, and the fallback whenever graphs are unavailable or refused.
    """

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
        """act() on what `host_inputs` handed out, its outputs on the host; `clock`
        (fastrl.cuda.timing) times the forward as "gpu_s" and the copies back as "d2h_s"."""
        obs, rnn = self._inputs
        with clock.span("gpu_s"):
            out = self(obs, rnn)
        with clock.span("d2h_s"):
            return ActOutput(*(value.cpu() for value in out))


class GraphedPolicy:
    """`model.act` captured in one CUDA graph per padded batch size.

    Args:
        model: the ActorCritic, already on `device`. Reload parameters only with
            in-place copies (`load_flat_state`); see the module doc.
        batch_sizes: batch sizes to capture; a batch of B rows replays the smallest
            one >= B.
        obs_layout: {key: (per-sample shape, dtype)}, as `fastrl.algo.model.obs_layout`.
        rnn_size: width of the recurrent state (0 without an RNN).
        device: the CUDA device.
        deterministic: capture the distribution's mode instead of a sample; fixed
            per instance because it changes the recorded kernels.
        example_obs: one valid observation {key: per-sample tensor} to fill the
            static inputs for capture and padding. Zeros are used if omitted, which
            every layout accepts except a Discrete space that excludes 0 (start > 0).

    Replays are enqueued on the current stream; use one instance from one stream
    at a time. Outputs are fresh tensors, not views of the graph's static outputs.
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
        # Pinned host mirrors of the static inputs and outputs, for a policy worker that
        # gathers its requests' rows on the host and wants the answers there. Copies
        # between pinned memory and the GPU are DMA the host need not watch, so it
        # enqueues upload, replay and download and then sleeps on one blocking event:
        # a pageable `.cpu()` instead spins a core for the whole forward (CUDA spins
        # while a process has fewer contexts than the machine has cores), and a GPU
        # policy worker measured a full core busy whatever its load.
        self._host_obs = {key: torch.empty(static.shape, dtype=static.dtype, pin_memory=True)
                          for key, static in self._obs.items()}
        self._host_rnn = torch.empty(self._rnn.shape, pin_memory=True)
        self._host_out = ActOutput(*(torch.empty(out.shape, dtype=out.dtype, pin_memory=True)
                                     for out in self._outputs[top]))
        self._answered = torch.cuda.Event(blocking=True)
        self._host_batch = 0

    @staticmethod
    def supported() -> bool:
        """True when CUDA graphs can run here (a CUDA device is present)."""
        return cuda_available()

    def _act_static(self, size: int) -> ActOutput:
        obs = {key: static[:size] for key, static in self._obs.items()}
        return self.model.act(obs, self._rnn[:size], deterministic=self.deterministic)

    @torch.no_grad()
    def _capture(self) -> None:
        # Warm-up runs on a side stream, as torch's graph docs advise, so that lazy
        # initialisation happens outside the capture and off the caller's stream.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for size in self.sizes:
                for _ in range(WARMUP_ITERS):
                    self._act_static(size)
            self._refuse_host_sync()
        torch.cuda.current_stream(self.device).wait_stream(side)

        # All graphs share one memory pool, captured largest first so the smaller
        # ones fit into the blocks it freed. The price: a graph's temporaries may
        # overlap another graph's static outputs, which is why __call__ copies the
        # outputs out before the next replay can clobber them.
        pool = None
        for size in reversed(self.sizes):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[size] = self._act_static(size)
            pool = graph.pool()
            self._graphs[size] = graph

    def _refuse_host_sync(self) -> None:
        # Run after the plain warm-up, so a genuine model error has already surfaced
        # as itself and any error here comes from the sync check.
        previous = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings():  # torch warns, at every policy worker's start, that the mode is a prototype
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
        """Pinned host views of `batch` rows for the caller to fill before `act_on_host`;
        they stay valid until the next call of either."""
        self._host_batch = batch
        if batch > self.sizes[-1]:
            return self._eager.host_inputs(batch)
        return {key: host[:batch] for key, host in self._host_obs.items()}, self._host_rnn[:batch]

    @torch.no_grad()
    def act_on_host(self, clock) -> ActOutput:
        """act() on what `host_inputs` handed out, answered in pinned host tensors valid
        until the next call; `clock` (fastrl.cuda.timing) times the upload and replay
        as "gpu_s" and the copies back as "d2h_s". Returns once the answers are there,
        having slept (not spun) while the GPU worked."""
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
    """Powers of two below `max_batch`, then `max_batch`.

    Doubling bounds the padded work at under 2x the real batch while keeping the
    number of graphs (capture time, graph memory) at log2(max_batch).
    """
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
    """A callable (obs, rnn_state) -> ActOutput for inference on `device`.

    On CUDA, a `GraphedPolicy` over `pad_ladder(max_batch)`; if the model's act()
    cannot be captured, a warning and an `EagerPolicy`. Elsewhere an `EagerPolicy`.
    A capture that fails for another reason (a kernel or library that refuses graph
    capture on this GPU) also falls back: inference that runs eagerly is slower,
    a policy worker that dies over it stops the run.
    """
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
