"""A caching allocator for the CPU learner's large tensors.

Every learner step allocates the same large tensors (a Doom batch's activations
and their gradients, tens of MB each) and frees them at its end. glibc serves
allocations past its mmap threshold (at most 32 MB) with a fresh mmap and unmaps
them on free, and trims the heap's free top, so each step's tensors land on new
pages that the kernel must zero: the learner spent a quarter of its CPU in the
kernel (benchmarks/README.md, seventh session), and its private memory swung by
hundreds of MB from one minute to the next (the 2-hour soak). Telling glibc never
to mmap made the heap grow without bound instead.

This allocator (caching_allocator.cpp) sits in front of torch's own: blocks of at
least `min_bytes`, rounded to whole pages, are kept when freed, up to
`max_cached_bytes` in all, and handed out again to the next request of the same
size, which in a training loop is the next step's. Blocks of a size no longer
asked for make room for the newest, so a change of shapes cannot fill it for
good. It is C++ because torch calls its allocator from C++; it needs only c10's
headers and library, so it builds in a few seconds with the machine's C++
compiler (which --compile_learner needs anyway), once per torch version, cached
under ~/.cache/fastrl/allocator.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from typing import Optional

import psutil

from fastrl.plumbing.files import user_cache

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "caching_allocator.cpp")
BUILD_TIMEOUT_S = 120.0
MIN_BYTES = 1 << 20  # smaller blocks glibc serves from its heap, reused without the kernel
# What a learner's cache may hold, whatever its batch: an eighth of the machine's
# memory, at most 4 GiB. doom_battle's learner (batch 1024) keeps 150-500 MB.
MAX_CACHE_BYTES = 4 << 30
STAT_FIELDS = ("reused", "allocated", "returned", "cached_bytes", "live")

_lib: Optional[ctypes.CDLL] = None


class AllocatorUnavailable(RuntimeError):
    """The allocator could not be built or loaded; the message says why."""


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    raise AllocatorUnavailable("no C++ compiler found (set CXX, or install g++)")


def _library_path(compiler: str) -> str:
    import torch

    with open(SOURCE, "rb") as fh:
        key = hashlib.sha1(fh.read() + f"{torch.__version__} {compiler}".encode()).hexdigest()[:16]
    return os.path.join(user_cache("allocator"), f"caching_allocator_{key}.so")


def _build(path: str, compiler: str) -> None:
    import torch

    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    lib_dir = os.path.join(torch_dir, "lib")
    # Built beside its final name and renamed into place, so that two processes
    # building at once (two ranks) never load a half-written library.
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(path))
        os.close(fd)
    except OSError as err:
        raise AllocatorUnavailable(f"its build folder {os.path.dirname(path)} is not writable "
                                   f"({err.strerror})") from None
    command = [compiler, "-O2", "-std=c++17", "-shared", "-fPIC",
               f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
               "-I", os.path.join(torch_dir, "include"), SOURCE, "-o", tmp,
               "-L", lib_dir, "-lc10", f"-Wl,-rpath,{lib_dir}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
            raise AllocatorUnavailable(f"building it failed ({first.strip()})")
        os.replace(tmp, path)
    except subprocess.TimeoutExpired:
        raise AllocatorUnavailable(f"building it took over {BUILD_TIMEOUT_S:.0f} s") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        compiler = _compiler()
        path = _library_path(compiler)
        if not os.path.isfile(path):
            _build(path, compiler)
        try:
            lib = ctypes.CDLL(path)
        except OSError as err:
            raise AllocatorUnavailable(f"loading {path} failed ({err})") from None
        lib.fastrl_install_caching_allocator.argtypes = (ctypes.c_size_t, ctypes.c_size_t)
        lib.fastrl_caching_allocator_stats.argtypes = (ctypes.POINTER(ctypes.c_size_t),)
        _lib = lib
    return _lib


def install(max_cached_bytes: int, min_bytes: int = MIN_BYTES) -> None:
    """Make this process's torch CPU tensors of `min_bytes` or more come from the
    cache (raises AllocatorUnavailable, one sentence, when it cannot be built).
    Calling it again only changes the two limits; 0 cached bytes is torch's own
    behaviour. Call it from one thread."""
    _load().fastrl_install_caching_allocator(int(min_bytes), int(max_cached_bytes))


def stats() -> dict:
    """Counts since install(): blocks reused, newly allocated and returned to the
    system, the bytes cached now and the blocks handed out and not yet freed."""
    out = (ctypes.c_size_t * len(STAT_FIELDS))()
    _load().fastrl_caching_allocator_stats(out)
    return dict(zip(STAT_FIELDS, (int(v) for v in out)))


def wanted(allocator: str, device_type: str) -> bool:
    """Whether a learner with --learner_allocator `allocator` on `device_type` uses
    the cache (a CUDA learner's tensors have torch's CUDA caching allocator)."""
    return allocator == "caching" and device_type == "cpu"


def learner_cache_bytes() -> int:
    return min(MAX_CACHE_BYTES, psutil.virtual_memory().total // 8)


@contextlib.contextmanager
def learner_memory(allocator: str, device: str = "cpu"):
    """For a block that times the learner's step (the planner's profile, --precision
    auto, the bench): its memory as the learner will have it, the cache on where
    the learner uses it, then emptied. Where it cannot be built, the learner runs
    with torch's own allocator, and so does the block."""
    import torch

    use = wanted(allocator, torch.device(device).type)
    if use:
        try:
            install(learner_cache_bytes())
        except AllocatorUnavailable:
            use = False
    try:
        yield
    finally:
        if use:
            install(0)
