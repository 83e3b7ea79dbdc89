"""GPU-only accelerations of the data path, each with a CPU fallback.

- `staging`: `BatchStager`, host-to-device batch copies through reusable pinned
  memory on a side stream, so the learner's next batch uploads while it trains.
- `graphs`: `GraphedPolicy` / `make_policy_runner`, policy inference replayed from
  CUDA graphs at a ladder of padded batch sizes.
- `ipc`: `device_param_buffer` / `copy_and_wait`, a parameter tensor shared between
  processes (CUDA IPC on a GPU, shared memory on a CPU).
- `timing`: `DeviceClock`, the GPU's own time for spans of a process's work (CUDA
  events read once they fired), for the stats board and `fastrl.bench`.

Every module imports on a CPU-only torch build; callers ask `cuda_available()` (or
use the `for_device` / `make_policy_runner` factories, which ask it for them) and
fall back to the plain CPU path.
"""

import torch


def cuda_available() -> bool:
    """True when torch was built with CUDA and sees at least one device."""
    return torch.cuda.is_available()
