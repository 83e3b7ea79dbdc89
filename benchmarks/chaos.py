"""Chaos test: train as a user would, break the run's processes at random, and
check that it heals.

    python benchmarks/chaos.py                                    # 10 min of faults on doom_basic
    python benchmarks/chaos.py --env CartPole-v1 --minutes 1      # a quick look
    python benchmarks/chaos.py --minutes 3 -- --num_workers 3     # options after -- go to fastrl.train

It starts `python -m fastrl.train` with policy workers (so that there are some to
kill), waits until training flows, measures frames/s for --calm_s seconds, and
then, for --minutes, at random intervals (exponential, mean --mean_interval_s)
does one of:
    rollout  SIGKILL a random rollout worker ("fastrl: rollout-worker i")
    policy   SIGKILL a random policy worker ("fastrl: policy-worker i")
    engine   SIGKILL a random ViZDoom engine, a rollout worker's `vizdoom` child
             (Doom envs only), of a worker that runs all its games: one still
             making them would make new engines anyway, which would hide
             whether the killed one was replaced
    hang     SIGSTOP a random rollout or policy worker and leave it stopped: the
             supervisor must find it silent past --hang_timeout_s, kill it and
             restart it
The kinds come in shuffled rounds; one with no target at its turn (its slots
all busy, no worker running all its games) is skipped for the next, so under
heavy chaos the faults that need a settled run come less often than hangs.

Faults overlap, as they would in life (a worker killed while another restarts),
but never two in one slot: a rollout worker and its engines are one slot, the
policy workers together another (a policy-worker fault restarts them all). A
slot is busy from its fault until the run recovered from it: the run's restart
line and a new process under the title, or for an engine a new engine under the
same worker (or, if the engine's death took its worker down, the worker's
restart). Each recovery is then the fault's own, and one that never comes is
named, rather than missing from a total. With two rollout workers, the fault
rate is what the run's recoveries leave room for: --mean_interval_s is a floor.

After the last fault the run trains for 20 s untouched, and chaos stops it with
SIGINT as Ctrl-C would. The checks:
    training   frames grew over those last 20 s
    recovered  every fault recovered within --recover_s, and the run's counters
               agree: summary.json's worker_restarts is the rollout, policy and
               hang faults, its env_restarts at least the engine kills
    hangs      no worker went silent that chaos had not stopped
    stop       the run exited with 130 (SIGINT) within --stop_timeout_s
    leftovers  no process of the run alive 10 s after it exited, and no new
               /dev/shm entry of its own (not one that a live process maps, nor
               other programs' ViZDoom segments, whose instance ids its engines
               never had)
It prints a one-screen report, writes it to --json if asked, records the verdict in
benchmarks/results/chaos_<env>.jsonl, and exits 1 when a check fails.

The supervisor gives up on a worker that dies more than --max_worker_restarts
times in 10 minutes (default 5); chaos kills each worker far more often, so it
raises that budget and says so.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Optional

import psutil
import records
from fastrl.envs.doom._reaper import mapped_paths

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTLE_S = 20.0  # untouched training at the end, over which frames must grow
LEFTOVER_GRACE_S = 10.0
# Far above what any chaos run kills: the budget must never be what stops the run.
WORKER_RESTART_BUDGET = 1_000_000
STATUS = re.compile(r"^\[\s*([\d.]+)s\] frames ([\d,]+) ")
LAYOUT = re.compile(r"^fastrl: training \S+ with \d+ rollout workers x (\d+) envs")
RESTART = re.compile(r"^fastrl: ((?:rollout|policy)-worker \d+) (was killed by signal \d+|sent no heartbeat for .*?); "
                     r"restarted")
KINDS = ("rollout", "policy", "engine", "hang")
# The processes each kind of fault picks its target among (an engine: theirs).
TARGETS = {"rollout": ("fastrl: rollout-worker",), "policy": ("fastrl: policy-worker",),
           "engine": ("fastrl: rollout-worker",), "hang": ("fastrl: rollout-worker", "fastrl: policy-worker")}


@dataclasses.dataclass
class StatusPoint:
    wall: float  # when chaos read the line
    elapsed: float  # the run's own clock
    frames: int


@dataclasses.dataclass
class Fault:
    kind: str
    target: str  # the process title ("fastrl: rollout-worker 1"), or the engine's owner for an engine
    pid: int
    at: float
    line_index: int  # output lines before it: its restart line comes after
    engines_before: frozenset = frozenset()
    recovered_s: Optional[float] = None
    healed_by: str = ""  # "restart" (the supervisor's) or "new engine" (the env's own)

    @property
    def slot(self) -> str:
        return slot_of(self.target)


def slot_of(target: str) -> str:
    """What a fault on `target` keeps busy until the run has recovered from it."""
    return "policy workers" if target.startswith("fastrl: policy-worker") else target


class TrainRun:
    """`python -m fastrl.train` under setsid (its own process group), its output read
    by a thread into `lines` (and a log file), and every descendant it ever had noted by pid and
    start time: a pid seen minutes ago may belong to another program by the end."""

    def __init__(self, cmd: list, log_path: str):
        self.shm_before = shm_entries()
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.runner = psutil.Process(self.proc.pid)
        self.lines: list = []
        self.points: list = []
        self.seen: set = set()  # (pid, create_time) of every descendant seen
        self.instance_ids: set = set()  # of every ViZDoom engine seen
        self.envs_per_worker = 0  # as the run says once it starts
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))

    def pump(self) -> None:
        """Take in the output printed and the processes running since the last call."""
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            self.lines.append(line)
            self.log.write(line + "\n")
            layout = LAYOUT.match(line)
            if layout:
                self.envs_per_worker = int(layout.group(1))
            match = STATUS.match(line)
            if match:
                frames = int(match.group(2).replace(",", ""))
                self.points.append(StatusPoint(time.time(), float(match.group(1)), frames))
        self.log.flush()
        for p in self.descendants():
            try:
                self.seen.add((p.pid, p.create_time()))
                cmd = p.cmdline()
            except psutil.Error:
                continue
            if "+viz_instance_id" in cmd[:-1]:
                self.instance_ids.add(cmd[cmd.index("+viz_instance_id") + 1])

    def descendants(self) -> list:
        try:
            return self.runner.children(recursive=True)
        except psutil.Error:
            return []

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_until(self, predicate, timeout: float, poll_s: float = 0.25) -> bool:
        """Pump until predicate() holds (True) or the timeout or the run's exit (False)."""
        deadline = time.time() + timeout
        while True:
            self.pump()
            if predicate():
                return True
            if time.time() >= deadline or not self.alive():
                return False
            time.sleep(poll_s)

    def sleep(self, seconds: float) -> None:
        self.wait_until(lambda: False, seconds)

    def titled(self, *prefixes: str) -> list:
        """(process, title) of the run's live processes whose title starts with one
        of `prefixes`, the title as read here: a process may die right after, and
        a second read of its title would raise (one 10-minute run crashed so).
        Not a fork that has yet to exec: a worker starting a ViZDoom engine forks,
        and for a moment the child carries the worker's title. Stopping that child
        (once in a 10-minute run) stopped no worker of the run: the worker, stuck
        waiting for its engine, was killed as hung and replaced, and the stopped
        fork outlived the run."""
        found = []
        for p in self.descendants():
            try:
                name, parent = title(p), p.parent()
                if parent is not None and title(parent) == name:
                    continue
                if name.startswith(prefixes) and p.status() != psutil.STATUS_ZOMBIE:
                    found.append((p, name))
            except psutil.Error:
                pass
        return found

    def engines_of(self, worker: psutil.Process) -> list:
        engines = []
        try:
            children = worker.children()
        except psutil.Error:
            return []
        for p in children:
            try:
                if os.path.basename(p.cmdline()[0]) == "vizdoom":
                    engines.append(p)
            except (psutil.Error, IndexError):
                pass
        return engines

    def still_alive(self) -> list:
        """Descendants ever seen that are still alive: the very processes, not
        others that were given a pid of theirs since."""
        alive = []
        for pid, created in self.seen:
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                pass
        return alive

    def kill_all(self) -> None:
        for p in [self.runner, *self.still_alive()]:
            try:
                p.kill()
            except psutil.Error:
                pass


