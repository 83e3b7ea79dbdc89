"""Freeing a faster-fifo queue whose lock a killed or hung process holds.

faster-fifo guards each queue with a non-robust process-shared mutex: a process
killed inside a put or get leaves it locked for good, and every later put or get
waits forever inside C, the runner's included.

A watch thread in the runner looks at every queue's lock once a second. A lock held
on two looks by a thread that no longer exists is released, and the queue repaired
as if its holder died just outside the lock (a half-written message is dropped).
That keeps every queue in place, where rebuilding them would need every process to
swap queues mid-run. A process of the run holding a lock longer than `hung_s` is
hung inside it (SIGSTOP, a debugger): the watch kills it and frees the lock later.

This reads glibc's 64-bit pthread_mutex_t and faster-fifo 1.5's struct Queue; a queue
whose header does not read back its own sizes is not watched.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from typing import Callable, Dict, Optional, Tuple

SIZE_BYTES = ctypes.sizeof(ctypes.c_size_t)  # faster-fifo's size prefix of each message


class _Mutex(ctypes.Structure):
    """glibc's pthread_mutex_t on 64-bit Linux (struct __pthread_mutex_s)."""
    _fields_ = [("lock", ctypes.c_int), ("count", ctypes.c_uint), ("owner", ctypes.c_int), ("nusers", ctypes.c_uint),
                ("kind", ctypes.c_int), ("spins", ctypes.c_short), ("elision", ctypes.c_short),
                ("prev", ctypes.c_void_p), ("next", ctypes.c_void_p)]


class _QueueHeader(ctypes.Structure):
    """faster-fifo 1.5's struct Queue, up to its mutex."""
    _fields_ = [("max_size_bytes", ctypes.c_size_t), ("maxsize", ctypes.c_size_t), ("head", ctypes.c_size_t),
                ("tail", ctypes.c_size_t), ("size", ctypes.c_size_t), ("num_elem", ctypes.c_size_t),
                ("mutex_attr", ctypes.c_int), ("mutex", _Mutex)]


def queue_header(q) -> Optional[_QueueHeader]:
    """The header in `q`'s shared memory, or None where its layout is not the one
    read here (another faster-fifo, another platform)."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        header = _QueueHeader.from_address(ctypes.addressof(q.queue_obj_buffer))
        made_with = (q.max_size_bytes, q.maxsize)
    except (AttributeError, TypeError):
        return None
    return header if (header.max_size_bytes, header.maxsize) == made_with else None


def thread_alive(tid: int) -> bool:
    """Whether thread (or process) `tid` exists and has not exited."""
    try:
        with open(f"/proc/{tid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X", b"x")


def holder(header: _QueueHeader) -> int:
    """The id of the thread holding the queue's lock, or 0 while it is free."""
    owner = header.mutex.owner
    return owner if header.mutex.lock and owner > 0 else 0


def process_of(tid: int) -> int:
    """The process whose thread `tid` is, or 0 once it is gone."""
    try:
        with open(f"/proc/{tid}/status") as fh:
            return next((int(line.split()[1]) for line in fh if line.startswith("Tgid:")), 0)
    except OSError:
        return 0


def _read(buffer, at: int, n: int) -> bytes:
    """`n` bytes of the circular buffer from `at`, wrapping at its end."""
    end = at + n
    if end <= len(buffer):
        return bytes(buffer[at:end])
    return bytes(buffer[at:]) + bytes(buffer[:end - len(buffer)])


def repair(header: _QueueHeader, buffer) -> int:
    """Cut the queue, whose lock a dead process holds, back to its last whole message;
    returns the bytes cut (a size prefix whose body was never written)."""
    at, left, count = header.head, header.size, 0
    while left >= SIZE_BYTES:
        body = int.from_bytes(_read(buffer, at, SIZE_BYTES), sys.byteorder)
        if SIZE_BYTES + body > left:
            break
        at = (at + SIZE_BYTES + body) % header.max_size_bytes
        left -= SIZE_BYTES + body
        count += 1
    header.tail = at
    header.size -= left
    header.num_elem = count
    return left


def free(q, header: _QueueHeader) -> int:
    """Repair `q` and release its lock, held by a dead thread; returns the bytes
    dropped. glibc unlocks a plain mutex for any caller."""
    cut = repair(header, q.shared_memory)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.pthread_mutex_unlock(ctypes.byref(header.mutex))
    return cut


class QueueLockWatch:
    """Every `every_s`, free any queue whose lock the same dead thread held at the last
    look, kill a child of this process that has held one for over `hung_s`, and tell
    `say` what was done."""

    def __init__(self, queues: Dict[str, object], say: Callable[[str], None], hung_s: float, every_s: float = 1.0):
        self.headers = {name: (q, h) for name, q in queues.items() if (h := queue_header(q)) is not None}
        self.say, self.hung_s, self.every_s = say, hung_s, every_s
        self._seen: Dict[str, Tuple[int, float]] = {}  # queue name -> (its holder, since when seen holding it)

    def look(self) -> list:
        """One look at every lock; the names of the queues freed."""
        freed, seen, now = [], {}, time.monotonic()
        for name, (q, header) in self.headers.items():
            tid = holder(header)
            if not tid:
                continue
            since = self._seen[name][1] if self._seen.get(name, (0,))[0] == tid else None
            if since is not None and not thread_alive(tid):
                cut = free(q, header)
                dropped = " and dropped the message it was writing" if cut else ""
                self.say(f"the {name} queue's lock was held by thread {tid}, which is gone; freed it{dropped}.")
                freed.append(name)
                continue
            if since is not None and now - since > self.hung_s:
                self._kill_hung(name, tid)
                continue  # seen afresh at the next look, dead: freed at the one after
            seen[name] = (tid, now if since is None else since)
        self._seen = seen
        return freed

    def _kill_hung(self, name: str, tid: int) -> None:
        """SIGKILL the process of `tid` if it is a child of this one; a later look frees its lock."""
        import psutil

        pid = process_of(tid)
        if pid not in {p.pid for p in psutil.Process().children(recursive=True)}:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            return
        self.say(f"pid {pid} held the {name} queue's lock for over {self.hung_s:g} s, hung inside it; killed it.")

    def start(self) -> None:
        # A thread, not the runner's loop: the loop may be the one waiting on the lock.
        self._stop = threading.Event()

        def run():
            while not self._stop.wait(self.every_s):
                self.look()

        self._thread = threading.Thread(target=run, name="queue-lock-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
