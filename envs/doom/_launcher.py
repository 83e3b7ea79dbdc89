"""Starts the ViZDoom engine so that it cannot outlive the process that owns it.

ViZDoom runs the file given by DoomGame.set_vizdoom_path() as the engine; engine.py
points that at a two-line shell script which runs

    python -I -S _launcher.py REAL_ENGINE [ENGINE ARGS...]

This arms PR_SET_PDEATHSIG(SIGKILL), so the kernel kills the engine when the
thread that started it ends (ViZDoom's helper thread, which lives as long as
the engine, or the whole owner process on any death, SIGKILL included), then
execs the real engine: same pid, same command line, no extra process.

If the owner died before the signal was armed, getppid() no longer matches the
FASTRL_DOOM_OWNER_PID that engine.py set before DoomGame.init(), and we stop here.
Standard library only: this runs before any package import path is set up.
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
        # engine.py's self-test: ViZDoom crashes its host process when the engine
        # exits at startup, so a launcher that cannot run must never be handed to it.
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
        # A seat of a network game (envs/doom/match.py): the engine reports the
        # players connecting ("Waiting for players: .. [ 2/ 2]", a dozen lines a
        # game) on stderr and stdout, the trainer's terminal. ViZDoom talks to it
        # through shared memory only, and reports its crashes to the Python side.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.close(devnull)
        # Its network loop spins while it waits for the other players; the shim
        # (net_yield.c) gives the core away at each empty poll.
        shim = os.environ.get("FASTRL_DOOM_NET_YIELD", "")
        if shim and os.path.isfile(shim):
            os.environ["LD_PRELOAD"] = " ".join(p for p in (shim, os.environ.get("LD_PRELOAD", "")) if p)
    # argv[0] stays the real engine path: the engine finds vizdoom.pk3 beside it.
    os.execv(engine, [engine] + sys.argv[2:])


if __name__ == "__main__":
    main()
