"""Small files that are always whole (config.json, plan.json, summary.json, cached
profiles): a reader finds the old file or the new one, never half. Also whether a path
can be written, and where fastrl keeps what outlives a run."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from typing import Optional

# A full disk and a spent quota: no retry or restart helps until the user frees space.
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """A write refused for want of space, said in one sentence naming what could not be
    written and where. `explained`: a child process reports its sentence, not a traceback."""

    explained = True

    def __init__(self, path: str, what: str, err_no: int = errno.ENOSPC):
        super().__init__(err_no, os.strerror(err_no), path)
        self.what = what

    def __str__(self) -> str:
        folder = os.path.dirname(os.path.abspath(self.filename))
        return (f"{self.what} could not be written, as the disk holding {folder} is full ({self.strerror}); "
                "free space there, then run the command again")

    def __reduce__(self):
        return type(self), (self.filename, self.what, self.errno)


@contextlib.contextmanager
def writing(path: str, what: str):
    """Turn a full disk met by the block's writes to `path` into a DiskFullError naming `what`."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as err:
        if err.errno in NO_SPACE:
            raise DiskFullError(path, what, err.errno) from None
        raise


def free_bytes(path: str) -> int:
    """Bytes this user may still write on the disk holding `path` (its nearest existing folder)."""
    while not os.path.isdir(path):
        path = os.path.dirname(path) or "."
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def write_json(path: str, data, **dump_options) -> None:
    """json.dump `data` into `path` atomically (a temp file named by pid, renamed over
    it). Not fsynced, unlike checkpoints: a power cut may lose the newest of these
    files, which the next run rewrites, and a run should not wait on the disk.
    DiskFullError, the old file left as it was, when the disk is full."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with writing(path, os.path.basename(path)):
            with open(tmp, "w") as fh:
                json.dump(data, fh, **dump_options)
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def user_cache(name: str) -> str:
    """fastrl's folder `name` in the user's cache (XDG_CACHE_HOME, else ~/.cache):
    what a machine's later runs reuse, kept across reboots, unlike /tmp."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fastrl", name)


def not_safely_ours(path: str, folder: bool) -> Optional[str]:
    """Why code loaded from `path` (a folder, or a file) could be someone else's, or None:
    it must be this user's and writable by nobody else, as links and foreign files in a
    cache would run another user's code in every run."""
    try:
        st = os.lstat(path)
    except OSError as err:
        return f"{path} cannot be read ({err.strerror})"
    kind = stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)
    if not kind:
        return f"{path} is not a {'folder' if folder else 'plain file'}"
    if st.st_uid != os.getuid():
        return f"{path} belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by other users"
    return None


def cannot_write(path: str, folder: bool = False) -> Optional[str]:
    """Why `path` cannot be written, or None: a file, or with folder=True a folder,
    missing parents included. Found out by trying (os.access is wrong for root on
    /proc and knows nothing of read-only mounts); whatever is made is removed again."""
    path = os.path.abspath(path)
    holder = path if folder else os.path.dirname(path)
    if not folder and os.path.isdir(path):
        return f"{path} is a folder"
    made = []
    try:
        missing, probe = [], holder
        while not os.path.lexists(probe):
            missing.append(probe)
            probe = os.path.dirname(probe)
        for directory in reversed(missing):
            os.mkdir(directory)
            made.append(directory)
        fd, tmp = tempfile.mkstemp(dir=holder, prefix=".fastrl-probe-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        # "Not a directory" names no path: name the file that stands where a folder must.
        blocker = next((p for p in _self_and_parents(holder) if os.path.lexists(p) and not os.path.isdir(p)), None)
        return f"{blocker} is not a folder" if blocker else err.strerror or str(err)
    finally:
        for directory in reversed(made):
            os.rmdir(directory)
    return None


def _self_and_parents(path: str):
    while True:
        yield path
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent
