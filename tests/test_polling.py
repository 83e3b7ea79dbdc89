"""Queues polled on both sides (fastrl/plumbing/polling.py): a process SIGKILLed
while it waits for room in a full queue must leave that queue usable.

With faster-fifo's own blocking put, the dead waiter stays counted on the queue's
process-shared condvar and a later get, signalling it, hangs inside glibc with
the queue's lock held. The first test shows that on this machine (and is
skipped, saying so, where a faster-fifo or glibc release makes it safe); the
second runs the same scenario with fastrl's polling put."""
import ast
import multiprocessing
import os
import pathlib
import queue
import signal
import sys
import time

import faster_fifo
import psutil
import pytest

from fastrl.plumbing.polling import get_many_polling, put_many_polling

MP = multiprocessing.get_context("fork")  # children map the queue at the same address
FASTRL = pathlib.Path(__file__).resolve().parent.parent / "fastrl"


def blocking_put(q):
    q.put("waiting", block=True, timeout=60.0)


def polling_put(q):
    put_many_polling(q, ["waiting"], 60.0)


def dead_waiter_then_traffic(put, rounds: int = 3):
    """In a child: a full queue; each round a putter waiting for room is killed,
    then a live putter waits for room, a get frees it and the live putter's
    message arrives. Exits 0 once every round went through."""
    q = faster_fifo.Queue(max_size_bytes=100_000, maxsize=1)
    q.put_many(["full"], block=False)
    for _ in range(rounds):
        victim = MP.Process(target=put, args=(q,))
        victim.start()
        time.sleep(0.5)  # long enough to be waiting for room
        os.kill(victim.pid, signal.SIGKILL)
        victim.join()
        live = MP.Process(target=put, args=(q,))
        live.start()
        time.sleep(0.5)
        get_many_polling(q, 5.0)  # room for the live putter
        live.join(5.0)
        if live.exitcode != 0:
            sys.exit(1)
        if get_many_polling(q, 5.0) != ["waiting"]:
            sys.exit(1)
        q.put_many(["full"], block=False)
    sys.exit(0)


def run_scenario(put, seconds: float):
    scenario = MP.Process(target=dead_waiter_then_traffic, args=(put,))
    scenario.start()
    scenario.join(seconds)
    finished = not scenario.is_alive()
    if not finished:  # wedged: the scenario and the putter still waiting under it
        for proc in [*psutil.Process(scenario.pid).children(recursive=True), psutil.Process(scenario.pid)]:
            proc.kill()
        scenario.join()
    return finished, scenario.exitcode


def test_a_putter_killed_waiting_in_faster_fifo_wedges_the_queue():
    finished, _ = run_scenario(blocking_put, seconds=10.0)
    if finished:  # another glibc or faster-fifo: nothing wrong with fastrl, but say so
        pytest.skip("faster-fifo's blocking put survived a killed waiter on this machine: "
                    "polling.py's reason for the put side does not hold here")


def test_a_putter_killed_while_polling_for_room_leaves_the_queue_working():
    finished, code = run_scenario(polling_put, seconds=30.0)
    assert finished and code == 0


def test_put_many_polling_puts_when_there_is_room_and_gives_up_at_its_timeout():
    q = faster_fifo.Queue(max_size_bytes=100_000, maxsize=2)
    put_many_polling(q, ["a", "b"], 1.0)
    started = time.monotonic()
    with pytest.raises(queue.Full):
        put_many_polling(q, ["c"], 0.2)
    assert time.monotonic() - started >= 0.2
    assert get_many_polling(q, 1.0) == ["a", "b"]


def test_no_fastrl_process_waits_inside_a_queue():
    """block=True anywhere in fastrl/, or a faster-fifo put_many/get_many left at
    its blocking default, would bring the hazard back."""
    blocking = []
    for path in FASTRL.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            block = {kw.arg: kw.value for kw in node.keywords}.get("block")
            polls = isinstance(block, ast.Constant) and block.value is False
            faster_fifo_call = isinstance(node.func, ast.Attribute) and node.func.attr in ("put_many", "get_many")
            if (block is not None or faster_fifo_call) and not polls:
                blocking.append(f"{path.relative_to(FASTRL.parent)}:{node.lineno}")
    assert blocking == []
