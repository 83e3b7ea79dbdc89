"""The queue-lock hazard of issue 21, reproduced without timing luck, and the
runner's lock watch that repairs it (fastrl/plumbing/queue_locks.py).

A child takes a faster-fifo queue's very mutex through libc, as each put and get
does for a few microseconds, and is SIGKILLed while it holds it. faster-fifo 1.5's
mutex is not robust (cpp_lib/faster_fifo.cpp sets it process-shared only), so the
lock stays held by the dead, and every later call on the queue waits forever,
get_many(block=False) included: fastrl's polling is no way around it. The first
test and the waiting getter pin that down, and fail if a faster-fifo release makes
the lock robust; the others show the watch setting such a queue free, and
killing a process stopped inside the lock, which would hold it as long.
(tests/test_reliability.py kills a real rollout worker holding a real run's lock.)"""
import ctypes
import errno
import math
import multiprocessing
import os
import queue
import signal
import sys
import time

import faster_fifo
import psutil
import pytest

from fastrl.plumbing.queue_locks import SIZE_BYTES, QueueLockWatch, queue_header

libc = ctypes.CDLL(None, use_errno=True)
SYS_FUTEX = 202  # x86-64
PTHREAD_MUTEX_ROBUST_BIT = 16  # in glibc's __kind
MP = multiprocessing.get_context("fork")  # children map the queue at the same address


def header_of(q):
    header = queue_header(q)
    if header is None:
        pytest.skip("this faster-fifo or platform lays a queue out unlike faster-fifo 1.5 on 64-bit Linux")
    return header


def hold_the_lock(q, ready, half_written: bool, then_stop: bool = False) -> None:
    """In a child: take the queue's lock as a put or get does, optionally write half
    a message as a put killed mid-way leaves it (the size prefix written and
    counted, not the body), say so, and wait (stopped, if `then_stop`)."""
    header = header_of(q)
    rc = libc.pthread_mutex_lock(ctypes.byref(header.mutex))
    if half_written:
        at = header.tail
        ctypes.memmove(ctypes.addressof(q.shared_memory) + at, (100).to_bytes(SIZE_BYTES, sys.byteorder), SIZE_BYTES)
        header.tail, header.size = at + SIZE_BYTES, header.size + SIZE_BYTES
    ready.send(rc)
    if then_stop:
        os.kill(os.getpid(), signal.SIGSTOP)
    signal.pause()


def get_once(q) -> None:
    """In a child: one non-blocking get, as fastrl's polling does; exit 0 if it
    returned the message the queue was made with."""
    try:
        got = q.get_many(block=False)
    except queue.Empty:
        got = []
    sys.exit(0 if got == ["a message"] else 1)


def orphan(half_written: bool = False):
    """A queue holding "a message", whose lock a SIGKILLed child held; returns
    (queue, its header, the dead pid)."""
    q = faster_fifo.Queue(max_size_bytes=100_000, maxsize=1_000)
    q.put("a message")
    header = header_of(q)
    ready, ready_in_child = MP.Pipe()
    holder = MP.Process(target=hold_the_lock, args=(q, ready_in_child, half_written))
    holder.start()
    assert ready.poll(30) and ready.recv() == 0
    assert header.mutex.lock != 0 and header.mutex.owner == holder.pid
    os.kill(holder.pid, signal.SIGKILL)
    holder.join(10)
    assert holder.exitcode == -signal.SIGKILL
    return q, header, holder.pid


def futex_wait_address(pid: int):
    """The address `pid` waits on in a futex call, or None while it is in no such call."""
    try:
        with open(f"/proc/{pid}/syscall") as fh:
            fields = fh.read().split()
    except OSError:
        return None
    return int(fields[1], 16) if fields and fields[0] == str(SYS_FUTEX) else None


def waiting_getter(q, header):
    """A child doing one non-blocking get on `q`, once it waits on the queue's lock.
    Not a timing bound: it either returns (exits) or parks in the kernel on the
    lock's own word."""
    getter = MP.Process(target=get_once, args=(q,))
    getter.start()
    deadline = time.time() + 30
    while futex_wait_address(getter.pid) != ctypes.addressof(header.mutex):
        assert getter.is_alive(), "the non-blocking get returned: the lock was not held"
        assert time.time() < deadline, "the getter neither returned nor waited on the queue's lock in 30 s"
        time.sleep(0.05)
    return getter