def title(p: psutil.Process) -> str:
    """What ps shows for `p`: a fastrl child's title ("fastrl: learner"), else its command line."""
    return " ".join(p.cmdline()).strip()


def shm_entries() -> set:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def new_shm_of(run: TrainRun) -> list:
    """/dev/shm entries left by the run: those that appeared while it ran, are still
    there a second later (another program's may be caught between its creation and
    its unlink) and that no live process maps (the run is over, so one mapped is
    another program's), less ViZDoom segments of games that were not the run's."""
    def ours(name: str) -> bool:
        return not name.startswith("ViZDoom") or any(name.endswith(i) for i in run.instance_ids)

    new = {n for n in shm_entries() - run.shm_before if ours(n)}
    if new:
        time.sleep(1.0)
        new &= shm_entries()
    return sorted(new - shm_mapped_by_anyone())


def shm_mapped_by_anyone() -> set:
    """Names of the /dev/shm entries some live process maps."""
    return {os.path.basename(path) for path in mapped_paths("/dev/shm/")}


# -- faults -----------------------------------------------------------------------------

def kinds_deck(env: str, rng: random.Random):
    """The fault kinds in shuffled rounds, forever; engines only where there are some."""
    kinds = [k for k in KINDS if k != "engine" or env.startswith("doom_")]
    while True:
        rng.shuffle(kinds)
        yield from kinds


