"""Waiting on a faster-fifo queue without ever sleeping inside it.

A process SIGKILLed while waiting on a queue's process-shared condvar stays counted as
a waiter forever, and the next signal on it hangs with the queue's lock held, taking
every user of the queue with it. So no fastrl process blocks in a queue: each polls
with block=False and backs off between tries. Queues are sized to hold everything, so
a put's first try succeeds.
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
