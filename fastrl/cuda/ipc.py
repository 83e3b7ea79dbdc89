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
"""

import torch


def device_param_buffer(size: int, device) -> torch.Tensor:
    """A zeroed float32 vector of `size` values that spawned processes can share.

    On CUDA it is allocated on `device` and shared by IPC handle; anywhere else it
    is a CPU tensor in shared memory (`share_memory_()`).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.zeros(size, dtype=torch.float32, device=device)
    return torch.zeros(size, dtype=torch.float32).share_memory_()


def copy_and_wait(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst.copy_(src)`, returning only once the copy has finished on the device.

    Use it for every write to and read from a buffer other processes see. Waiting
    on the whole current stream rather than an event recorded after the copy costs
    nothing extra here: the copy is the last work enqueued on it.
    """
    dst.copy_(src)
    for device in {t.device for t in (dst, src) if t.is_cuda}:
        torch.cuda.current_stream(device).synchronize()