def inject(run: TrainRun, kind: str, rng: random.Random, busy: set) -> Optional[Fault]:
    """Cause one fault of `kind` outside the `busy` slots; None when it has no target
    right now (every slot busy, a worker still starting, no engine running)."""
    workers = [w for w, name in run.titled(*TARGETS[kind]) if slot_of(name) not in busy]
    if kind == "engine":
        return _kill_engine(run, workers, rng)
    if not workers:
        return None
    target = rng.choice(workers)
    try:
        fault = Fault(kind, title(target), target.pid, time.time(), len(run.lines))
    except psutil.Error:  # it died just now
        return None
    try:
        os.kill(target.pid, signal.SIGSTOP if kind == "hang" else signal.SIGKILL)
    except ProcessLookupError:  # it died just now
        return None
    return fault


def _kill_engine(run: TrainRun, workers: list, rng: random.Random) -> Optional[Fault]:
    owners = [(w, engines) for w, engines in ((w, run.engines_of(w)) for w in workers)
              if engines and len(engines) == run.envs_per_worker]
    if not owners:
        return None
    worker, engines = rng.choice(owners)
    try:
        fault = Fault("engine", title(worker), worker.pid, time.time(), len(run.lines),
                      frozenset(e.pid for e in engines))
    except psutil.Error:
        return None
    try:
        os.kill(rng.choice(engines).pid, signal.SIGKILL)
    except ProcessLookupError:  # its worker's restart or a recycle ended it just now
        return None
    return fault


def healed_by(run: TrainRun, fault: Fault) -> str:
    """How the run has healed from `fault` so far: "restart" once the supervisor
    restarted the worker (its restart line, and a new process under its title),
    "new engine" once a killed engine's worker, still alive, runs all its games
    again, one of them new; "" before."""
    if fault.kind == "engine":
        owner = [w for w, _ in run.titled(fault.target) if w.pid == fault.pid]
        engines = {e.pid for e in run.engines_of(owner[0])} if owner else set()
        if len(engines) == run.envs_per_worker and engines - fault.engines_before:
            return "new engine"
    name = fault.target.removeprefix("fastrl: ")
    said = any((m := RESTART.match(line)) and m.group(1) == name for line in run.lines[fault.line_index:])
    if said and any(p.pid != fault.pid and name == fault.target for p, name in run.titled(fault.target)):
        return "restart"
    return ""


def settled(run: TrainRun, fault: Fault, args) -> bool:
    """Whether `fault` is over: healed (noting how and how fast), or past its time
    limit (saying so)."""
    fault.healed_by = healed_by(run, fault)
    if fault.healed_by:
        fault.recovered_s = time.time() - fault.at
        return True
    limit = args.recover_s + (args.hang_timeout_s if fault.kind == "hang" else 0.0)
    if time.time() - fault.at > limit:
        print(f"chaos: the run did not recover from the {fault.kind} fault of {fault.target} "
              f"(pid {fault.pid}) within {limit:g} s", flush=True)
        return True
    return False