def test_a_lock_whose_holder_was_killed_stays_held_by_the_dead():
    _, header, dead = orphan()
    assert not header.mutex.kind & PTHREAD_MUTEX_ROBUST_BIT
    assert header.mutex.owner == dead and not os.path.exists(f"/proc/{dead}")
    # A robust mutex would answer EOWNERDEAD here and hand the lock over.
    assert libc.pthread_mutex_trylock(ctypes.byref(header.mutex)) == errno.EBUSY


def test_the_watch_frees_the_lock_on_its_second_look_and_the_waiting_get_goes_on():
    q, header, dead = orphan()
    getter = waiting_getter(q, header)
    said = []
    watch = QueueLockWatch({"test": q}, said.append, hung_s=math.inf)
    try:
        assert watch.look() == []  # a holder seen dead once may be a torn read
        assert watch.look() == ["test"]
        getter.join(30)
        assert getter.exitcode == 0  # it got the message that was in the queue
    finally:
        getter.kill()
        getter.join(10)
    assert said == [f"the test queue's lock was held by thread {dead}, which is gone; freed it."]
    q.put("after")
    assert q.get_many(block=False) == ["after"] and watch.look() == []


def test_a_message_half_written_by_the_dead_holder_is_dropped_and_the_rest_kept():
    q, header, _ = orphan(half_written=True)
    said = []
    watch = QueueLockWatch({"test": q}, said.append, hung_s=math.inf)
    watch.look()
    assert watch.look() == ["test"] and said[0].endswith("freed it and dropped the message it was writing.")
    assert q.get_many(block=False) == ["a message"]
    with pytest.raises(queue.Empty):
        q.get_many(block=False)
    q.put("after")
    assert q.get_many(block=False) == ["after"]


def test_a_lock_held_by_a_live_process_is_left_alone():
    q = faster_fifo.Queue(max_size_bytes=100_000)
    header = header_of(q)
    assert libc.pthread_mutex_lock(ctypes.byref(header.mutex)) == 0  # held by this very process
    try:
        watch = QueueLockWatch({"test": q}, pytest.fail, hung_s=math.inf)
        assert watch.look() == [] and watch.look() == []
    finally:
        libc.pthread_mutex_unlock(ctypes.byref(header.mutex))


def test_a_process_stopped_holding_a_lock_is_killed_as_hung_and_the_lock_freed():
    # A SIGSTOP (a chaos test's "hang") landing inside a queue call: everyone who
    # uses the queue waits with it, the runner's supervision too, for as long as it stays stopped.
    q = faster_fifo.Queue(max_size_bytes=100_000)
    header = header_of(q)
    ready, ready_in_child = MP.Pipe()
    holder = MP.Process(target=hold_the_lock, args=(q, ready_in_child, False, True))
    holder.start()
    assert ready.poll(30) and ready.recv() == 0
    deadline = time.time() + 30
    while psutil.Process(holder.pid).status() != psutil.STATUS_STOPPED:
        assert time.time() < deadline, "the holder did not stop itself in 30 s"
        time.sleep(0.01)
    assert header.mutex.owner == holder.pid
    said = []
    watch = QueueLockWatch({"test": q}, said.append, hung_s=0.0)
    try:
        assert watch.look() == []  # first seen holding it
        assert watch.look() == []  # held since the look before, longer than hung_s: killed
        holder.join(30)
        assert holder.exitcode == -signal.SIGKILL
        assert watch.look() == [] and watch.look() == ["test"]
    finally:
        holder.kill()
        holder.join(10)
    assert said == [f"pid {holder.pid} held the test queue's lock for over 0 s, hung inside it; killed it.",
                    f"the test queue's lock was held by thread {holder.pid}, which is gone; freed it."]
    q.put("after")
    assert q.get_many(block=False) == ["after"]
