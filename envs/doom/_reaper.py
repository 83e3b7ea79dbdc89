"""The reaper: removes a dead owner's ViZDoom games.

Each process that starts Doom games starts one reaper (`python -I -S _reaper.py
OWNER_PID`) and writes events to its stdin: `?` an init begins, `=` it ended,
`+ID PID` game ID runs engine PID, `-ID` game ID closed. EOF means the owner is gone,
however it died: the reaper kills the registered engines, unlinks their segments and,
if an init was under way, sweeps the unmapped segments created since. engine.py
imports its /proc and /dev/shm helpers, so it uses the standard library only.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time

SHM_DIR = "/dev/shm"
SHM_PREFIXES = ("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")
# A segment's name: one of the prefixes, then the game's instance id.
_SEGMENT_RE = re.compile(r"^(ViZDoomMQCtr|ViZDoomMQDoom|ViZDoomSM)([A-Za-z0-9]+)$")


def shm_names(instance_id: str) -> list:
    return [prefix + instance_id for prefix in SHM_PREFIXES]


def parse_segment(name: str):
    """(prefix, instance_id) for a ViZDoom segment name, else None."""
    m = _SEGMENT_RE.match(name)
    return (m.group(1), m.group(2)) if m else None


def _unlink(names, shm_dir: str) -> list:
    """Unlink each named segment; the names that were there to remove."""
    removed = []
    for name in names:
        try:
            os.unlink(os.path.join(shm_dir, name))
            removed.append(name)
        except OSError:
            pass
    return removed


def unlink_game_segments(instance_id: str, shm_dir: str = SHM_DIR) -> list:
    return _unlink(shm_names(instance_id), shm_dir)


def pid_alive(pid: int) -> bool:
    """True if the process (or thread id) exists and is not a zombie."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            data = f.read()
    except (OSError, ValueError):
        return False
    end = data.rfind(b")")
    return data[end + 2:end + 3] not in (b"Z", b"X", b"x")


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def engine_needle(instance_id: str) -> bytes:
    return b"+viz_instance_id\0" + instance_id.encode() + b"\0"


def is_engine_of(pid: int, instance_id: str) -> bool:
    return engine_needle(instance_id) in cmdline(pid) and pid_alive(pid)


def _all_pids():
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def mapped_paths(substring: str = "ViZDoom") -> set:
    """Paths containing `substring` that some live process maps; processes whose maps
    cannot be read are skipped (their segments could not be removed anyway)."""
    paths = set()
    needle = substring.encode()
    for pid in _all_pids():
        try:
            with open(f"/proc/{pid}/maps", "rb") as f:
                data = f.read()
        except OSError:
            continue
        if needle not in data:
            continue
        for line in data.split(b"\n"):
            if needle in line:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    paths.add(parts[5].decode(errors="replace").removesuffix(" (deleted)"))
    return paths


def stale_segments(shm_dir: str = SHM_DIR, grace_s: float = 10.0, newer_than: float | None = None) -> list:
    """ViZDoom segments no live process maps, modified over grace_s ago (a game being
    created exists briefly unmapped) and, with newer_than, since then."""
    try:
        names = [n for n in os.listdir(shm_dir) if parse_segment(n)]
    except OSError:
        return []
    if not names:
        return []
    in_use = mapped_paths()
    now = time.time()
    uid = os.getuid()
    stale = []
    for name in names:
        path = os.path.join(shm_dir, name)
        if path in in_use:
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        if st.st_uid != uid and uid != 0:
            continue
        if now - st.st_mtime < grace_s:
            continue
        if newer_than is not None and st.st_mtime < newer_than:
            continue
        stale.append(name)
    # A segment is stale only if its whole game is: keep every id with a segment mapped.
    live_ids = {parse_segment(os.path.basename(p))[1] for p in in_use if parse_segment(os.path.basename(p))}
    return [n for n in stale if parse_segment(n)[1] not in live_ids]


def remove_stale_segments(shm_dir: str = SHM_DIR, grace_s: float = 10.0, newer_than: float | None = None) -> list:
    return _unlink(stale_segments(shm_dir, grace_s, newer_than), shm_dir)


# An init under way at the owner's death has no id we know, and its engine may still
# map the segments for a moment after EOF (the parent-death signal arrives after the
# owner's files close). So the reaper looks again over a few seconds, removing a
# segment only when two looks in a row find it unmapped; a game another owner is
# creating is never unmapped that long.
SWEEP_DELAYS_S = (0.0, 0.5, 1.0, 1.5, 3.0)


def sweep_unregistered(newer_than: float, shm_dir: str = SHM_DIR, delays=SWEEP_DELAYS_S) -> list:
    """Unlink the ViZDoom segments modified since newer_than that no live
    process maps in two looks in a row; the names removed."""
    removed, unmapped_before = [], set()
    for delay in delays:
        time.sleep(delay)
        unmapped = set(stale_segments(shm_dir, grace_s=0.0, newer_than=newer_than))
        removed += _unlink(sorted(unmapped & unmapped_before), shm_dir)
        unmapped_before = unmapped - set(removed)
    return removed


def _kill_engine(pid: int, instance_id: str) -> None:
    # Check the command line first: the pid may have been reused.
    if is_engine_of(pid, instance_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def main(argv) -> int:
    # argv: _reaper.py OWNER_PID [SHM_DIR]; the folder is for tests.
    shm_dir = argv[2] if len(argv) > 2 else SHM_DIR
    # Ignore Ctrl-C, hang-ups and broadcast SIGTERMs: the reaper leaves after its owner.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    games = {}  # instance id -> engine pid
    pending = 0
    pending_since = None
    for raw in sys.stdin.buffer:
        line = raw.decode(errors="replace").strip()
        if not line:
            continue
        kind, rest = line[0], line[1:].split()
        if kind == "?":
            pending += 1
            if pending_since is None:
                pending_since = time.time() - 1.0  # generous: mtimes are coarse on some filesystems
        elif kind == "=":
            pending = max(0, pending - 1)
            if pending == 0:
                pending_since = None
        elif kind == "+" and len(rest) == 2 and rest[1].isdigit():
            games[rest[0]] = int(rest[1])
        elif kind == "-" and rest:
            games.pop(rest[0], None)
    # EOF: the owner is gone.
    for instance_id, pid in games.items():
        _kill_engine(pid, instance_id)
    deadline = time.time() + 2.0
    while time.time() < deadline and any(is_engine_of(p, i) for i, p in games.items()):
        time.sleep(0.02)
    for instance_id in games:
        unlink_game_segments(instance_id, shm_dir)
    if pending and pending_since is not None:
        sweep_unregistered(pending_since, shm_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
