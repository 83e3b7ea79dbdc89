"""How long the GPU spends on a process's work, without making the process wait.

A wall-clock timer around GPU work measures the host; CUDA events before and after
the work are stamped by the GPU, so their difference is the device time of the span
(an upper bound on busy time: it includes gaps waiting on the host). Spans are read
only once their end event has fired (`collect`, once per loop), so the counters trail
the work by a batch at most. On a CPU `for_device` returns a clock that records nothing.
"""

from collections import deque
from contextlib import contextmanager
from typing import Deque, Tuple

import torch

# Pending spans before the oldest is read blocking, so the deque stays bounded.
MAX_PENDING = 64


class DeviceClock:
    """Accumulates device seconds of spans of GPU work into fields of a board row
    (anything with `add(field, seconds)`)."""

    @staticmethod
    def for_device(device, row) -> "DeviceClock":
        device = torch.device(device)
        if device.type == "cuda":
            return DeviceClock(row, lambda: torch.cuda.Event(enable_timing=True), torch.cuda.current_stream)
        return NullClock()

    def __init__(self, row, new_event, current_stream):
        self._row = row
        self._new_event = new_event  # a factory, so tests can hand in fake events
        self._current_stream = current_stream
        self._pending: Deque[Tuple[str, object, object]] = deque()

    @contextmanager
    def span(self, field: str):
        """Time the GPU work enqueued on the current stream inside the block."""
        start = self._new_event()
        start.record(self._current_stream())
        yield
        end = self._new_event()
        end.record(self._current_stream())
        self.add_events(field, start, end)

    def add_events(self, field: str, start, end) -> None:
        """Count the span between two events already recorded (on any stream)."""
        self._pending.append((field, start, end))
        if len(self._pending) > MAX_PENDING:
            self._pending[0][2].synchronize()
            self._add_oldest()

    def collect(self) -> None:
        """Add every finished span, in order, to the board; leave the rest pending."""
        while self._pending and self._pending[0][2].query():
            self._add_oldest()

    def _add_oldest(self) -> None:
        field, start, end = self._pending.popleft()
        self._row.add(field, start.elapsed_time(end) / 1000.0)  # elapsed_time is in milliseconds


class NullClock(DeviceClock):
    """A CPU device's clock: nothing runs on a GPU, so nothing is recorded."""

    def __init__(self):
        super().__init__(None, None, None)

    @contextmanager
    def span(self, field: str):
        yield

    def add_events(self, field: str, start, end) -> None:
        pass

    def collect(self) -> None:
        pass
