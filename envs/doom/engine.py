"""Who owns a ViZDoom engine process and its /dev/shm segments, on every exit path.

ViZDoom 1.3.2's engine is a child process (its command line carries
`+viz_instance_id ID`) with three /dev/shm segments (ViZDoomMQCtr/MQDoom/SM + ID),
and only DoomGame.close() removes them. If the Python process dies, the engine runs
on (it survives SIGTERM) and the segments stay. An engine dying inside its queue's
process-shared mutex blocks the Python thread forever. close() holds the GIL and
waits for the engine, forever if it hangs; an engine exiting during init() segfaults
the caller.

What fastrl does, each covering a path the others cannot:
1. a launcher (_launcher.py) arms PR_SET_PDEATHSIG(SIGKILL) and execs the engine,
   checked once before use since a failing launcher would crash the process;
2. a reaper process per owner (_reaper.py) kills leftover engines and unlinks their
   segments once the owner's pipe closes, however it died;
3. close() SIGKILLs the engine first, so a hung engine never blocks it;
4. atexit and SIGTERM/SIGHUP handlers (where still default) close open games;
5. a watchdog thread kills engines of calls past the hang timeout and releases
   queue mutexes held by dead engine threads, so ViZDoom reports the crash;
6. cleanup_stale_doom_shm() removes segments no live process maps.
"""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import os
import platform
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref

from fastrl.envs.doom import _reaper
from fastrl.envs.doom._reaper import SHM_DIR, pid_alive, shm_names, unlink_game_segments
from fastrl.envs.doom.engine_files import stored_engine

OWNER_ENV_VAR = "FASTRL_DOOM_OWNER_PID"
_HERE = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------------------
# Finding the engine and its segments

def find_engine_pid(instance_id: str) -> int | None:
    """Pid of the engine running game `instance_id`, this process's children first."""
    needle = _reaper.engine_needle(instance_id)
    children = []
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/children") as f:
                children.extend(int(p) for p in f.read().split())
    except OSError:
        pass
    for pid in children:
        if needle in _reaper.cmdline(pid):
            return pid
    for entry in os.listdir("/proc"):
        if entry.isdigit() and needle in _reaper.cmdline(int(entry)):
            return int(entry)
    return None


def game_segments(instance_id: str, shm_dir: str = SHM_DIR) -> list:
    """The game's segment names that exist now."""
    return [n for n in shm_names(instance_id) if os.path.exists(os.path.join(shm_dir, n))]


def cleanup_stale_doom_shm(grace_s: float = 10.0, shm_dir: str = SHM_DIR) -> list:
    """Remove ViZDoom segments of dead games: mapped by no live process and older than
    grace_s (a game being created is briefly unmapped). For other programs' leftovers
    or a power loss; fastrl's own games never need it. Returns the names removed."""
    return _reaper.remove_stale_segments(shm_dir=shm_dir, grace_s=grace_s)


# --------------------------------------------------------------------------------------
# 1. The engine launcher (parent-death signal)

_launcher_lock = threading.Lock()
_launcher_path: str | None = None
_launcher_failed = False


def engine_launcher_path() -> str | None:
    """An executable starting the engine with PR_SET_PDEATHSIG armed, or None if it
    cannot be made here (the reaper and close() then own the engine's end)."""
    global _launcher_path, _launcher_failed
    with _launcher_lock:
        if _launcher_path or _launcher_failed:
            return _launcher_path
        try:
            _launcher_path = _write_launcher()
        except OSError:
            _launcher_failed = True
        return _launcher_path


def private_dir() -> str | None:
    """This user's folder for files the engines run: /tmp/fastrl-<uid> (tmpfs on most machines,
    so the stored engine loads from memory), else, where a file or another user's folder holds
    that name, one in the user's cache; None if neither is safely ours."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    for directory in (os.path.join(tempfile.gettempdir(), f"fastrl-{os.getuid()}"),
                      os.path.join(cache, "fastrl", "engine-files")):
        if _safely_ours(directory):
            return directory
    return None


def _safely_ours(directory: str) -> bool:
    """Whether `directory` is (or was just made) a real folder of this user that nobody else
    may write: code run from anywhere else could be someone else's."""
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
    except OSError:  # a file, a dangling link or an unwritable parent holds the name
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def shipped_engine_path() -> str:
    """The engine executable the vizdoom package installed."""
    import vizdoom

    return os.path.join(os.path.dirname(vizdoom.__file__), "vizdoom")


