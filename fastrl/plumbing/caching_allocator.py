"""A caching allocator for the CPU learner's large tensors.

Every learner step allocates and frees the same large tensors. glibc serves them with
fresh mmaps and unmaps them on free, so each step lands on new pages the kernel must
zero, and the learner's memory swings widely; telling glibc never to mmap grows the
heap without bound instead. This allocator (caching_allocator.cpp) sits in front of
torch's: blocks of at least `min_bytes` are kept when freed, up to `max_cached_bytes`,
and reused for the next request of the same size; sizes no longer asked for make
room for new ones. C++ because torch calls its allocator from C++; built once per torch
version with the machine's compiler and cached under ~/.cache/fastrl/allocator, loaded only
from a folder and file of this user that nobody else may write.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from typing import Optional

import psutil

from fastrl.plumbing.files import not_safely_ours, user_cache

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "caching_allocator.cpp")
BUILD_TIMEOUT_S = 120.0
MIN_BYTES = 1 << 20  # smaller blocks glibc serves from its heap, reused without the kernel
# What a learner's cache may hold, whatever its batch: an eighth of memory, at most this.
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

    # One build per source, torch, compiler, architecture and C++ ABI: a cache folder shared by
    # machines or by two torch builds must never hand one the other's library.
    build = f"{torch.__version__} {compiler} {platform.machine()} {int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    with open(SOURCE, "rb") as fh:
        key = hashlib.sha1(fh.read() + build.encode()).hexdigest()[:16]
    return os.path.join(user_cache("allocator"), f"caching_allocator_{key}.so")


def _build(path: str, compiler: str) -> None:
    import torch

    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    lib_dir = os.path.join(torch_dir, "lib")
    # Built beside its final name and renamed in, so concurrent builds never load half a file.
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
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
            lib = _load_if_ours(path)
        except OSError:  # damaged, or built for another machine: built again, once
            os.unlink(path)
            _build(path, compiler)
            try:
                lib = _load_if_ours(path)
            except OSError as err:
                raise AllocatorUnavailable(f"loading {path} failed ({err})") from None
        lib.fastrl_install_caching_allocator.argtypes = (ctypes.c_size_t, ctypes.c_size_t)
        lib.fastrl_caching_allocator_stats.argtypes = (ctypes.POINTER(ctypes.c_size_t),)
        _lib = lib
    return _lib


def _load_if_ours(path: str) -> ctypes.CDLL:
    why = not_safely_ours(os.path.dirname(path), folder=True) or not_safely_ours(path, folder=False)
    if why:
        raise AllocatorUnavailable(f"it is not loaded from where another user could have put it: {why}")
    return ctypes.CDLL(path)


def install(max_cached_bytes: int, min_bytes: int = MIN_BYTES) -> None:
    """Serve this process's torch CPU tensors of `min_bytes` or more from the cache
    (AllocatorUnavailable if it cannot be built). Calling again changes the limits;
    0 cached bytes is torch's own behaviour. Call from one thread."""
    _load().fastrl_install_caching_allocator(int(min_bytes), int(max_cached_bytes))


def stats() -> dict:
    """Counts since install(): blocks reused, allocated and returned, bytes cached, live blocks."""
    out = (ctypes.c_size_t * len(STAT_FIELDS))()
    _load().fastrl_caching_allocator_stats(out)
    return dict(zip(STAT_FIELDS, (int(v) for v in out)))


def wanted(allocator: str, device_type: str) -> bool:
    """Whether the learner uses the cache: CPU only, CUDA has torch's own."""
    return allocator == "caching" and device_type == "cpu"


def learner_cache_bytes() -> int:
    return min(MAX_CACHE_BYTES, psutil.virtual_memory().total // 8)


@contextlib.contextmanager
def learner_memory(allocator: str, device: str = "cpu"):
    """Around a block that times the learner's step: the cache installed where the
    learner would use it, then emptied."""
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
