"""Waiting on a faster-fifo queue without ever sleeping inside it.

A process SIGKILLed while it waits on a queue's process-shared condition
variable leaves glibc's condvar counting it as a waiter forever; the next put
into that queue then hangs in pthread_cond_signal, and so does the process
putting (measured here: one killed waiter stalled a whole run, and a killed
policy worker made its rollout workers hang on their next request). So no
fastrl process blocks in a queue: each polls with get_many(block=False) and
sleeps between polls, starting short (an answer is often back within 100 us)
and doubling up to a millisecond while nothing comes.
"""
from __future__ import annotations

import queue
import time

POLL_MIN_S, POLL_MAX_S = 0.00003, 0.001


def get_many_polling(q, timeout: float, max_messages: int = 1_000_000_000) -> list:
    """Up to `max_messages` messages from `q`, waiting at most `timeout` seconds
    for the first; raises queue.Empty if none came."""
    deadline = time.monotonic() + timeout
    pause = POLL_MIN_S
    while True:
        try:
            return q.get_many(block=False, max_messages_to_get=max_messages)
        except queue.Empty:
            if time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX_S)