def _write_launcher() -> str | None:
    if not sys.platform.startswith("linux"):
        return None
    import vizdoom

    engine = shipped_engine_path()
    script = os.path.join(_HERE, "_launcher.py")
    if not (os.access(engine, os.X_OK) and os.path.isfile(script)):
        return None
    directory = private_dir()
    if directory is None:
        return None
    engine = stored_engine(os.path.dirname(vizdoom.__file__), directory) or engine
    body = "#!/bin/sh\n" f'exec {shlex.quote(sys.executable)} -I -S {shlex.quote(script)} {shlex.quote(engine)} "$@"\n'
    digest = hashlib.sha1(body.encode()).hexdigest()[:12]
    path = os.path.join(directory, f"doom-engine-{digest}.sh")
    try:
        with open(path) as f:
            current = f.read() == body and os.access(path, os.X_OK)
    except OSError:
        current = False
    if not current:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(body)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    return path if _launcher_works(path) else None


def _launcher_works(path: str) -> bool:
    """Run the launcher once in check mode: an engine exiting during init segfaults the
    Python process, so a launcher that cannot start must be caught here."""
    env = dict(os.environ, FASTRL_DOOM_LAUNCHER_CHECK="1")
    try:
        out = subprocess.run([path], env=env, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and out.stdout.strip() == "fastrl-doom-launcher-ok"


# --------------------------------------------------------------------------------------
# 2. The reaper

class _Reaper:
    """This process's reaper, started on first use and restarted (games re-registered)
    if it died."""

    def __init__(self):
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pid_of_owner = -1
        self._games: dict = {}  # instance id -> engine pid

    def _start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.join(_HERE, "_reaper.py"), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=True, start_new_session=True,
        )
        self._pid_of_owner = os.getpid()
        for instance_id, pid in self._games.items():
            self._proc.stdin.write(f"+{instance_id} {pid}\n".encode())
        self._proc.stdin.flush()

    def _send(self, line: str) -> None:
        with self._lock:
            if self._pid_of_owner != os.getpid():  # first use, or we are a fork
                if self._proc is not None and self._proc.stdin is not None:
                    try:  # a fork's copy of the parent's pipe would delay the parent's reaper
                        self._proc.stdin.close()
                    except OSError:
                        pass
                self._proc, self._games = None, {}
            for _ in range(2):
                try:
                    if self._proc is None or self._proc.poll() is not None:
                        self._start()
                    self._proc.stdin.write(line.encode())
                    self._proc.stdin.flush()
                    return
                except (OSError, ValueError):
                    self._proc = None

    def init_begins(self) -> None:
        self._send("?\n")

    def init_ends(self) -> None:
        self._send("=\n")

    def add(self, instance_id: str, engine_pid: int) -> None:
        self._games[instance_id] = engine_pid
        self._send(f"+{instance_id} {engine_pid}\n")

    def remove(self, instance_id: str) -> None:
        self._games.pop(instance_id, None)
        self._send(f"-{instance_id}\n")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._pid_of_owner == os.getpid() else None


REAPER = _Reaper()


# --------------------------------------------------------------------------------------
# The handle on one running engine

class EngineHandle:
    """One running game's engine: its id, pid, and `call_started` (time.monotonic()
    of the current call into the game, 0.0 between calls), which the watchdog reads."""

    def __init__(self, instance_id: str, engine_pid: int | None, hang_timeout: float):
        self.instance_id = instance_id
        self.engine_pid = engine_pid
        self.hang_timeout = hang_timeout
        self.call_started = 0.0
        self.killed_as_hung = False
        self.mutex_repairs = 0
        self._last_repair = 0.0

    def engine_alive(self) -> bool:
        return self.engine_pid is not None and _reaper.is_engine_of(self.engine_pid, self.instance_id)

    def kill_engine(self, wait_s: float = 2.0) -> None:
        if self.engine_pid is None or not self.engine_alive():
            return
        try:
            os.kill(self.engine_pid, signal.SIGKILL)
        except OSError:
            return
        deadline = time.monotonic() + wait_s
        while self.engine_alive() and time.monotonic() < deadline:
            time.sleep(0.005)


# --------------------------------------------------------------------------------------
# 5. The watchdog: hung engines and mutexes abandoned by a dead engine

_FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
_FUTEX_WAKE = 1
_PTHREAD_MUTEX_PSHARED_BIT = 128
DEAD_ENGINE_GRACE_S = 1.0  # a call this old with its engine dead is stuck, not finishing


