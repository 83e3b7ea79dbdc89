"""Seconds from a run's summary line ("fastrl: trained for ...") to its process's exit:
how long the shell's prompt waits after the run has said it is done.

    python benchmarks/exit_latency.py --env CartPole-v1 --launches 6

Each launch is `python -m fastrl.train` with a short time budget, as a user runs it
(through runpy, so that the second arm can be the same command with one change).
With --compare_unfrozen every launch is followed by one whose runner does not
freeze its heap (gc.freeze a no-op there), alternating, so the two medians come
from the same minutes of the machine.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

SUMMARY = "fastrl: trained for"


def one_launch(env: str, seconds: float, train_dir: str, unfrozen: bool) -> float:
    argv = ["fastrl.train", "--env", env, "--plan", "off", "--train_for_seconds", str(seconds),
            "--train_dir", train_dir, "--restart"]
    patch = "gc.freeze = lambda: None; " if unfrozen else ""
    code = f"import gc, runpy, sys; {patch}sys.argv = {argv!r}; runpy.run_module('fastrl.train', run_name='__main__')"
    proc = subprocess.Popen([sys.executable, "-u", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    said_done = None
    for line in proc.stdout:
        if line.startswith(SUMMARY):
            said_done = time.monotonic()
    proc.wait()
    exited = time.monotonic()
    if proc.returncode != 0 or said_done is None:
        sys.exit(f"exit_latency: the run ended with code {proc.returncode} and "
                 f"{'a' if said_done else 'no'} summary line; run it by hand to see why.")
    return exited - said_done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1", help="env to train (its start-up is not measured)")
    parser.add_argument("--launches", type=int, default=6, help="launches per arm")
    parser.add_argument("--seconds", type=float, default=3.0, help="each run's time budget")
    parser.add_argument("--compare_unfrozen", action="store_true",
                        help="alternate with launches whose runner does not call gc.freeze")
    args = parser.parse_args()
    arms = ["frozen", "unfrozen"] if args.compare_unfrozen else ["frozen"]
    waits = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as train_dir:
        for _ in range(args.launches):
            for arm in arms:
                waits[arm].append(one_launch(args.env, args.seconds, os.path.join(train_dir, arm), arm == "unfrozen"))
    for arm in arms:
        print(f"{arm:9s} summary line to exit: median {statistics.median(waits[arm]):.3f} s "
              f"({' / '.join(f'{w:.2f}' for w in waits[arm])})")


if __name__ == "__main__":
    main()
