"""Waiting on a faster-fifo queue without ever sleeping inside it.

A process SIGKILLed while it waits on a queue's process-shared condition
variable leaves glibc's condvar counting it as a waiter forever; the next
signal on that condvar then hangs in pthread_cond_signal, holding the queue's
lock, and every process using the queue hangs behind it. Measured here: one
killed waiter in a get stalled a whole run, and a killed policy worker made its
rollout workers hang on their next request; a putter killed while it waited on
a full queue (glibc 2.36) left the second get after it blocked for good, a get
with a 5-s timeout included. So no fastrl process blocks in a queue, on either
side: each polls with get_many(block=False) or put_many(block=False) and sleeps
between tries, starting short (an answer is often back within 100 us) and
doubling up to a millisecond while nothing comes. The put side costs nothing
in a run: fastrl's queues are sized to hold everything that can be in them at
once, so its first try succeeds; polling only makes sure that a queue filled by
a stalled reader cannot leave a dead waiter behind.
"""
from __future__ import annotations

import queue
import time

POLL_MIN_S, POLL_MAX_S = 0.00003, 0.001


def get_many_polling(q, timeout: float, max_messages: int = 1_000_000_000) -> list:
    """Up to `max_messages` messages from `q`, waiting at most `timeout` seconds
    for the first; raises queue.Empty if none came."""
    return _with_backoff(lambda: q.get_many(block=False, max_messages_to_get=max_messages), queue.Empty, timeout)


def put_many_polling(q, messages: list, timeout: float) -> None:
    """Put `messages` into `q` in one go, waiting at most `timeout` seconds for
    room; raises queue.Full if none came."""
    _with_backoff(lambda: q.put_many(messages, block=False), queue.Full, timeout)


def _with_backoff(attempt, not_yet: type, timeout: float):
    """attempt() until it stops raising `not_yet`, sleeping between tries as the
    module's docstring says; the last `not_yet` is raised once `timeout` has passed."""
    deadline = time.monotonic() + timeout
    pause = POLL_MIN_S
    while True:
        try:
            return attempt()
        except not_yet:
            if time.monotonic() >= deadline:
                raise
            time.sleep(pause)
            pause = min(2 * pause, POLL_MAX_S)