def repair_abandoned_mutexes(instance_id: str) -> int:
    """Release this game's queue mutexes that a thread of this process is blocked on
    and whose owner thread is dead (the dead engine's); returns how many. Reads glibc's
    64-bit pthread_mutex_t layout at the futex address each blocked thread's
    /proc/self/task/TID/syscall shows, inside this game's ViZDoomMQ* mappings only.
    """
    if _FUTEX_SYSCALL is None:
        return 0
    regions = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if instance_id in line and "ViZDoomMQ" in line:
                    lo, hi = line.split(None, 1)[0].split("-")
                    regions.append((int(lo, 16), int(hi, 16)))
    except OSError:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    repaired = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/syscall") as f:
                fields = f.read().split()
        except OSError:
            continue
        if len(fields) < 2 or fields[0] != str(_FUTEX_SYSCALL):
            continue
        addr = int(fields[1], 16)
        if not any(lo <= addr and addr + 20 <= hi for lo, hi in regions):
            continue
        lock = ctypes.c_int.from_address(addr)
        owner = ctypes.c_int.from_address(addr + 8)
        nusers = ctypes.c_uint.from_address(addr + 12)
        kind = ctypes.c_int.from_address(addr + 16)
        if lock.value not in (1, 2) or not kind.value & _PTHREAD_MUTEX_PSHARED_BIT:
            continue
        if owner.value <= 0 or pid_alive(owner.value):
            continue
        owner.value = 0
        if nusers.value > 0:
            nusers.value -= 1
        lock.value = 0
        libc.syscall(_FUTEX_SYSCALL, ctypes.c_void_p(addr), _FUTEX_WAKE, 0x7FFFFFFF, None, None, 0)
        repaired += 1
    return repaired


class _Watchdog:
    PERIOD_S = 0.25

    def __init__(self):
        self._handles: "weakref.WeakSet[EngineHandle]" = weakref.WeakSet()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = -1

    def watch(self, handle: EngineHandle) -> None:
        with self._lock:
            self._handles.add(handle)
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="fastrl-doom-watchdog", daemon=True)
                self._thread.start()

    def unwatch(self, handle: EngineHandle) -> None:
        with self._lock:
            self._handles.discard(handle)

    def _run(self) -> None:
        while True:
            time.sleep(self.PERIOD_S)
            with self._lock:
                handles = list(self._handles)
            now = time.monotonic()
            for h in handles:
                try:
                    self.check(h, now)
                except Exception:  # the watchdog must outlive any one odd game
                    pass

    @staticmethod
    def check(h: EngineHandle, now: float) -> None:
        started = h.call_started
        if not started or now - started < DEAD_ENGINE_GRACE_S:
            return
        if h.engine_alive():
            if now - started > h.hang_timeout:
                h.killed_as_hung = True
                h.kill_engine(wait_s=0.5)
        elif now - h._last_repair > DEAD_ENGINE_GRACE_S:
            h._last_repair = now
            h.mutex_repairs += repair_abandoned_mutexes(h.instance_id)


WATCHDOG = _Watchdog()


# --------------------------------------------------------------------------------------
# 4. Exit hooks: close every open game at interpreter exit and on SIGTERM/SIGHUP

_open_envs: "weakref.WeakSet" = weakref.WeakSet()
_hooks_pid = -1


def track_open(env) -> None:
    """Remember an object with close() to be closed on exit; install the hooks."""
    global _hooks_pid
    _open_envs.add(env)
    if _hooks_pid == os.getpid():
        return
    _hooks_pid = os.getpid()
    atexit.register(close_all_open)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_DFL:
                signal.signal(sig, _close_and_die)


def forget_open(env) -> None:
    _open_envs.discard(env)


def close_all_open() -> None:
    for env in list(_open_envs):
        try:
            env.close()
        except Exception:
            pass


def _close_and_die(signum, frame) -> None:
    close_all_open()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


# --------------------------------------------------------------------------------------
# Starting and ending one game

def init_game(game, hang_timeout: float) -> EngineHandle:
    """DoomGame.init() with the launcher and the reaper in place; returns its handle."""
    launcher = engine_launcher_path()
    # Always fastrl's own engine: a scenario .cfg may name a vizdoom_path of its own, and a
    # config handed over with an experiment would then run whatever executable it names.
    game.set_vizdoom_path(launcher or shipped_engine_path())
    if launcher:
        os.environ[OWNER_ENV_VAR] = str(os.getpid())
    REAPER.init_begins()
    try:
        game.init()
        instance_id = game.get_instance_id()
        handle = EngineHandle(instance_id, find_engine_pid(instance_id), hang_timeout)
        if handle.engine_pid is not None:
            REAPER.add(instance_id, handle.engine_pid)
    finally:
        REAPER.init_ends()
    WATCHDOG.watch(handle)
    return handle


def end_game(game, handle: EngineHandle | None) -> None:
    """Kill the engine, let DoomGame.close() tidy up, unlink what is left."""
    if handle is not None:
        WATCHDOG.unwatch(handle)
        handle.kill_engine()
    try:
        game.close()
    except Exception:
        pass
    if handle is not None:
        unlink_game_segments(handle.instance_id)
        REAPER.remove(handle.instance_id)
