"""Running the real command line in tests, and checking it left nothing behind."""
from __future__ import annotations

import hashlib
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
import torch
from fastrl.envs.doom._reaper import mapped_paths
from fastrl.envs.registry import get_spec

from fastrl.algo.model import build_model
from fastrl.config import Config, save_config
from fastrl.learning import checkpoint as ckpt
from fastrl.learning.checkpoint import checkpoint_dir, save_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))
# The environment a run needs to use the test envs (slow_env, faulty_env, seed_log_env):
# its children make them by id, importing the module named before the colon from
# their PYTHONPATH.
TEST_ENVS_ON_PATH = {"PYTHONPATH": os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)}

# GPU tests carry the pytest.ini "gpu" marker (select them with -m gpu) and skip, with
# the reason shown under -rs, where torch sees no CUDA device.
GPU_MARKS = (pytest.mark.gpu,
             pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; this torch sees none"))


def shm_entries() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


class TrainRun:
    """`python -m <module> ARGS` as a user starts it, under setsid in a process
    group of its own (so a Ctrl-C can be sent to the whole group, as a terminal
    does), with the pids of every descendant seen while it ran."""

    def __init__(self, args: list, module: str = "fastrl.train", env: dict | None = None):
        self.shm_before = shm_entries()
        # faulthandler in every process of the run, so that one which overstays its wait can show its stacks.
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(env or {})}
        self.started = time.time()  # about when the command was launched
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
        """The run's exit status once it ends. One that overstays `timeout` fails the test
        showing where it is stuck: SIGABRT makes each of its processes print its threads'
        stacks (faulthandler) into the output the assertion shows, then all are killed."""
        deadline = time.time() + timeout
        while self.proc.poll() is None and time.time() < deadline:
            self._note_descendants()
            self._take_lines(0.1)
        overstayed = self.proc.poll() is None
        if overstayed:
            self.kill_all(signal.SIGABRT)
            time.sleep(3)
            self.kill_all()
        self._reader.join(10)
        self._take_lines(0)
        if overstayed:
            raise AssertionError(f"the run did not finish within {timeout} s; its output and stacks:\n"
                                 + self.output())
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
        """/dev/shm entries that appeared while the run ran and that no live process
        maps: the run is over (leftover_processes says whether it left one), so an
        entry still mapped is another program's, such as a training beside the tests
        whose ViZDoom engines come and go."""
        new = shm_entries() - self.shm_before
        return new - {os.path.basename(p) for p in mapped_paths("/dev/shm/")} if new else new

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        for pid in self.descendants | {self.proc.pid}:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def read_summary(train_dir, experiment: str) -> dict:
    with open(os.path.join(train_dir, experiment, "summary.json")) as fh:
        return json.load(fh)


def make_experiment(train_dir: str, name: str, env: str = "CartPole-v1", **options):
    """A real experiment folder as the trainer leaves it, without training: config.json
    and one checkpoint (version 3) in the learner's format, of an untrained model
    built with `options`. Returns its Config."""
    cfg = Config(env=env, experiment=name, train_dir=train_dir, **options)
    made = get_spec(env).make(seed=0)
    torch.manual_seed(0)
    model = build_model(cfg, made.observation_space, made.action_space)
    made.close()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "version": 3, "env_frames": 1234,
             "samples_trained": 1000, "env": env, "config": cfg.to_dict(), "torch_rng": torch.get_rng_state()}
    save_checkpoint(checkpoint_dir(cfg), state, 3, cfg.keep_checkpoints)
    save_config(cfg, os.path.join(cfg.experiment_dir, "config.json"))
    return cfg


class MarkerPayload:
    """Unpickled, it runs code: exec creates the file `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def forge_checkpoint(path, state) -> bytes:
    """Write `state` in fastrl's checkpoint format by hand, as anyone can: a valid
    header, checksum included, around a torch.save payload that fastrl's own saving
    would refuse. Returns the payload."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    with open(path, "wb") as fh:
        fh.write(ckpt._HEADER.pack(ckpt.MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload)
    return payload


def count_timed_calls(monkeypatch, module) -> list:
    """Wrap `module`'s time_interleaved (fastrl.tuning.profiling's, or a module's that
    imported it) so that every call of a timed fn is counted: returns the list of
    {key: calls}, one per measurement, that it fills."""
    original = module.time_interleaved
    measurements = []

    def counted(calls, *args, **kwargs):
        counts = dict.fromkeys(calls, 0)
        measurements.append(counts)

        def wrap(key, fn):
            def call():
                counts[key] += 1
                fn()
            return call

        return original({key: (t, wrap(key, fn)) for key, (t, fn) in calls.items()}, *args, **kwargs)

    monkeypatch.setattr(module, "time_interleaved", counted)
    return measurements


class ListQueue:
    """The two calls a worker makes on a faster-fifo queue, over a plain list, and
    `put` for the test standing in for other processes; `on_put` runs after every
    item put, standing in for what other processes do then."""

    def __init__(self, items=(), on_put=None):
        self.items, self.on_put = list(items), on_put

    def put_many(self, items, block=True, timeout=None):
        for item in items:
            self.items.append(item)
            if self.on_put:
                self.on_put(item)

    def put(self, item, block=True, timeout=None):
        self.put_many([item])

    def get_many(self, block=False, max_messages_to_get=1_000_000_000):
        if not self.items:
            raise queue.Empty
        taken, self.items = self.items[:max_messages_to_get], self.items[max_messages_to_get:]
        return taken
