"""fastrl vs Sample Factory 2.1.1: training throughput, same env, model and settings.

    python benchmarks/vs_sample_factory.py                       # 3 rounds x 300 s each side
    python benchmarks/vs_sample_factory.py --rounds 1 --seconds 60
    python benchmarks/vs_sample_factory.py --install_only        # just build the SF virtualenv
    python benchmarks/vs_sample_factory.py --print_commands      # show both commands, run nothing

Runs fastrl, then Sample Factory, then fastrl, ... (--rounds pairs), each for
--seconds of wall time from its launch, on a ViZDoom-shipped scenario both can run
(defend_the_center by default: ViZDoom's own map). Both sides: 160x120 render
resized to 128x72 RGB, frameskip 4, conv 32k8s4/64k4s2/128k3s2 + FC 512 (ELU),
GRU 512, rollout 32, batch 1024, 1 epoch x 1 minibatch, 2 workers x 8 envs, CPU (--device cuda: GPU),
one torch thread per process. Every flag and why: benchmarks/sample_factory_notes.md.
With --fastrl_layout planned, fastrl's planner picks its own process layout (the
layout flags then set SF's), to compare --plan auto against SF's hand-tuned layouts.

--scenario battle is the main job, each side's own doom_battle: the two are not
the same game (fastrl's arena is ViZDoom's deathmatch.wad with its battle.cfg;
SF's is its own battle map with health, ammo and weapon measurements as a second
input and a turn-and-move action set), so the env-only check says how much of the
ratio the envs explain, and the model differs by SF's small measurements MLP.

Sample Factory pins numpy<2 and gymnasium<1.0, so it lives in its own virtualenv
(benchmarks/.venv-sf by default, git-ignored), created and filled on first use:
torch==2.13.0 (the CPU build on this machine's disk), sample-factory==2.1.1 (its
wheel ships sf_examples, the Doom integration) and vizdoom==1.3.2 (the engine fastrl
uses; it accepts gymnasium>=0.28). A second run finds the pins in place and skips pip.

What is counted (FPS = env frames/s = agent steps x frameskip 4, on both sides):
  stepped  frames the envs produced. fastrl: the "frames N" of its status lines
           (rollout workers add agent steps x 4 as they step). SF: the "Samples: N"
           of its report lines (observations its inference worker processed, one per
           agent step, not multiplied by frameskip) x env_frameskip.
  trained  frames the learner trained on. fastrl: "trained N samples/s" x 4 summed
           over the status windows. SF: "Total num frames" -- SF's own FPS counter,
           which is learner-side: experience_size x env_frameskip added after each
           training step (learner.py), i.e. it already counts frameskip.
  window   the rate between the first report at least --skip seconds after launch
           and the last report: steady state, start-up excluded. A run whose
           window's second half stepped more than RAMP_LIMIT times its first is
           named as still starting: its window ratio is not a steady state's.
  launch   frames at the last report / its time since launch: start-up included.
Both sides report every 5 s with timestamps (fastrl: seconds since its launch; SF:
wall-clock log stamps, turned into seconds since this script launched it).
The headline ratio is fastrl / SF on stepped window FPS; the median is over rounds.

Stopping: fastrl stops itself (--train_for_seconds counts from its launch). SF
2.1.1's --train_for_seconds never fires (runner.total_train_seconds is never
incremented), so SF gets SIGINT at the same time since launch; its runner then stops
its workers (they ignore SIGINT) and exits. After every run, any process still under the
run's sid (it starts under setsid, and everything it starts inherits the id; ViZDoom
engines ignore SIGTERM) is SIGKILLed and every /dev/shm segment
of the run's ViZDoom games (named by the +viz_instance_id seen on the engines' command
lines during the run) is unlinked; both are counted and reported.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time

import records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_VENV = os.path.join(REPO, "benchmarks", ".venv-sf")
DEFAULT_TRAIN_DIR = "/tmp/fastrl_vs_sf"

# The SF side's pins. torch first and alone: 2.13.0 is the CPU build on this machine's
# disk; any torch request pip can satisfy from a newer release would pull a CUDA build.
SF_TORCH = "torch==2.13.0"
SF_PACKAGES = ("sample-factory==2.1.1", "vizdoom==1.3.2")
SF_PINS = {"torch": "2.13.0", "sample-factory": "2.1.1", "vizdoom": "1.3.2"}

FRAMESKIP = 4
# A window whose second half steps more than this many times its first held the run's start-up.
# A steady run's halves differ by the noise; the margin above it leaves room for a CPU
# run whose compiled learner switches in mid-window. On a 16-core GPU machine Sample
# Factory's doom_defend_the_center stepped its first frames 44 s into a 50-s run: a
# window from 20 s gave it 3,722 fps (halves 0 and 6,544) and fastrl a 19.8x ratio that
# said nothing of either side's steady state.
RAMP_LIMIT = 1.5
SHM_DIR = "/dev/shm"
SHM_PREFIXES = ("ViZDoomSM", "ViZDoomMQCtr", "ViZDoomMQDoom")
ANSI = re.compile(r"\x1b\[[0-9;]*m")

# fastrl status line: "[   12.0s] frames 12,345 | 1,234 fps (env frames/s) | trained 300 samples/s | ..."
FASTRL_STATUS = re.compile(r"^\[\s*([\d.]+)s\] frames ([\d,]+) \| [\d,]+ fps .*?\| trained ([\d,]+) samples/s")
# SF report line:
# "[2026-11-22 01:06:28,241][31977] Fps is (...). Total num frames: 4096. Throughput: 0: 112.7. Samples: 2012. ..."
SF_STATUS = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[\d+\] Fps is "
                       r".*?Total num frames: (\d+)\..*?Samples: (\d+)\.")
SF_FINAL = re.compile(r"Collected \{0: (\d+)\}, FPS: ([\d.]+)")
SF_FRAMESKIP = re.compile(r"Env info: EnvInfo\(.*?frameskip=(\d+)")


# ----------------------------------------------------------------------------------
# The Sample Factory virtualenv


def venv_python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def installed_versions(python: str) -> dict:
    code = ("import importlib.metadata as m, json\n"
            "out = {}\n"
            f"for name in {sorted(SF_PINS)!r}:\n"
            "    try: out[name] = m.version(name)\n"
            "    except m.PackageNotFoundError: out[name] = None\n"
            "print(json.dumps(out))")
    try:
        res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
        return json.loads(res.stdout) if res.returncode == 0 else {}
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}


def pins_ok(versions: dict, torch_req: str = SF_TORCH) -> bool:
    pins = dict(SF_PINS, torch=torch_req.partition("==")[2] or SF_PINS["torch"])
    return all((versions.get(name) or "").split("+")[0] == want for name, want in pins.items())


def ensure_venv(venv: str, torch_req: str = SF_TORCH) -> dict:
    """Create and fill the SF virtualenv unless the pins are already there. Idempotent."""
    python = venv_python(venv)
    if os.path.exists(python):
        versions = installed_versions(python)
        if pins_ok(versions, torch_req):
            return versions
    else:
        print(f"sf venv: creating {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = [python, "-m", "pip", "install", "--disable-pip-version-check"]
    print(f"sf venv: pip install {torch_req}", flush=True)
    subprocess.run(pip + [torch_req], check=True)
    # torch repeated so that pip keeps it rather than resolving SF's torch range afresh.
    print(f"sf venv: pip install {' '.join(SF_PACKAGES)}", flush=True)
    subprocess.run(pip + [*SF_PACKAGES, torch_req], check=True)
    versions = installed_versions(python)
    if not pins_ok(versions, torch_req):
        raise SystemExit(f"sf venv: after installing, versions are {versions}, not {SF_PINS} with {torch_req}")
    return versions


# ----------------------------------------------------------------------------------
# Commands


def fastrl_supports(option: str) -> bool:
    res = subprocess.run([sys.executable, "-m", "fastrl.train", "--help"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    return f"--{option}" in res.stdout


def fastrl_command(args, experiment: str, has_plan: bool) -> list:
    cmd = [
        sys.executable, "-m", "fastrl.train",
        "--env", f"doom_{args.scenario}",
        "--experiment", experiment, "--train_dir", args.train_dir, "--restart",
        "--seed", "0",
        "--device", args.device,
        "--rollout", str(args.rollout),
        "--batch_size", str(args.batch_size),
        "--ppo_epochs", "1", "--num_minibatches", "1",
        "--use_rnn", str(args.use_rnn).lower(), "--rnn_size", "512",
        "--separate_critic", "false",
        "--doom_measurements", "false",
        "--train_for_seconds", f"{args.seconds:g}",
        "--status_every_seconds", "5",
        "--checkpoint_every_seconds", "120",
        "--eval_every_frames", "0",
        "--with_wandb", "false",
    ]
    if args.fastrl_layout == "planned":
        # The planner chooses workers, envs, inference placement, threads and buffers
        # from its profile of this machine; the model and batch stay as above.
        return cmd + ["--plan", "auto"] + list(args.fastrl_extra)
    cmd += ["--num_workers", str(args.num_workers), "--num_envs_per_worker", str(args.num_envs_per_worker),
            "--inference", args.fastrl_inference, "--torch_threads", "1", "--learner_threads", "1"]
    if args.fastrl_inference == "policy_worker":
        cmd += ["--num_policy_workers", "1"]
    if has_plan:
        cmd += ["--plan", "off"]  # use exactly these options: no automatic layout
    return cmd + list(args.fastrl_extra)


def sf_command(args, experiment: str) -> list:
    return [
        venv_python(args.venv), "-m", "sf_examples.vizdoom.train_vizdoom",
        "--env", f"doom_{args.scenario}",
        "--experiment", experiment, "--train_dir", args.train_dir, "--restart_behavior", "overwrite",
        "--seed", "0",
        "--device", "gpu" if args.device == "cuda" else "cpu",
        "--num_workers", str(args.num_workers),
        "--num_envs_per_worker", str(args.num_envs_per_worker),
        "--worker_num_splits", "2",
        "--policy_workers_per_policy", "1",
        "--batch_size", str(args.batch_size),
        "--num_batches_per_epoch", "1", "--num_epochs", "1",
        "--rollout", str(args.rollout), "--recurrence", str(args.rollout if args.use_rnn else 1),
        "--use_rnn", str(args.use_rnn), "--rnn_type", "gru", "--rnn_size", "512", "--rnn_num_layers", "1",
        "--encoder_conv_architecture", "convnet_simple", "--encoder_conv_mlp_layers", "512",
        "--nonlinearity", "elu",
        "--actor_critic_share_weights", "True",
        "--normalize_input", "False",
        "--with_vtrace", "False",
        "--async_rl", "True", "--serial_mode", "False", "--batched_sampling", "False",
        "--env_frameskip", str(FRAMESKIP), "--summaries_use_frameskip", "True",
        "--res_w", "128", "--res_h", "72", "--wide_aspect_ratio", "False", "--pixel_format", "CHW",
        "--save_every_sec", "120",
        "--with_wandb", "False",
    ] + list(args.sf_extra)


# ----------------------------------------------------------------------------------
# Processes: everything under the run's sid, its ViZDoom engines and their /dev/shm segments


TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int):
    """(ppid, sid, cpu seconds used) of a live process, else None. A zombie (dead,
    waiting for a parent to reap it; here often init, which reaps late) counts as gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):
            return None
        return int(fields[1]), int(fields[3]), (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return None


def busy_cpu_seconds() -> float:
    """CPU seconds all processes have used since boot (every core, not idle or iowait)."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / TICK


def _cmdline(pid: int) -> list:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().decode(errors="replace").split("\0")
    except OSError:
        return []


def processes_under_sid(sid: int) -> list:
    """pids of every process whose sid is `sid` (the run and all it started, orphans
    included: the id outlives the process that set it)."""
    return list(cpu_under_sid(sid))


def cpu_under_sid(sid: int) -> dict:
    """pid -> cpu seconds used, for every live process whose sid is `sid`."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st and st[1] == sid:
                out[int(name)] = st[2]
    return out


def vizdoom_instance(pid: int):
    cmd = _cmdline(pid)
    if cmd and os.path.basename(cmd[0]) == "vizdoom" and "+viz_instance_id" in cmd:
        i = cmd.index("+viz_instance_id")
        if i + 1 < len(cmd):
            return cmd[i + 1]
    return None


def _mp_semaphores() -> list:
    try:
        return [name for name in os.listdir(SHM_DIR) if name.startswith("sem.mp-")]
    except OSError:
        return []


class Run:
    """One training command: launched under setsid, watched, stopped, cleaned."""

    def __init__(self, side: str, cmd: list, cwd: str, log_path: str):
        self.side, self.cmd, self.cwd, self.log_path = side, cmd, cwd, log_path
        self.engines = {}  # pid -> viz instance id, every ViZDoom engine seen under the run's sid
        self.stop_note = ""
        self.cpu = {}  # pid -> cpu seconds, the most seen, for every process of the run

    def watch(self) -> None:
        for pid, cpu in cpu_under_sid(self.proc.pid).items():
            self.cpu[pid] = max(cpu, self.cpu.get(pid, 0.0))
            if pid not in self.engines:
                inst = vizdoom_instance(pid)
                if inst:
                    self.engines[pid] = inst

    def run(self, seconds: float, sigint_at: float | None, grace: float) -> None:
        self.load_before = os.getloadavg()
        self.semaphores_before = set(_mp_semaphores())
        busy0 = busy_cpu_seconds()
        self.launched = time.time()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        sent_int = sent_term = False
        while self.proc.poll() is None:
            time.sleep(0.5)
            self.watch()
            elapsed = time.time() - self.launched
            if sigint_at is not None and not sent_int and elapsed >= sigint_at:
                self.proc.send_signal(signal.SIGINT)  # the leader only: SF's workers ignore SIGINT
                sent_int = True
                self.stop_note = f"SIGINT at {elapsed:.1f} s"
            if not sent_int and elapsed >= seconds + grace:
                self.proc.send_signal(signal.SIGINT)
                sent_int = True
                self.stop_note = f"overran its own time budget: SIGINT at {elapsed:.1f} s"
            if not sent_term and elapsed >= seconds + 2 * grace:
                os.killpg(self.proc.pid, signal.SIGTERM)
                sent_term = True
                self.stop_note += f"; SIGTERM to the group at {elapsed:.1f} s"
            if elapsed >= seconds + 3 * grace:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.stop_note += f"; SIGKILL to the group at {elapsed:.1f} s"
                self.proc.wait()
        self.exited = time.time()
        self.returncode = self.proc.returncode
        self.load_after = os.getloadavg()
        # Cores busy with anything but this run (other users, this script itself), averaged
        # over the run: the contention its numbers were taken under. Processes of the run
        # that lived less than a poll (0.5 s) are missed, so this errs high, slightly.
        wall = max(self.exited - self.launched, 1e-9)
        self.run_cores = sum(self.cpu.values()) / wall
        self.other_cores = max(0.0, (busy_cpu_seconds() - busy0) / wall - self.run_cores)
        self.cleanup()

    def cleanup(self) -> None:
        """Kill what the run left alive and unlink its games' segments; count both."""
        time.sleep(2.0)  # a clean shutdown's last engines are given a moment to go
        left = [p for p in processes_under_sid(self.proc.pid)]
        self.left_processes = [{"pid": p, "name": os.path.basename(_cmdline(p)[0] or "?"),
                                "vizdoom": vizdoom_instance(p) is not None} for p in left]
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.time() + 10
        while time.time() < deadline and any(_stat(p) for p in left):
            time.sleep(0.1)
        # Python multiprocessing semaphores the run created and did not unlink: Sample
        # Factory leaves one per run when stopped this way. Only this run was started
        # in between, and its processes are dead by now.
        self.left_segments = sorted(set(_mp_semaphores()) - self.semaphores_before)
        for name in self.left_segments:
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                pass
        for inst in set(self.engines.values()):
            for prefix in SHM_PREFIXES:
                path = os.path.join(SHM_DIR, prefix + inst)
                if os.path.exists(path):
                    self.left_segments.append(prefix + inst)
                    try:
                        os.unlink(path)
                    except OSError:
                        pass


# ----------------------------------------------------------------------------------
# Env check: each side's own env implementation stepped with random actions, no model

ENV_CHECK = r"""
import multiprocessing as mp, sys, time
side, name, procs, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])

def make(seed):
    if side == "fastrl":
        from fastrl.envs.registry import get_spec
        return get_spec(name).make(seed=seed)
    from sf_examples.vizdoom.doom.doom_params import default_doom_cfg
    from sf_examples.vizdoom.doom.doom_utils import doom_env_by_name, make_doom_env_from_spec
    cfg = default_doom_cfg(env=name)  # SF's Doom defaults: 128x72, frameskip 4, CHW
    return make_doom_env_from_spec(doom_env_by_name(name), name, cfg, None)

def worker(i, barrier, out):
    env = make(1000 + i)
    env.reset(seed=1000 + i)
    env.action_space.seed(1000 + i)
    actions = [env.action_space.sample() for _ in range(1024)]
    barrier.wait()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        _, _, term, trunc, _ = env.step(actions[steps % 1024])
        steps += 1
        if term or trunc:
            env.reset()
    out.put((steps, time.perf_counter() - start))
    env.close()

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=worker, args=(i, barrier, out)) for i in range(procs)]
    for p in ps:
        p.start()
    rows = [out.get(timeout=seconds + 300) for _ in ps]
    for p in ps:
        p.join()
    print("ENVCHECK", sum(r[0] for r in rows) / max(r[1] for r in rows))
"""


def env_check(side: str, args) -> float | None:
    """Agent steps/s x 4 of `procs` processes stepping this side's env, random actions."""
    python = sys.executable if side == "fastrl" else venv_python(args.venv)
    cwd = REPO if side == "fastrl" else args.train_dir
    cmd = [python, "-c", ENV_CHECK, side, f"doom_{args.scenario}", str(args.num_workers), f"{args.env_check_seconds:g}"]
    run = Run(side, cmd, cwd, os.path.join(args.train_dir, f"envcheck_{side}.log"))
    run.run(args.env_check_seconds + 120, sigint_at=None, grace=30.0)
    for line in read_log(run.log_path):
        if line.startswith("ENVCHECK "):
            return float(line.split()[1]) * FRAMESKIP
    return None


# ----------------------------------------------------------------------------------
# Reading the logs


def read_log(path: str) -> list:
    with open(path, errors="replace") as fh:
        return [ANSI.sub("", line.rstrip("\n")) for line in fh]


def parse_fastrl(run: Run, train_dir: str, experiment: str) -> dict:
    points = []  # (seconds since launch, stepped frames, trained samples/s over the window ending here)
    lines = read_log(run.log_path)
    for line in lines:
        m = FASTRL_STATUS.match(line)
        if m:
            points.append((float(m.group(1)), int(m.group(2).replace(",", "")), float(m.group(3).replace(",", ""))))
    summary = {}
    try:
        with open(os.path.join(train_dir, experiment, "summary.json")) as fh:
            summary = json.load(fh)
    except (OSError, ValueError):
        pass
    trained, prev_t = [], 0.0  # cumulative trained frames at each point
    total = 0.0
    for t, _, rate in points:
        total += rate * (t - prev_t) * FRAMESKIP
        trained.append(total)
        prev_t = t
    return {"points": [(t, f, tr) for (t, f, _), tr in zip(points, trained)],
            "own_fps": summary.get("fps"), "own_fps_note": "summary.json fps: env frames / wall s from launch",
            "frameskip": FRAMESKIP, "errors": any(line.startswith("Traceback") for line in lines)}


def parse_sf(run: Run) -> dict:
    points, own_fps, frameskip, errors = [], None, None, False
    for line in read_log(run.log_path):
        m = SF_STATUS.match(line)
        if m:
            stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as SF logs
            points.append((stamp - run.launched, int(m.group(3)), int(m.group(2))))
            continue
        m = SF_FINAL.search(line)
        if m:
            own_fps = float(m.group(2))
        m = SF_FRAMESKIP.search(line)
        if m:
            frameskip = int(m.group(1))
        if line.startswith("Traceback"):
            errors = True
    frameskip = frameskip or FRAMESKIP
    return {"points": [(t, samples * frameskip, learner_frames) for t, samples, learner_frames in points],
            "own_fps": own_fps,
            "own_fps_note": "SF's final 'Collected ..., FPS': learner frames (x frameskip) / main-loop s",
            "frameskip": frameskip, "errors": errors}


def rates(parsed: dict, skip: float) -> dict:
    pts = [p for p in parsed["points"]]
    out = {"stepped_window_fps": None, "trained_window_fps": None, "stepped_launch_fps": None,
           "trained_launch_fps": None, "window": None, "frames": None}
    if not pts:
        return out
    last = pts[-1]
    out["frames"] = last[1]
    if last[0] > 0:
        out["stepped_launch_fps"] = last[1] / last[0]
        out["trained_launch_fps"] = last[2] / last[0]
    start = next((p for p in pts if p[0] >= skip), None)
    if start is not None and last[0] - start[0] >= 5.0:
        span = last[0] - start[0]
        out["stepped_window_fps"] = (last[1] - start[1]) / span
        out["trained_window_fps"] = (last[2] - start[2]) / span
        out["window"] = (round(start[0], 1), round(last[0], 1))
        out["window_halves_fps"] = window_halves([p for p in pts if start[0] <= p[0]])
    return out


def window_halves(window: list) -> tuple | None:
    """(stepped fps over the window's first half, over its second), split at the report
    nearest its middle; None where a half would hold no interval."""
    if len(window) < 3:
        return None
    middle = (window[0][0] + window[-1][0]) / 2
    mid = min(window[1:-1], key=lambda p: abs(p[0] - middle))
    if mid[0] <= window[0][0] or window[-1][0] <= mid[0]:  # SF can print several reports in one instant
        return None
    first = (mid[1] - window[0][1]) / (mid[0] - window[0][0])
    second = (window[-1][1] - mid[1]) / (window[-1][0] - mid[0])
    return first, second


def still_starting(halves: tuple | None) -> bool:
    """Whether a run's window held its start-up: its second half stepped more than
    RAMP_LIMIT times its first."""
    return halves is not None and halves[1] > RAMP_LIMIT * max(halves[0], 0.0)


# ----------------------------------------------------------------------------------
# Machine and report


def machine(device: str = "cpu") -> dict:
    cpu = records.cpu_model()
    try:
        with open("/proc/meminfo") as fh:
            mem_gib = int(fh.readline().split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        mem_gib = float("nan")
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    try:
        import vizdoom
        vizdoom_version = vizdoom.__version__
    except ImportError:
        vizdoom_version = None
    return {"date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu": cpu, "logical_cpus": os.cpu_count(), "memory_gib": round(mem_gib, 1),
            "gpu": gpu_name() if device == "cuda" else "none used (--device cpu on both sides)",
            "os": platform.platform(), "python": platform.python_version(),
            "fastrl_commit": records.git_commit() or "?",
            "fastrl_torch": torch_version, "fastrl_vizdoom": vizdoom_version}


def gpu_name() -> str:
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (asked for cuda, torch sees none)"
    except ImportError:
        return "unknown (no torch)"


def fmt(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="fastrl/SF pairs, alternating (default 3; 0 = env check only)")
    p.add_argument("--seconds", type=float, default=300.0, help="wall seconds per run, from launch (default 300)")
    p.add_argument("--skip", type=float, default=30.0,
                   help="steady-state window starts at the first report this long after launch (default 30)")
    p.add_argument("--scenario", choices=("defend_the_center", "basic", "battle"), default="defend_the_center",
                   help="doom_<name> on both sides (default defend_the_center, ViZDoom's own map on both; "
                        "battle is each side's own doom_battle, not the same game: see above)")
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--num_envs_per_worker", type=int, default=8)
    p.add_argument("--batch_size", type=int, default=1024)
    p.add_argument("--rollout", type=int, default=32)
    p.add_argument("--use_rnn", type=lambda s: s.lower() in ("1", "true", "yes"), default=True,
                   help="GRU 512 on both sides (true/false, default true)")
    p.add_argument("--fastrl_inference", choices=("local", "policy_worker"), default="local",
                   help="fastrl's inference placement: its default 'local', or 'policy_worker' "
                        "(SF's layout: one separate inference process)")
    p.add_argument("--fastrl_layout", choices=("fixed", "planned"), default="fixed",
                   help="fixed: fastrl gets the same layout as SF (--num_workers etc., --plan off); "
                        "planned: fastrl's --plan auto chooses its own layout (the layout flags then apply to SF only)")
    p.add_argument("--env_check_seconds", type=float, default=20.0,
                   help="first step each side's own env, num_workers processes, random actions, no model, "
                        "for this long (0 = skip): tells how much of the ratio the envs alone explain")
    p.add_argument("--first", choices=("fastrl", "sf"), default="fastrl", help="which side starts each round")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where both sides' learner and inference compute (SF calls the GPU 'gpu'); default cpu")
    p.add_argument("--venv", default=DEFAULT_VENV, help=f"SF virtualenv (default {DEFAULT_VENV})")
    p.add_argument("--sf_torch", default=SF_TORCH, help=f"torch requirement for the SF venv (default {SF_TORCH})")
    p.add_argument("--train_dir", default=DEFAULT_TRAIN_DIR, help="runs and logs go here")
    p.add_argument("--json", default="", help="also write every number and command to this file")
    p.add_argument("--install_only", action="store_true", help="create/fill the SF venv and stop")
    p.add_argument("--print_commands", action="store_true", help="print both commands and stop")
    p.add_argument("--fastrl_extra", default="", type=shlex.split, help="extra fastrl.train options (quoted)")
    p.add_argument("--sf_extra", default="", type=shlex.split, help="extra train_vizdoom options (quoted)")
    args = p.parse_args(argv)

    args.train_dir = os.path.abspath(args.train_dir)
    versions = ensure_venv(args.venv, args.sf_torch)
    if args.install_only:
        print(f"sf venv ready: {args.venv} {versions}")
        return 0
    has_plan = fastrl_supports("plan")
    if args.print_commands:
        print("fastrl: " + shlex.join(fastrl_command(args, "fastrl_r1", has_plan)))
        print("sf:     " + shlex.join(sf_command(args, "sf_r1")))
        return 0
    os.makedirs(args.train_dir, exist_ok=True)

    info = machine(args.device)
    info["sf_venv"] = versions
    print(f"date {info['date_utc']}; {info['cpu']}, {info['logical_cpus']} logical CPUs, "
          f"{info['memory_gib']} GiB; {info['os']}; python {info['python']}")
    print(f"fastrl {info['fastrl_commit']} (torch {info['fastrl_torch']}, vizdoom {info['fastrl_vizdoom']}); "
          f"sample-factory {versions.get('sample-factory')} (torch {versions.get('torch')}, "
          f"vizdoom {versions.get('vizdoom')}); GPU: {info['gpu']}")
    print(f"scenario doom_{args.scenario}; {args.rounds} round(s) x {args.seconds:g} s per side; "
          f"window from the first report >= {args.skip:g} s after launch", flush=True)

    envcheck = {}
    if args.env_check_seconds > 0:
        for side in ("fastrl", "sf"):
            envcheck[side] = env_check(side, args)
        f, sf = envcheck["fastrl"], envcheck["sf"]
        print(f"env only ({args.num_workers} processes, random actions, no model, {args.env_check_seconds:g} s): "
              f"fastrl's env {fmt(f)} fps, SF's env {fmt(sf)} fps"
              + (f", ratio {f / sf:.2f}" if f and sf else ""), flush=True)

    if args.rounds < 1:
        return 0

    order = ("fastrl", "sf") if args.first == "fastrl" else ("sf", "fastrl")
    results = []
    for rnd in range(1, args.rounds + 1):
        for side in order:
            exp = f"{side}_r{rnd}"
            if side == "fastrl":
                cmd = fastrl_command(args, exp, has_plan)
                run = Run(side, cmd, REPO, os.path.join(args.train_dir, exp + ".log"))
                run.run(args.seconds, sigint_at=None, grace=60.0)  # stops itself at --train_for_seconds
                parsed = parse_fastrl(run, args.train_dir, exp)
            else:
                cmd = sf_command(args, exp)
                run = Run(side, cmd, args.train_dir, os.path.join(args.train_dir, exp + ".log"))
                run.run(args.seconds, sigint_at=args.seconds, grace=30.0)
                parsed = parse_sf(run)
            r = rates(parsed, args.skip)
            row = {"round": rnd, "side": side, "command": shlex.join(cmd), "log": run.log_path,
                   "returncode": run.returncode, "stop": run.stop_note or "stopped itself",
                   "wall_s": round(run.exited - run.launched, 1),
                   "load_before": [round(x, 2) for x in run.load_before],
                   "load_after": [round(x, 2) for x in run.load_after],
                   "cores_used_by_run": round(run.run_cores, 2), "cores_used_by_others": round(run.other_cores, 2),
                   "vizdoom_engines_seen": len(run.engines),
                   "left_processes": run.left_processes, "left_vizdoom_processes":
                       sum(1 for x in run.left_processes if x["vizdoom"]),
                   "left_shm_segments": len(run.left_segments),
                   "own_fps": parsed["own_fps"], "own_fps_note": parsed["own_fps_note"],
                   "frameskip": parsed["frameskip"], "errors_in_log": parsed["errors"], **r}
            results.append(row)
            print(f"round {rnd} {side:<6} stepped {fmt(r['stepped_window_fps'])} fps (window {r['window']} s), "
                  f"from launch {fmt(r['stepped_launch_fps'])}; trained {fmt(r['trained_window_fps'])} / "
                  f"{fmt(r['trained_launch_fps'])}; own report {fmt(parsed['own_fps'])}; "
                  f"exit {run.returncode} ({row['stop']}), wall {row['wall_s']} s; cores: run "
                  f"{run.run_cores:.2f}, others {run.other_cores:.2f}; leftovers: "
                  f"{len(run.left_processes)} processes ({row['left_vizdoom_processes']} vizdoom), "
                  f"{len(run.left_segments)} /dev/shm segments (cleaned)"
                  + ("; TRACEBACK IN LOG" if parsed["errors"] else ""), flush=True)
            if run.other_cores > 0.2:
                print(f"note: other processes kept {run.other_cores:.2f} of {os.cpu_count()} cores busy during this "
                      f"run (it used {run.run_cores:.2f}): the machine was not quiet", flush=True)
            if still_starting(r.get("window_halves_fps")):
                first, second = r["window_halves_fps"]
                print(f"note: {side} was still starting in its window (first half {fmt(first)} fps, second "
                      f"{fmt(second)}): a ratio against its window is not a steady state's; give each run more "
                      f"--seconds or a later --skip", flush=True)
            if not r["trained_window_fps"]:
                print(f"note: {side} trained nothing in the steady-state window: --seconds is too short for "
                      f"its start-up on this machine now (see {run.log_path})", flush=True)

    def per_round(key):
        ratios = []
        for rnd in range(1, args.rounds + 1):
            f = next(x[key] for x in results if x["round"] == rnd and x["side"] == "fastrl")
            s = next(x[key] for x in results if x["round"] == rnd and x["side"] == "sf")
            ratios.append(f / s if f and s else None)
        return ratios

    summary = {}
    for key in ("stepped_window_fps", "stepped_launch_fps", "trained_window_fps", "trained_launch_fps"):
        ratios = per_round(key)
        good = [x for x in ratios if x is not None]
        summary[key] = {
            "fastrl_median": statistics.median([x[key] for x in results if x["side"] == "fastrl" and x[key]] or [0]),
            "sf_median": statistics.median([x[key] for x in results if x["side"] == "sf" and x[key]] or [0]),
            "ratios": ratios, "median_ratio": statistics.median(good) if good else None}
    print("\nfastrl / Sample Factory (env frames/s, frameskip 4 counted on both sides):")
    for key, label in (("stepped_window_fps", "stepped, steady window"),
                       ("stepped_launch_fps", "stepped, from launch"),
                       ("trained_window_fps", "trained, steady window"),
                       ("trained_launch_fps", "trained, from launch")):
        s = summary[key]
        rs = ", ".join("-" if x is None else f"{x:.2f}" for x in s["ratios"])
        mr = "-" if s["median_ratio"] is None else f"{s['median_ratio']:.2f}x"
        print(f"  {label:<24} fastrl {fmt(s['fastrl_median']):>6}  SF {fmt(s['sf_median']):>6}  "
              f"median ratio {mr}  (per round: {rs})")
    print("\ncommands (round 1):")
    for side in ("fastrl", "sf"):
        print(f"  {side}: " + next(x["command"] for x in results if x["side"] == side))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"machine": info, "env_check_fps": envcheck, "args": {k: v for k, v in vars(args).items()},
                       "runs": results, "summary": summary}, fh, indent=2)
        print(f"wrote {args.json}")
    failed = [x for x in results if not x["stepped_window_fps"] or not x["trained_window_fps"] or x["errors_in_log"]]
    if failed:
        print("warning: " + "; ".join(f"round {x['round']} {x['side']}: no steady state (nothing stepped or "
                                      f"trained after --skip) or a traceback "
                                      f"(see {x['log']})" for x in failed), file=sys.stderr)
        return 1
    records.append(f"vs_sample_factory_{args.scenario}" + ("_gpu" if args.device == "cuda" else ""),
                   headline(summary, envcheck, results), records.this_command())
    return 0


def headline(summary: dict, envcheck: dict, results: list) -> dict:
    """The figures a record keeps: the median ratios, the trained rates behind the
    first, the envs' own ratio, and any run still starting in its window."""
    def ratio(key):
        value = summary[key]["median_ratio"]
        return None if value is None else round(value, 2)

    figure = {"trained_steady_ratio": ratio("trained_window_fps"), "trained_launch_ratio": ratio("trained_launch_fps"),
              "stepped_steady_ratio": ratio("stepped_window_fps"),
              "fastrl_trained_steady_fps": round(summary["trained_window_fps"]["fastrl_median"]),
              "sf_trained_steady_fps": round(summary["trained_window_fps"]["sf_median"])}
    if envcheck.get("fastrl") and envcheck.get("sf"):
        figure["env_only_ratio"] = round(envcheck["fastrl"] / envcheck["sf"], 2)
    starting = [f"{x['side']} round {x['round']}" for x in results if still_starting(x.get("window_halves_fps"))]
    if starting:
        figure["still_starting"] = starting
    return figure


if __name__ == "__main__":
    sys.exit(main())
