"""Starts the ViZDoom engine so that it cannot outlive the process that owns it.

engine.py points DoomGame.set_vizdoom_path() at a shell script running
`python -I -S _launcher.py REAL_ENGINE [ARGS...]`, which arms PR_SET_PDEATHSIG(SIGKILL)
and execs the real engine (same pid and command line). If the owner died before
that, getppid() no longer matches FASTRL_DOOM_OWNER_PID and it stops. Standard
library only: it runs before any package path is set up.
"""
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    if len(sys.argv) < 2:
        sys.stderr.write("usage: _launcher.py ENGINE [ARGS...]\n")
        os._exit(64)
    engine = sys.argv[1]
    if os.environ.get("FASTRL_DOOM_LAUNCHER_CHECK") == "1":
        # engine.py's self-test: an engine that exits at startup crashes its host process.
        ok = os.access(engine, os.X_OK)
        os.write(1, b"fastrl-doom-launcher-ok\n" if ok else b"engine not executable\n")
        os._exit(0 if ok else 1)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the reaper and close() still own the engine's end
    owner = os.environ.get("FASTRL_DOOM_OWNER_PID", "")
    if owner.isdigit() and os.getppid() != int(owner):
        os._exit(70)
    if "-port" in sys.argv[2:]:
        # A seat of a network game: the engine's player-connect chatter would flood the
        # trainer's terminal; ViZDoom talks to it through shared memory only.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        # Its network loop spins while waiting for players; the shim (net_yield.c)
        # yields the core at each empty poll.
        shim = os.environ.get("FASTRL_DOOM_NET_YIELD", "")
        if shim and os.path.isfile(shim):
            os.environ["LD_PRELOAD"] = " ".join(p for p in (shim, os.environ.get("LD_PRELOAD", "")) if p)
    # argv[0] stays the real engine path: the engine finds vizdoom.pk3 beside it.
    os.execv(engine, [engine] + sys.argv[2:])


if __name__ == "__main__":
    main()
