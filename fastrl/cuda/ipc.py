"""A parameter tensor shared between processes, on the device that uses it: shared
memory on a CPU, device memory shared by CUDA IPC handle on a GPU, so a reload is a
device-to-device copy. CUDA IPC's rules:

- the allocating process must outlive every user (memory is not refcounted across
  processes), so the runner allocates it and pays for a CUDA context;
- processes share no stream order, so every copy in or out must finish before a
  version counter moves (`copy_and_wait`);
- the driver may leave /dev/shm/cuda.shm.* files behind after a clean exit;
  `remove_driver_files` deletes those of exited processes.
"""

import atexit
import os
import re

import torch

SHM_DIR = "/dev/shm"
DRIVER_FILE = re.compile(r"^cuda\.shm\.\d+\.([0-9a-f]+)\.\d+$")
_own_files_removed_at_exit = False


def device_param_buffer(size: int, device) -> torch.Tensor:
    """A zeroed float32 vector of `size` that spawned processes can share: on `device`
    if CUDA, else in shared memory."""
    device = torch.device(device)
    if device.type == "cuda":
        global _own_files_removed_at_exit
        if not _own_files_removed_at_exit:
            atexit.register(remove_driver_files, [os.getpid()])
            _own_files_removed_at_exit = True
        return torch.zeros(size, dtype=torch.float32, device=device)
    return torch.zeros(size, dtype=torch.float32).share_memory_()


def remove_driver_files(pids, shm_dir: str = SHM_DIR) -> list:
    """Delete the CUDA driver's /dev/shm files of these processes, which must have
    exited (or be this one, at exit); returns the names deleted."""
    wanted = {int(pid) for pid in pids}
    removed = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return removed
    for name in names:
        match = DRIVER_FILE.match(name)
        if match and int(match.group(1), 16) in wanted:
            try:
                os.unlink(os.path.join(shm_dir, name))
                removed.append(name)
            except OSError:
                pass  # gone already, or not ours to delete
    return removed


def copy_and_wait(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst.copy_(src)`, returning once the copy has finished on the device; use it for
    every access to a buffer other processes see."""
    dst.copy_(src)
    for device in {t.device for t in (dst, src) if t.is_cuda}:
        torch.cuda.current_stream(device).synchronize()
