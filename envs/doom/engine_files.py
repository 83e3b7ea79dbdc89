"""ViZDoom's engine laid out to start cheaper: a copy of its binary beside its
resource file, vizdoom.pk3, re-packed uncompressed, as inflating it is a large share
of an engine's start-up CPU and plans start dozens of engines.

The engine looks for its pk3 beside /proc/self/exe, so the binary is copied (a link
would find the original pk3); the other files beside it are linked, and so is the
wheel's library folder its RPATH names. An engine that fails during init crashes its
host, so the copy is used only once the dynamic loader resolves all its libraries;
otherwise ViZDoom's own binary runs.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from typing import Optional

from fastrl.envs.doom._reaper import pid_alive

ENGINE = "vizdoom"
RESOURCES = "vizdoom.pk3"
LIBRARIES = "vizdoom.libs"  # the folder the binary's RPATH names, beside its own folder
PREFIX = "doom-engine-files-"  # then a key of ViZDoom's files; a build in progress ends in .PID.tmp


def stored_engine(vizdoom_dir: str, directory: str) -> Optional[str]:
    """The engine copy with the stored pk3 under `directory` (made on first use, keyed
    by ViZDoom's files), or None where it cannot be made or would not start."""
    engine, resources = os.path.join(vizdoom_dir, ENGINE), os.path.join(vizdoom_dir, RESOURCES)
    try:
        key = _key(engine, resources)
        home = os.path.join(directory, f"{PREFIX}{key}")
        if not os.path.isdir(home):
            _remove_abandoned(directory)
            _build(home, engine, resources, os.path.join(os.path.dirname(vizdoom_dir), LIBRARIES))
        copy = os.path.join(home, "bin", ENGINE)
        return copy if _loads(copy) and _pk3_whole(os.path.join(home, "bin", RESOURCES)) else None
    except (OSError, zipfile.BadZipFile, subprocess.SubprocessError):
        return None


def _key(*paths: str) -> str:
    stamp = "|".join(f"{p}:{os.stat(p).st_size}:{os.stat(p).st_mtime_ns}" for p in paths)
    return hashlib.sha1(stamp.encode()).hexdigest()[:12]


def _remove_abandoned(directory: str) -> None:
    """Builds left half-made by a process killed in the middle (its pid is gone)."""
    for name in os.listdir(directory):
        if name.startswith(PREFIX) and name.endswith(".tmp"):
            pid = name[:-len(".tmp")].rsplit(".", 1)[-1]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _build(home: str, engine: str, resources: str, libraries: str) -> None:
    """Make `home` whole or not at all (built under a temporary name and renamed); a
    process that loses the race uses the winner's."""
    tmp = f"{home}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(os.path.join(tmp, "bin"), mode=0o700)
    shutil.copy2(engine, os.path.join(tmp, "bin", ENGINE))
    _repack_stored(resources, os.path.join(tmp, "bin", RESOURCES))
    # What else the engine reads beside itself (bots.cfg, the IWADs) is linked.
    source = os.path.dirname(engine)
    for name in os.listdir(source):
        if name not in (ENGINE, RESOURCES):
            os.symlink(os.path.join(source, name), os.path.join(tmp, "bin", name))
    if os.path.isdir(libraries):  # a wheel's bundled libraries; a source build uses the system's
        os.symlink(libraries, os.path.join(tmp, LIBRARIES))
    try:
        os.rename(tmp, home)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(home):
            raise


def _repack_stored(source: str, target: str) -> None:
    """The same entries, names, dates and bytes, none compressed."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", compression=zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            entry = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            entry.external_attr = info.external_attr
            out.writestr(entry, src.read(info))


def _pk3_whole(path: str) -> bool:
    with zipfile.ZipFile(path) as pk3:
        return pk3.testzip() is None


def _loads(binary: str) -> bool:
    """Whether the dynamic loader finds every library `binary` needs (and the file
    may be executed here: not on a noexec mount)."""
    out = subprocess.run([binary], env={"LD_TRACE_LOADED_OBJECTS": "1"}, capture_output=True, text=True,
                         timeout=30)
    return out.returncode == 0 and "not found" not in out.stdout
