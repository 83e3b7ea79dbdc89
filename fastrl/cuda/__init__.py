"""GPU-only accelerations of the data path, each with a CPU fallback: pinned-memory
batch staging (`staging`), CUDA-graph inference (`graphs`), parameters shared by CUDA
IPC (`ipc`) and GPU-side timing (`timing`). Every module imports on a CPU-only torch.
"""

import torch


def cuda_available() -> bool:
    """True when torch was built with CUDA and sees at least one device."""
    return torch.cuda.is_available()