def unexpected_hangs(run: TrainRun, faults: list) -> list:
    """Restart lines for workers found silent that chaos had not stopped: a run
    wedged somewhere (a queue lock a killed worker held, say). Each stop chaos
    made explains the first such line naming its worker after it."""
    stops = [(f.target.removeprefix("fastrl: "), f.line_index) for f in faults if f.kind == "hang"]
    unexplained = []
    for index, line in enumerate(run.lines):
        m = RESTART.match(line)
        if not (m and "no heartbeat" in m.group(2)):
            continue
        cause = next((s for s in stops if s[0] == m.group(1) and s[1] <= index), None)
        if cause:
            stops.remove(cause)
        else:
            unexplained.append(line)
    return unexplained


def chaos(run: TrainRun, args, rng: random.Random) -> list:
    """Faults at random intervals for --minutes, then the wait for the last ones to settle."""
    faults, pending, deck = [], [], kinds_deck(args.env, rng)
    end = time.time() + args.minutes * 60.0
    next_at = time.time() + rng.expovariate(1.0 / args.mean_interval_s)
    while run.alive() and (time.time() < end or pending):
        run.sleep(0.25)
        pending = [f for f in pending if not settled(run, f, args)]
        if not next_at <= time.time() < end:
            continue
        fault = inject(run, next(deck), rng, busy={f.slot for f in pending})
        next_at = time.time() + rng.expovariate(1.0 / args.mean_interval_s)
        if fault is not None:
            faults.append(fault)
            pending.append(fault)
            if len(faults) % 20 == 0:
                healed = sum(f.recovered_s is not None for f in faults)
                print(f"chaos: {len(faults)} faults, {healed} recovered, {len(pending)} under way", flush=True)
    return faults


# -- measuring --------------------------------------------------------------------------

def point_at(run: TrainRun, wall: float) -> Optional[StatusPoint]:
    """The last status line read at or before `wall`."""
    before = [p for p in run.points if p.wall <= wall]
    return before[-1] if before else None


def fps_between(run: TrainRun, wall0: float, wall1: float) -> Optional[float]:
    a, b = point_at(run, wall0), point_at(run, wall1)
    if a is None or b is None or b.elapsed <= a.elapsed:
        return None
    return (b.frames - a.frames) / (b.elapsed - a.elapsed)


def frames_over_last(run: TrainRun, seconds: float) -> tuple:
    """(frames at the status line `seconds` before the last one, at the last one)."""
    if not run.points:
        return 0, 0
    last = run.points[-1]
    earlier = [p for p in run.points if p.elapsed <= last.elapsed - seconds]
    return (earlier[-1].frames if earlier else 0), last.frames


def stop(run: TrainRun, timeout: float) -> tuple:
    """SIGINT to the run's process group, as Ctrl-C in its terminal; (exit code or
    None when it outstayed `timeout`, seconds it took)."""
    started = time.time()
    if run.alive():
        os.killpg(run.proc.pid, signal.SIGINT)
    run.wait_until(lambda: not run.alive(), timeout)
    code = run.proc.poll()
    if code is None:  # report it, and do not leave it running
        run.kill_all()
        run.proc.wait(30)
    run.pump()
    run.log.close()
    return code, time.time() - started


def read_summary(path: str) -> dict:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


# -- the verdict ------------------------------------------------------------------------

def check_results(run: TrainRun, faults: list, summary: dict, stopped: tuple, args) -> dict:
    """name -> {"ok": bool, "text": what was found}."""
    by_kind = {k: sum(f.kind == k for f in faults) for k in KINDS}
    unrecovered = [f for f in faults if f.recovered_s is None]
    restarts_expected = sum(f.healed_by == "restart" for f in faults)
    new_engines = sum(f.healed_by == "new engine" for f in faults)
    worker_restarts, env_restarts = summary.get("worker_restarts"), summary.get("env_restarts")
    hangs = unexpected_hangs(run, faults)
    # A restart of an unexpected hang is counted too, but as a hang, not here.
    counters_agree = worker_restarts == restarts_expected + len(hangs) and (env_restarts or 0) >= new_engines
    frames0, frames1 = frames_over_last(run, SETTLE_S)
    code, took = stopped
    left = [f"{p.pid} {title(p)[:60]}" for p in run.still_alive()]
    shm = new_shm_of(run)
    return {
        "faults": {"ok": bool(faults), "text": f"{len(faults)} ("
                   + ", ".join(f"{k} {n}" for k, n in by_kind.items() if k != "engine" or args.env.startswith("doom_"))
                   + f"): {len(faults) - by_kind['hang']} SIGKILLs in {args.minutes:g} min"},
        "recovered": {"ok": not unrecovered and counters_agree,
                      "text": f"{len(faults) - len(unrecovered)} of {len(faults)}"
                              + (f" (not: {', '.join(f'{f.kind} {f.target}' for f in unrecovered[:3])})"
                                 if unrecovered else "")
                              + f"; summary.json worker_restarts {worker_restarts} (expected {restarts_expected}),"
                                f" env_restarts {env_restarts} (engines replaced {new_engines})"},
        "hangs": {"ok": not hangs, "text": f"{len(hangs)}" + (f": {hangs[0]}" if hangs else "")},
        "training": {"ok": frames1 > frames0,
                     "text": f"frames {frames0:,} -> {frames1:,} over the last {SETTLE_S:g} s before the stop"},
        "stop": {"ok": code == 128 + signal.SIGINT,
                 "text": f"SIGINT: exit code {code} in {took:.1f} s" if code is not None
                         else f"SIGINT: still running after {took:.0f} s, killed"},
        "leftovers": {"ok": not left and not shm,
                      "text": f"{len(left)} processes, {len(shm)} new /dev/shm entries"
                              + (f" ({'; '.join((left + shm)[:3])})" if left or shm else "")},
    }


