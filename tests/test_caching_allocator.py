"""The learner's caching allocator: large blocks come back to the next request of
their size, tensors stay correct, the cache keeps to its cap, and a machine that
cannot build it gets one sentence. Each check runs in its own interpreter: the
allocator, once installed, serves every later tensor of its process."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import TrainRun

from fastrl.plumbing import caching_allocator

MB = 1 << 20
needs_compiler = pytest.mark.skipif(
    not any(shutil.which(c) for c in (os.environ.get("CXX") or "c++", "c++", "g++", "clang++")),
    reason="no C++ compiler on this machine to build the allocator with")


def in_fresh_process(code: str, tmp_path) -> dict:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_compiler
def test_a_freed_block_serves_the_next_request_of_its_size_and_tensors_stay_right(tmp_path):
    out = in_fresh_process(f"""
import json, torch
from fastrl.plumbing import caching_allocator as ca
ca.install(max_cached_bytes=64 * {MB}, min_bytes={MB})
a = torch.arange(1024 * 1024, dtype=torch.float32)  # 4 MB
first = a.data_ptr(); del a
b = torch.full((1024 * 1024,), 2.0)  # the same size: the same block
same = b.data_ptr() == first
c = b.clone() * 3  # other blocks, written and read
small = torch.ones(1000)  # under min_bytes: torch's own allocator
print(json.dumps({{"same": same, "sum": float(c.sum()), "b": float(b[7]), "small": float(small.sum()),
                  **ca.stats()}}))
""", tmp_path)
    assert out["same"] and out["sum"] == 6.0 * 1024 * 1024 and out["b"] == 2.0 and out["small"] == 1000.0
    # New blocks for arange, the clone and the product (the clone's then kept); full
    # reused arange's; b and c still live; the tiny tensor not counted.
    assert out["reused"] == 1 and out["allocated"] == 3 and out["live"] == 2


@needs_compiler
def test_the_cache_keeps_to_its_cap_and_the_newest_sizes_win(tmp_path):
    out = in_fresh_process(f"""
import json, torch
from fastrl.plumbing import caching_allocator as ca
ca.install(max_cached_bytes=10 * {MB}, min_bytes={MB})
seen = []
def mb(n): return torch.empty(n * {MB}, dtype=torch.uint8)
x, y = mb(4), mb(4); del x, y            # two 4-MB blocks kept: 8 MB
seen.append(ca.stats()["cached_bytes"])
z = mb(6); del z                          # a newer size: one 4-MB block makes room
seen.append(ca.stats()["cached_bytes"])
w = mb(20); del w                         # larger than the cap: straight back to the system
seen.append(ca.stats()["cached_bytes"])
again = mb(6); reused_6 = ca.stats()["reused"]; del again
ca.install(max_cached_bytes=0, min_bytes={MB})   # 0: keep nothing, return what was kept
seen.append(ca.stats()["cached_bytes"])
print(json.dumps({{"cached": seen, "reused": reused_6, **ca.stats()}}))
""", tmp_path)
    assert out["cached"] == [8 * MB, 10 * MB, 10 * MB, 0]
    assert out["reused"] == 1  # the 6-MB block came back
    # Returned: one 4-MB block (room for 6), the 20-MB one, then the last 4 and 6.
    assert out["returned"] == 4 and out["live"] == 0


def test_without_a_compiler_it_says_so_in_one_sentence(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(caching_allocator, "_lib", None)
    monkeypatch.setattr(caching_allocator.shutil, "which", lambda name: None)
    with pytest.raises(caching_allocator.AllocatorUnavailable, match=r"no C\+\+ compiler found"):
        caching_allocator.install(MB)


def test_a_build_that_fails_says_why_and_leaves_no_library(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(caching_allocator, "_lib", None)
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(caching_allocator, "SOURCE", str(broken))
    with pytest.raises(caching_allocator.AllocatorUnavailable, match="building it failed"):
        caching_allocator.install(MB)
    assert not list((tmp_path / "fastrl" / "allocator").glob("*.so"))


@needs_compiler
def test_a_damaged_or_foreign_architecture_library_is_built_again_once(tmp_path):
    # What a library built on another machine sharing the cache looks like to ctypes: no ELF it can load.
    out = in_fresh_process(f"""
import json, os, torch
from fastrl.plumbing import caching_allocator as ca
path = ca._library_path(ca._compiler())
os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
with open(path, "wb") as fh:
    fh.write(b"\\x7fELF not for this machine")
ca.install(max_cached_bytes=64 * {MB}, min_bytes={MB})
a = torch.ones(1024 * 1024); del a
b = torch.ones(1024 * 1024)
print(json.dumps({{"sum": float(b.sum()), **ca.stats()}}))
""", tmp_path)
    assert out["sum"] == 1024 * 1024 and out["reused"] == 1


@pytest.mark.parametrize("hostile", ["open folder", "foreign file", "link"])
def test_a_library_someone_else_could_have_placed_is_never_loaded(monkeypatch, tmp_path, hostile):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(caching_allocator, "_lib", None)
    monkeypatch.setattr(caching_allocator, "_compiler", lambda: "/usr/bin/c++")
    path = caching_allocator._library_path("/usr/bin/c++")
    os.makedirs(os.path.dirname(path))
    planted = tmp_path / "planted.so"
    planted.write_bytes(b"code someone else wrote")
    if hostile == "open folder":
        os.chmod(os.path.dirname(path), 0o777)
        shutil.copy(planted, path)
        words = "is writable by other users"
    elif hostile == "foreign file":
        if os.getuid() != 0:
            pytest.skip("giving a file to another user takes root")
        shutil.copy(planted, path)
        os.chown(path, 12345, 12345)
        words = "belongs to another user"
    else:
        os.symlink(planted, path)
        words = "is not a plain file"
    with pytest.raises(caching_allocator.AllocatorUnavailable, match=words):
        caching_allocator.install(MB)


def test_a_run_whose_learner_cannot_build_it_says_so_and_trains_on(tmp_path):
    # A C++ compiler that always fails stands for a machine without a working one.
    fake = tmp_path / "broken-c++"
    fake.write_text("#!/bin/sh\necho 'error: this compiler is broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    run = TrainRun(["--env", "CartPole-v1", "--train_for_env_frames", "4000", "--num_workers", "1", "--plan", "off",
                    "--train_dir", str(tmp_path / "runs")],
                   env={"CXX": str(fake), "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert run.wait(timeout=120) == 0, run.output()
    assert ("the learner's caching allocator is off: building it failed (error: this compiler is broken); "
            "it uses torch's own") in run.output()
    assert json.loads((tmp_path / "runs" / "CartPole-v1" / "summary.json").read_text())["env_frames"] >= 4000
