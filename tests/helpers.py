"""Running the real command line in tests, and checking it left nothing behind."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))
# The environment a run needs to use the test envs (slow_env, faulty_env, seed_log_env):
# its children make them by id, importing the module named before the colon from
# their PYTHONPATH.
TEST_ENVS_ON_PATH = {"PYTHONPATH": os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)}


def shm_entries() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


class TrainRun:
    """`python -m <module> ARGS` as a user starts it, in its own session (so a
    Ctrl-C can be sent to its whole process group, as a terminal does), with the
    pids of every descendant seen while it ran."""

    def __init__(self, args: list, module: str = "fastrl.train", env: dict | None = None):
        self.shm_before = shm_entries()
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=full_env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: list = []
        self.descendants: set = set()
        self.titles: dict = {}  # pid -> process title, as ps shows it
        # A thread drains the pipe so that the run never blocks on a full pipe and
        # reads here never block on a quiet one.
        self._lines: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _take_lines(self, timeout: float) -> bool:
        """Move available output into self.lines; False once the output has ended."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            return True
        while line is not None:
            self.lines.append(line)
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return True
        return False

    def _note_descendants(self) -> None:
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.descendants.add(child.pid)
                try:
                    self.titles[child.pid] = " ".join(child.cmdline())
                except psutil.Error:
                    pass
        except psutil.NoSuchProcess:
            pass

    def worker_titles(self) -> list:
        """Titles of the fastrl components seen (the process server is not one)."""
        return sorted(t for t in self.titles.values() if t.startswith("fastrl:"))

    def wait_for_line(self, predicate, timeout: float) -> str:
        """Read output until a line satisfies predicate; fail on exit or timeout."""
        deadline = time.time() + timeout
        seen = 0
        while time.time() < deadline:
            self._note_descendants()
            more = self._take_lines(0.05)
            for line in self.lines[seen:]:
                if predicate(line):
                    return line
            seen = len(self.lines)
            if not more:
                raise AssertionError("the run exited before the expected line:\n" + self.output())
        raise AssertionError(f"no expected line within {timeout} s:\n" + self.output())

    def wait(self, timeout: float) -> int:
        deadline = time.time() + timeout
        while self.proc.poll() is None and time.time() < deadline:
            self._note_descendants()
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.kill_all()
            raise AssertionError(f"the run did not finish within {timeout} s:\n" + self.output())
        self._reader.join(10)
        self._take_lines(0)
        return self.proc.returncode

    def output(self) -> str:
        return "\n".join(self.lines)

    def signal_group(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def leftover_processes(self, grace: float = 5.0) -> list:
        """Descendants still alive `grace` seconds after the run ended."""
        deadline = time.time() + grace
        while True:
            alive = [p for p in self.descendants if psutil.pid_exists(p) and
                     psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            if not alive or time.time() > deadline:
                return alive
            time.sleep(0.1)

    def new_shm_entries(self) -> set:
        return shm_entries() - self.shm_before

    def kill_all(self) -> None:
        for pid in self.descendants | {self.proc.pid}:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def read_summary(train_dir, experiment: str) -> dict:
    with open(os.path.join(train_dir, experiment, "summary.json")) as fh:
        return json.load(fh)