def recovery_times(faults: list) -> str:
    times = sorted(f.recovered_s for f in faults if f.recovered_s is not None)
    if not times:
        return "none"
    slowest = max((f for f in faults if f.recovered_s is not None), key=lambda f: f.recovered_s)
    return (f"median {statistics.median(times):.1f} s, slowest {slowest.recovered_s:.1f} s "
            f"({slowest.kind} of {slowest.target.removeprefix('fastrl: ')})")


def print_report(args, checks: dict, faults: list, fps: tuple, run: TrainRun) -> None:
    before, during = fps
    ratio = f" ({during / before:.0%} of before)" if before and during is not None else ""
    restart_lines = sum(RESTART.match(line) is not None for line in run.lines)
    took_worker = sum(f.kind == "engine" and f.healed_by == "restart" for f in faults)
    took_worker = f"; {took_worker} engine kills took their worker down with them" if took_worker else ""
    print(f"\nchaos: {args.env}, {args.minutes:g} min of faults, mean interval {args.mean_interval_s:g} s, "
          f"hang timeout {args.hang_timeout_s:g} s, seed {args.seed}")
    print(f"  faults       {checks['faults']['text']}")
    print(f"  recovered    {checks['recovered']['text']}")
    print(f"  recovery     {recovery_times(faults)}; restart lines printed by the run: {restart_lines}{took_worker}")
    print(f"  hangs        {checks['hangs']['text']}")
    print(f"  training     {checks['training']['text']}")
    print(f"  frames/s     before chaos {_rate(before)}, during chaos {_rate(during)}{ratio}")
    print(f"  stop         {checks['stop']['text']}")
    print(f"  leftovers    {checks['leftovers']['text']}")
    failed = [name for name, c in checks.items() if not c["ok"]]
    print(f"chaos: {'FAIL (' + ', '.join(failed) + ')' if failed else 'PASS'}", flush=True)


def _rate(fps: Optional[float]) -> str:
    return "?" if fps is None else f"{fps:,.0f}"


# -- the run ----------------------------------------------------------------------------

def train_command(args, train_dir: str, extra: list) -> list:
    """What chaos runs: policy workers, so that there are some to kill; the hang
    timeout and restart budget a chaos run needs; a time limit that ends the run
    on its own only if chaos itself died, as a safety net. Options after -- come
    last, and argparse keeps the last value given."""
    limit = args.start_timeout_s + args.calm_s + args.minutes * 60 + args.recover_s + SETTLE_S + 600
    return [sys.executable, "-m", "fastrl.train", "--env", args.env, "--train_dir", train_dir,
            "--experiment", "chaos", "--restart", "--inference", "policy_worker", "--num_workers", "2",
            "--num_policy_workers", "2", "--worker_timeout_seconds", f"{args.hang_timeout_s:g}",
            "--max_worker_restarts", str(WORKER_RESTART_BUDGET), "--status_every_seconds", "2",
            "--train_for_seconds", f"{limit:g}", *extra]


