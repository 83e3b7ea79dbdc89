"""Small files that are always whole: config.json, plan.json, summary.json, the
cached profiles, a bench report. A reader (a resumed run, enjoy, a script polling
summary.json as a run ends) finds the old file or the new one, never half of one."""
from __future__ import annotations

import contextlib
import json
import os


def write_json(path: str, data, **dump_options) -> None:
    """json.dump `data` into `path` atomically: into a temporary file beside it,
    then renamed over it (atomic on POSIX).

    The temporary name carries the pid, so two processes writing one path (two
    runs caching the same profile) cannot write into each other's file. Unlike a
    checkpoint (learning/checkpoint.py) nothing is fsynced: a power cut may lose
    the newest of these files, which the next run writes again, and a run should
    not wait on the disk for them."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as fh:
            json.dump(data, fh, **dump_options)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
