"""Trains into a small disk of its own: run by tests/test_full_disk.py inside a private mount
namespace (unshare(1), as root), so the tmpfs it mounts is seen by nothing else and goes
with it. Reads a JSON request on stdin and writes what each step's run did as JSON.

Request: {"disk": folder to mount on, "steps": [{"size": "4m", "args": [train options],
"fill_leaving_kb": K or null}, ...]}. Each step sizes the disk, runs `python -m
fastrl.train args`, and with fill_leaving_kb fills the disk once the run has written a
checkpoint, leaving K KB free (0: full), as another program on a shared disk would.
The filler file is removed after each step.
"""
import glob
import json
import os
import subprocess
import sys
import time

FILLER = "filler"


def fill(disk: str, leaving_kb: int) -> None:
    """Write zeros into disk/FILLER until `leaving_kb` KB are free, or the disk is full."""
    with open(os.path.join(disk, FILLER), "wb") as fh:
        block = b"\0" * 4096
        try:
            while os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize > leaving_kb * 1024 + len(block):
                fh.write(block)
                fh.flush()
        except OSError:
            pass  # full


def run_step(disk: str, step: dict) -> dict:
    subprocess.run(["mount", "-o", f"remount,size={step['size']}", disk], check=True)
    proc = subprocess.Popen([sys.executable, "-m", "fastrl.train", *step["args"]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if step.get("fill_leaving_kb") is not None:
        deadline = time.time() + 120
        before = set(glob.glob(os.path.join(disk, "**", "checkpoint_*.pt"), recursive=True))
        while proc.poll() is None and time.time() < deadline:
            if set(glob.glob(os.path.join(disk, "**", "checkpoint_*.pt"), recursive=True)) - before:
                fill(disk, step["fill_leaving_kb"])
                break
            time.sleep(0.1)
    try:
        stdout, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        stderr += "\n(killed: the run did not end within 180 s)"
    files = sorted(os.path.relpath(os.path.join(where, name), disk)
                   for where, _, names in os.walk(disk) for name in names if name != FILLER)
    if os.path.exists(os.path.join(disk, FILLER)):
        os.remove(os.path.join(disk, FILLER))
    return {"returncode": proc.returncode, "stdout": stdout, "stderr": stderr, "files": files,
            "newest": newest_checkpoints(disk), "summaries": summaries(disk)}


def newest_checkpoints(disk: str) -> dict:
    """Each checkpoint folder's newest good checkpoint, as a resume would find it: {folder: [path, frames]}."""
    from fastrl.learning.checkpoint import load_latest_checkpoint

    found = {}
    for folder in sorted(glob.glob(os.path.join(disk, "**", "checkpoints"), recursive=True)):
        state, path = load_latest_checkpoint(folder)
        found[os.path.relpath(folder, disk)] = [path and os.path.relpath(path, disk),
                                                state and int(state["env_frames"])]
    return found


def summaries(disk: str) -> dict:
    """Every summary.json, read as strict JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    found = {}
    for path in glob.glob(os.path.join(disk, "**", "summary.json"), recursive=True):
        with open(path) as fh:
            found[os.path.relpath(path, disk)] = json.load(fh, parse_constant=refuse)
    return found


def main() -> None:
    request = json.load(sys.stdin)
    disk = request["disk"]
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={request['steps'][0]['size']}", "tmpfs", disk], check=True)
    json.dump([run_step(disk, step) for step in request["steps"]], sys.stdout)


if __name__ == "__main__":
    main()