def run_chaos(args, extra: list, train_dir: str) -> tuple:
    """Start the run, measure it calm, break it, let it settle, stop it; (checks, report)."""
    rng = random.Random(args.seed)
    cmd = train_command(args, train_dir, extra)
    os.makedirs(train_dir, exist_ok=True)
    log_path = os.path.join(train_dir, "chaos.log")
    print(f"chaos: {' '.join(cmd[1:])}\nchaos: the run's output goes to {log_path}\n"
          f"chaos: --max_worker_restarts {WORKER_RESTART_BUDGET:,}: the default (5 in 10 min per worker) would stop "
          "the run after a few kills of one worker", flush=True)
    run = TrainRun(cmd, log_path)
    faults, fps = [], (None, None)
    try:
        if run.wait_until(lambda: any(p.frames > 0 for p in run.points), args.start_timeout_s):
            calm_from = time.time()
            run.sleep(args.calm_s)
            chaos_from = time.time()
            print(f"chaos: training flows; faults for {args.minutes:g} min from now", flush=True)
            faults = chaos(run, args, rng)
            chaos_to = time.time()
            run.sleep(SETTLE_S + 3.0)  # one more status line past the settling time
            fps = (fps_between(run, calm_from, chaos_from), fps_between(run, chaos_from, chaos_to))
        else:
            print(f"chaos: the run did not start training within {args.start_timeout_s:g} s", flush=True)
    finally:
        stopped = stop(run, args.stop_timeout_s)
    time.sleep(LEFTOVER_GRACE_S)
    checks = check_results(run, faults, read_summary(os.path.join(train_dir, "chaos", "summary.json")), stopped, args)
    print_report(args, checks, faults, fps, run)
    if not all(c["ok"] for c in checks.values()):
        print("chaos: the run's last lines:\n  " + "\n  ".join(run.lines[-15:]), flush=True)
    report = {"env": args.env, "settings": vars(args), "extra_train_args": extra, "command": cmd,
              "machine": {"cpu": records.cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()},
              "checks": checks, "frames_per_s": {"before_chaos": fps[0], "during_chaos": fps[1]},
              "faults": [dataclasses.asdict(f) | {"engines_before": sorted(f.engines_before)} for f in faults]}
    return checks, report


def parse_args(argv: list) -> tuple:
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="doom_basic", help="doom_basic (engines to kill too), CartPole-v1, ...")
    parser.add_argument("--minutes", type=float, default=10.0, help="how long faults come")
    parser.add_argument("--mean_interval_s", type=float, default=1.5,
                        help="mean wait between two faults (longer while every slot is still recovering)")
    parser.add_argument("--hang_timeout_s", type=float, default=10.0,
                        help="the run's --worker_timeout_seconds: how long a stopped worker stays stopped")
    parser.add_argument("--recover_s", type=float, default=60.0,
                        help="a fault not recovered from this long after it (plus the hang timeout for a hang) fails")
    parser.add_argument("--calm_s", type=float, default=30.0, help="frames/s measured this long before the faults")
    parser.add_argument("--start_timeout_s", type=float, default=300.0)
    parser.add_argument("--stop_timeout_s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=None, help="of the faults' choices and times (default: random)")
    parser.add_argument("--train_dir", default="", help="where the run goes (default: a temporary folder, deleted)")
    parser.add_argument("--json", default="", help="also write the report here")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(2**31)
    if not (args.minutes > 0 and args.mean_interval_s > 0 and args.hang_timeout_s > 0):
        parser.error("--minutes, --mean_interval_s and --hang_timeout_s must be positive")
    return args, extra


def main(argv=None) -> int:
    args, extra = parse_args(list(sys.argv[1:] if argv is None else argv))
    tmp = None if args.train_dir else tempfile.TemporaryDirectory(prefix="fastrl_chaos_")
    try:
        checks, report = run_chaos(args, extra, args.train_dir or tmp.name)
    finally:
        if tmp is not None:
            tmp.cleanup()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    passed = all(c["ok"] for c in checks.values())
    recovered = [f["recovered_s"] for f in report["faults"] if f["recovered_s"] is not None]
    records.append(f"chaos_{args.env}",
                   {"verdict": "PASS" if passed else "FAIL", "faults": len(report["faults"]),
                    "recovered": len(recovered),
                    "median_recovery_s": round(statistics.median(recovered), 1) if recovered else None,
                    "hangs": checks["hangs"]["text"], "leftovers": checks["leftovers"]["text"]},
                   records.this_command())
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
