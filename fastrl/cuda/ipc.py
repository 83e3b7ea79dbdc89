"""A parameter tensor shared between processes, on the device that uses it.

The learner publishes its flat parameter vector and policy workers copy it into
their models. On a CPU the vector lives in shared memory. On a GPU it lives in
device memory: handing a CUDA tensor to a process started with `spawn` (as a
Process argument or through a torch.multiprocessing queue) sends a CUDA IPC handle,
and the receiver maps the same device memory. A reload is then a device-to-device
copy instead of a host round trip.

Rules that come with CUDA IPC:

- The producer (the process that allocated the tensor) must keep it alive for as
  long as any consumer uses it; the memory is not reference-counted across
  processes, and freeing it first leaves the consumers reading memory the caching
  allocator may have handed out again. For fastrl that means allocating the buffer
  in the process that starts the others and holding it until they have exited, at
  the price of a CUDA context in that process (a few hundred MB of device memory).
- Processes share no stream order. A copy into or out of the shared tensor is only
  enqueued when `copy_` returns, so a version counter bumped, or a lock released,
  right after it can let another process read a half-written vector or see it
  overwritten mid-read. `copy_and_wait` waits for the copy to finish.
- The CUDA driver keeps a small file, /dev/shm/cuda.shm.<n>.<pid in hex>.<n>, for
  a process that takes part in IPC, and on an H200 machine (driver 580) a training
  run left one behind after a clean exit. `remove_driver_files` deletes those of
  processes that are gone; the process that allocates an IPC buffer deletes its own
  at exit, when no other process can still need it.
"""

import atexit
import os
import re

import torch

SHM_DIR = "/dev/shm"
DRIVER_FILE = re.compile(r"^cuda\.shm\.\d+\.([0-9a-f]+)\.\d+$")
_own_files_removed_at_exit = False


def device_param_buffer(size: int, device) -> torch.Tensor:
    """A zeroed float32 vector of `size` values that spawned processes can share.

    On CUDA it is allocated on `device` and shared by IPC handle; anywhere else it
    is a CPU tensor in shared memory (`share_memory_()`).
    """
    device = torch.device(device)
    if device.type == "cuda":
        global _own_files_removed_at_exit
        if not _own_files_removed_at_exit:
            atexit.register(remove_driver_files, [os.getpid()])
            _own_files_removed_at_exit = True
        return torch.zeros(size, dtype=torch.float32, device=device)
    return torch.zeros(size, dtype=torch.float32).share_memory_()


def remove_driver_files(pids, shm_dir: str = SHM_DIR) -> list:
    """Delete the CUDA driver's /dev/shm files of these processes (see the module
    doc); returns the names deleted. Only for processes that have exited, or for
    this one at its exit: a live process may still need its file."""
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
    """`dst.copy_(src)`, returning only once the copy has finished on the device.

    Use it for every write to and read from a buffer other processes see. Waiting
    on the whole current stream rather than an event recorded after the copy costs
    nothing extra here: the copy is the last work enqueued on it.
    """
    dst.copy_(src)
    for device in {t.device for t in (dst, src) if t.is_cuda}:
        torch.cuda.current_stream(device).synchronize()
