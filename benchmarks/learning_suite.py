"""Learning quality of fastrl's defaults against Stable-Baselines3 PPO (and, on Doom,
Sample Factory 2.1.1): time to a target return, and the return at a fixed wall budget.

    python benchmarks/learning_suite.py --envs CartPole-v1,LunarLander-v3,Pendulum-v1,doom_basic \\
        --systems fastrl,sb3 --seeds 0,1,2 --seconds 300 --out /tmp/learning_suite --plot
    python benchmarks/learning_suite.py --envs doom_basic --systems fastrl,sf --seeds 0 --seconds 300 --out DIR
    python benchmarks/learning_suite.py --envs CartPole-v1 --systems fastrl --seeds 0,1,2 --seconds 60 \\
        --out DIR --fastrl_extra "--lr 3e-4" --tag lr3e-4      # a variant, added to DIR's table
    python benchmarks/learning_suite.py --combine DIR_s0 DIR_s1 DIR_s2 --out DIR --plot  # seeds run apart, one figure

Install (torch stays the CPU build already here; both fit this machine's pins):
    pip install stable-baselines3 "gymnasium[box2d,mujoco]"     # SB3; Box2D for LunarLander; MuJoCo
Sample Factory lives in its own virtualenv (benchmarks/.venv-sf), created and filled on
the first `--systems ...,sf` by benchmarks/vs_sample_factory.py's helpers.

What runs. Every (env, seed, system) is one training command launched as a user would,
one at a time on this machine, each given --seconds of wall time from its own launch
(imports and start-up count against it). The order is env, then seed, then system, so
a change in the machine's load during the suite falls on every system alike.
  fastrl  `python -m fastrl.train` with its defaults (plus --fastrl_extra); it stops
          itself (--train_for_seconds counts from its launch).
  sb3     benchmarks/sb3_runner.py: SB3 PPO with rl-zoo3's tuned hyperparameters for
          the env, one torch thread (SB3's fastest here: see the runner); it stops
          itself at the first env step past the budget, or after the zoo's
          n_timesteps if that comes first (its schedules end there).
          Doom envs are skipped: neither SB3 nor the zoo has a Doom setup, and one of
          ours would not be "SB3's defaults". Atari games (atari_breakout, atari_pong)
          run the zoo's `atari` entry: CnnPolicy, SB3's AtariWrapper, 4 frames stacked.
  sf      Sample Factory's `sf_examples.vizdoom.train_vizdoom` with SF's own defaults
          for the env name, 2 workers x 16 envs, CPU; Doom envs only. Its own
          --train_for_seconds never fires in 2.1.1, so it gets SIGINT at the budget.
After each run, anything left of it (every process under its sid) is killed and its
ViZDoom shared-memory segments unlinked (vs_sample_factory.Run does both).

What is measured. Each system reports every few seconds (fastrl and SB3 every
--report_seconds, SF every 5 s, its fixed interval) its seconds since launch, env
frames so far and the mean return of its last (up to) 100 finished training episodes:
the curve. Before 100 episodes the mean is over those finished, on every system.
  time to target    the first report whose return(100) >= the env's target (TARGETS
                    below); so it is known to the report interval, and a run whose
                    mean touched the target once counts, even if it fell back.
  return at budget  the return(100) of the last report kept: every report up to the
                    budget, and the stop report of a run that stopped on its own.
                    That one comes when it next checks the clock after the budget:
                    fastrl at once, SB3 only after a gradient phase that straddles
                    the budget (seconds on LunarLander), but neither collects
                    anything after the budget, so it is their state at the budget.
                    SF, stopped by SIGINT, has its reports up to the budget.
  return, last 30 s the median return(100) of the reports kept from the last 30 s
                    before the last one: the state at the budget without one
                    report's noise (CartPole and Pendulum finish 100 episodes
                    every second or two, so one report is a sample of a moving
                    mean that swings by tens; SF's 5-s reports give it 6-7).
  frames            env frames at the last report (agent steps x frameskip: 4 on Doom).
  return at equal frames  the return(100) of the first report at or past --at_frames
                    env frames (1M by default): the two systems at equal env steps,
                    what counts where a step is expensive.
  evaluation at equal frames  fastrl's deterministic evaluation (its evaluator's mean
                    over --eval_episodes, continuous control's default) first made at
                    or past --at_frames: how rl-zoo3's published figures are measured,
                    so the like-for-like comparison with them. Without an evaluator: -.
  largest fall      the deepest the return(100) fell below its best so far, as a
                    share of that best's rise above the first report: a run stopped
                    at that moment keeps the worse policy.
  fall after best   the deepest the return(100) fell after its best report, as a
                    share of the same rise: what the run gave back of its peak,
                    where an early dip before a long climb counts only in the above.
Returns, but for that evaluation, are training-episode returns (with exploration), on
all systems alike; on Doom they are the game's own score: fastrl's objective(100)
where its status line has one (a scenario trained on a shaped reward reports the
game's score there), SF's converted as SF_RETURN says.

Output in --out: results.jsonl (one JSON object per run, appended; the newest run of
each tag/system/env/seed/budget is the one summarized), table.md (the table printed
at the end), logs/ (each run's stdout), fastrl/, sb3/, sf/ (experiment folders;
fastrl's and SB3's hold TensorBoard events that `python -m fastrl.plot` draws side
by side), and with --plot one <env>.png per env. Each env's medians over this call's
seeds also go to benchmarks/results/learning_<env>_<budget>s_<systems>[_<tag>].jsonl.
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import math
import os
import re
import shlex
import statistics
import sys

import records
import vs_sample_factory as vsf
from sb3_runner import ZOO_PPO

REPO = vsf.REPO
SYSTEMS = ("fastrl", "sb3", "sf")

# The 100-episode mean training return that counts as "learned" for time-to-target:
# roughly where each env's standard benchmarks call it solved or near it (CartPole-v1
# caps at 500; LunarLander's own "solved" is 200; Pendulum's best policies score about
# -150). doom_health_gathering_supreme's is chosen from Sample Factory's curve: a game
# score of 700 (an agent alive ~800 tics a life) is what every one of SF's seeds 0-2
# reached in 10 minutes on a 2-core machine. None: no
# agreed threshold, so the suite reports the curve and the return at the budget only.
TARGETS = {
    "CartPole-v1": 300.0,
    "LunarLander-v3": 200.0,
    "Pendulum-v1": -200.0,
    "doom_basic": 80.0,
    "doom_health_gathering_supreme": 700.0,
    "doom_defend_the_center": None,
    # Breakout's full-game score, chosen from SB3's curve as health gathering's is from
    # Sample Factory's: 7 is rl-zoo3's PPO's median score after 8 minutes on 2 cores
    # (4.5 / 7.0 / 7.9); the zoo trains
    # 10M agent steps, far past any budget of minutes here.
    "atari_breakout": 7.0,
    "doom_defend_the_line": None,
    # MuJoCo locomotion: what rl-zoo3's PPO reaches at its zoo budget (1M steps), from the
    # zoo's benchmark.md (its v3 tasks, deterministic evaluation); #64's goal is to reach
    # it within 10 minutes. The zoo lists no PPO figure for Humanoid.
    "Hopper-v5": 2410.0,
    "Walker2d-v5": 3479.0,
    "Ant-v5": 1327.0,
    "HalfCheetah-v5": 5819.0,
    "Humanoid-v5": None,
}

# Where Sample Factory's return comes from, per Doom env, and the factor that turns it
# into the game's own score (fastrl's return on these scenarios):
#   stdout  the "Avg episode reward" line after each report: the mean over SF's last 100
#           episodes of the reward SF trains on. doom_basic's SF spec scales that reward
#           by 0.01, hence x100; defend_the_center's and defend_the_line's are unscaled.
#   tb      health_gathering_supreme's SF reward adds +1 per medikit picked up (SF's
#           gathering shaping), so its printed mean is not the game score; the
#           unshaped episode total is SF's "true_objective" stat, only in
#           TensorBoard (policy_stats/avg_true_objective, written every 10 s or so
#           once 100 episodes have finished). Each report takes the newest value
#           written by then. SF plays this scenario with its own .cfg: 0.01 a tic
#           alive and no death penalty, where ViZDoom's (fastrl's, the game score)
#           gives 1 a tic and -100 at death; so x100, then -100 (the third entry, an
#           offset added after scaling). Exact for an episode that ends in death;
#           one that lasts to the 2,100-tic timeout reads 100 low.
SF_RETURN = {
    "doom_basic": ("stdout", 100.0, 0.0),
    "doom_defend_the_center": ("stdout", 1.0, 0.0),
    "doom_defend_the_line": ("stdout", 1.0, 0.0),
    "doom_health_gathering_supreme": ("tb", 100.0, -100.0),
}
SF_TRUE_OBJECTIVE_TAG = "policy_stats/avg_true_objective"
SF_NUM_WORKERS, SF_ENVS_PER_WORKER = 2, 16

# How long past the budget a self-stopping run (fastrl, SB3) may go before it gets
# SIGINT, then SIGTERM, then SIGKILL at the same spacing. SF gets SIGINT at the budget.
GRACE_SELF_STOPPING, GRACE_SF = 60.0, 30.0

INSTALL_SB3 = "pip install stable-baselines3"
INSTALL_BOX2D = 'pip install "gymnasium[box2d]"'
INSTALL_MUJOCO = 'pip install "gymnasium[mujoco]"'
MUJOCO_ENVS = ("Hopper", "Walker2d", "Ant", "Humanoid", "HalfCheetah", "Swimmer", "Reacher", "InvertedPendulum",
               "InvertedDoublePendulum", "Pusher")

# fastrl's status line, "[   12.0s] frames 12,345 | 1,234 fps (env frames/s) | trained 300 samples/s | ...
# | return(100) 23.45 | episodes 120 ...", and sb3_runner's, which has the same fields less trained and lag.
STATUS = re.compile(r"^\[\s*([\d.]+)s\] frames ([\d,]+) \|.*?\| return\(100\) (\S+) \| episodes ([\d,]+)")
# What fastrl's status line adds once an episode reported a true objective: " | objective(100) 23.45".
OBJECTIVE = re.compile(r"\| objective\(100\) (\S+)")
# The line SF prints after each report line once an episode has finished: "Avg episode reward: [(0, '-0.693')]".
SF_REWARD = re.compile(r"Avg episode reward: \[\(0, '([^']+)'\)")


# ----------------------------------------------------------------------------------
# Curves and what is read off them


def _finite_or_none(text: str):
    value = float(text)
    return value if math.isfinite(value) else None


def parse_status_lines(lines) -> list:
    """[[seconds since launch, env frames, return(100) or None], ...] from fastrl's or
    sb3_runner's status lines; other lines are ignored. Where a line has a true
    objective, that is the return: a scenario trained on a shaped reward reports the
    game's score there."""
    curve = []
    for line in lines:
        m = STATUS.match(line)
        if m:
            objective = OBJECTIVE.search(line)
            value = (objective or m).group(1 if objective else 3)
            curve.append([float(m.group(1)), int(m.group(2).replace(",", "")), _finite_or_none(value)])
    return curve


def parse_sf_log(lines, launched: float, scale: float, offset: float = 0.0) -> list:
    """The same curve from SF's log: one point per report line (seconds since
    `launched`, its "Samples" x frameskip = env frames stepped, as vs_sample_factory
    counts them; SF updates that counter a little behind its episode stats), the
    return from the "Avg episode reward" line that follows it, times `scale` plus
    `offset`; None before one."""
    curve, frameskip = [], vsf.FRAMESKIP
    for line in lines:
        m = vsf.SF_FRAMESKIP.search(line)
        if m:
            frameskip = int(m.group(1))
        m = vsf.SF_STATUS.match(line)
        if m:
            stamp = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()  # local time, as SF logs
            curve.append([round(stamp - launched, 1), int(m.group(3)) * frameskip, None])
            continue
        m = SF_REWARD.search(line)
        if m and curve:
            value = _finite_or_none(m.group(1))
            curve[-1][2] = None if value is None else value * scale + offset
    return curve


def attach_tb_returns(curve: list, launched: float, events: list, scale: float, offset: float = 0.0) -> list:
    """Give each curve point the newest (wall time, value) event written by its time,
    times `scale` plus `offset`; points before the first event keep None."""
    out, i, latest = [], 0, None
    for t, frames, _ in curve:
        while i < len(events) and events[i][0] <= launched + t:
            latest = events[i][1] * scale + offset
            i += 1
        out.append([t, frames, latest])
    return out


def read_tb_scalar(tb_dir: str, tag: str, by: str = "wall_time") -> list:
    """[(wall time, value), ...] of one scalar in TensorBoard events (by="step": [(step,
    value), ...]), [] if absent."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not os.path.isdir(tb_dir):
        return []
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})  # 0 = keep every point
    acc.Reload()
    if tag not in acc.Tags().get("scalars", []):
        return []
    return sorted((getattr(e, by), e.value) for e in acc.Scalars(tag))


def within_budget(curve: list, seconds: float, stopped_itself: bool) -> list:
    """The reports up to the budget, and the last (its stop report) if the run stopped
    on its own; a run that had to be signalled for overrunning keeps only the former."""
    kept = [p for p in curve if p[0] <= seconds]
    if stopped_itself and curve and len(kept) < len(curve):
        kept.append(curve[-1])
    return kept


def time_to_target(curve: list, target) -> float | None:
    """Seconds since launch at the first point whose return reaches `target`; None if
    none does or there is no target."""
    if target is None:
        return None
    return next((t for t, _, ret in curve if ret is not None and ret >= target), None)


def return_at_budget(curve: list) -> float | None:
    return curve[-1][2] if curve else None


def return_at_frames(curve: list, frames: int) -> float | None:
    """The return(100) of the first report at or past `frames` env frames: two systems
    compared at equal env steps, where a step is what costs (a simulator, a robot).
    None if the run never got that far."""
    return next((ret for _, f, ret in curve if f >= frames), None)


def read_evaluations(out: str, exp: str) -> list:
    """[[env frames, mean return], ...] of the deterministic evaluations a fastrl run in
    `out` made (its evaluator's, in TensorBoard); [] for a run without an evaluator."""
    return [list(e) for e in read_tb_scalar(os.path.join(out, "fastrl", exp, "tb"), "eval/return", by="step")]


def evaluation_at_frames(evaluations: list, frames: int) -> float | None:
    """The first deterministic evaluation ([env frames, mean return], fastrl's evaluator)
    at or past `frames` env frames; None if the run made none there."""
    return next((ret for f, ret in evaluations if f >= frames), None)


def largest_fall(curve: list) -> float | None:
    """The deepest fall of return(100) below its best so far, as a fraction of that best's
    rise above the first report (0: never fell). A run stopped at any moment keeps the
    policy of that moment, so the deepest fall, not the last report's, is what a user
    risks. None without two reports or a rise."""
    returns = [ret for _, _, ret in curve if ret is not None]
    if len(returns) < 2 or max(returns) == returns[0]:
        return None
    first, best, deepest = returns[0], returns[0], 0.0
    for ret in returns[1:]:
        best = max(best, ret)
        if best > first:
            deepest = max(deepest, (best - ret) / (best - first))
    return deepest


def fall_after_best(curve: list) -> float | None:
    """The deepest fall of return(100) after its best report, as a fraction of that best's
    rise above the first report (0: ended at its best); unlike largest_fall, a dip on the
    way up does not count. None without two reports or a rise."""
    returns = [ret for _, _, ret in curve if ret is not None]
    if len(returns) < 2 or max(returns) == returns[0]:
        return None
    peak = returns.index(max(returns))
    return (returns[peak] - min(returns[peak:])) / (returns[peak] - returns[0])


LATE_WINDOW_S = 30.0


def late_return(curve: list, window_s: float = LATE_WINDOW_S) -> float | None:
    """The median return(100) of the reports in the last `window_s` seconds of
    `curve` (the last report's time counts back from); None without one."""
    if not curve:
        return None
    end = curve[-1][0]
    returns = [ret for t, _, ret in curve if t >= end - window_s and ret is not None]
    return statistics.median(returns) if returns else None


# ----------------------------------------------------------------------------------
# Commands


def experiment_name(env: str, seed: int, tag: str) -> str:
    return f"{env}_s{seed}" + (f"_{tag}" if tag else "")


def fastrl_command(args, env: str, seed: int, exp: str) -> list:
    return [sys.executable, "-m", "fastrl.train", "--env", env, "--seed", str(seed),
            "--train_for_seconds", f"{args.seconds:g}", "--train_dir", os.path.join(args.out, "fastrl"),
            "--experiment", exp, "--restart", "--status_every_seconds", f"{args.report_seconds:g}",
            *args.fastrl_extra]


def sb3_command(args, env: str, seed: int, exp: str) -> list:
    return [sys.executable, os.path.join(REPO, "benchmarks", "sb3_runner.py"), "--env", env, "--seed", str(seed),
            "--seconds", f"{args.seconds:g}", "--exp_dir", os.path.join(args.out, "sb3", exp),
            "--report_seconds", f"{args.report_seconds:g}",
            *(["--past_zoo_budget"] if args.sb3_past_zoo_budget else [])]


def sf_command(args, env: str, seed: int, exp: str) -> list:
    # Only the layout (2 workers x 16 envs, the same for every Doom env) and the CPU
    # device are set; model, batch, rollout, resolution, frameskip and reward are SF's
    # own Doom defaults for this env name, as a user of SF would get them.
    return [vsf.venv_python(vsf.DEFAULT_VENV), "-m", "sf_examples.vizdoom.train_vizdoom", "--env", env,
            "--seed", str(seed), "--experiment", exp, "--train_dir", os.path.join(args.out, "sf"),
            "--restart_behavior", "overwrite", "--device", "cpu",
            "--num_workers", str(SF_NUM_WORKERS), "--num_envs_per_worker", str(SF_ENVS_PER_WORKER),
            "--with_wandb", "False"]


def skip_reason(system: str, env: str) -> str | None:
    doom = env.startswith("doom_")
    if system == "sb3" and doom:
        return "SB3 and rl-zoo3 have no Doom setup, and one of ours would not be SB3's defaults"
    if system == "sb3" and env not in ZOO_PPO:
        return f"no rl-zoo3 hyperparameters for it in benchmarks/sb3_runner.py (has: {', '.join(ZOO_PPO)})"
    if system == "sf" and not doom:
        return "the Sample Factory side covers Doom only; SB3 is the reference on gymnasium envs"
    if system == "sf" and env not in SF_RETURN:
        return f"no known way to read its return as the game score (SF_RETURN has: {', '.join(SF_RETURN)})"
    return None


# ----------------------------------------------------------------------------------
# One run


def run_tag(args, system: str) -> str:
    """The tag of `system`'s runs: a tag names the fastrl variant that --fastrl_extra
    makes, so SB3 and Sample Factory, which it does not change, run untagged."""
    return args.tag if system == "fastrl" or not args.fastrl_extra else ""


def run_one(args, system: str, env: str, seed: int) -> dict:
    tag = run_tag(args, system)
    exp = experiment_name(env, seed, tag)
    log_path = os.path.join(args.out, "logs", f"{system}_{exp}.log")
    if system == "sf":
        cmd, cwd = sf_command(args, env, seed, exp), os.path.join(args.out, "sf")
        os.makedirs(cwd, exist_ok=True)
    else:
        cmd, cwd = (fastrl_command if system == "fastrl" else sb3_command)(args, env, seed, exp), REPO
    run = vsf.Run(system, cmd, cwd, log_path)
    if system == "sf":
        run.run(args.seconds, sigint_at=args.seconds, grace=GRACE_SF)
    else:
        run.run(args.seconds, sigint_at=None, grace=GRACE_SELF_STOPPING)

    lines = vsf.read_log(log_path)
    if system == "sf":
        source, scale, offset = SF_RETURN[env]
        curve = parse_sf_log(lines, run.launched, scale, offset)
        if source == "tb":
            events = read_tb_scalar(os.path.join(args.out, "sf", exp, ".summary", "0"), SF_TRUE_OBJECTIVE_TAG)
            curve = attach_tb_returns(curve, run.launched, events, scale, offset)
    else:
        curve = parse_status_lines(lines)
    kept = within_budget(curve, args.seconds, stopped_itself=system != "sf" and not run.stop_note)
    evaluations = read_evaluations(args.out, exp) if system == "fastrl" else []
    target = TARGETS.get(env)
    problems = []
    if not curve:
        problems.append("no report in its log")
    if any(line.startswith("Traceback") for line in lines):
        problems.append("a traceback in its log")
    return {
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        "tag": tag, "system": system, "env": env, "seed": seed, "seconds": args.seconds,
        "target": target, "curve": kept,
        "time_to_target": time_to_target(kept, target),
        "return_at_budget": return_at_budget(kept),
        "at_frames": args.at_frames, "return_at_frames": return_at_frames(kept, args.at_frames),
        "evaluations": evaluations, "evaluation_at_frames": evaluation_at_frames(evaluations, args.at_frames),
        "largest_fall": largest_fall(kept), "fall_after_best": fall_after_best(kept),
        "frames": kept[-1][1] if kept else None,
        "reports_past_budget": len(curve) - len(kept),
        "wall_s": round(run.exited - run.launched, 1), "returncode": run.returncode,
        "stop": run.stop_note or "stopped itself",
        "cores_used_by_run": round(run.run_cores, 2), "cores_used_by_others": round(run.other_cores, 2),
        "left_processes": len(run.left_processes), "left_shm_segments": len(run.left_segments),
        "problems": problems, "log": log_path, "command": shlex.join(cmd),
        "suite_command": records.this_command(),  # what --combine's record names as the runs' source
    }


# ----------------------------------------------------------------------------------
# Summary


def label(record: dict) -> str:
    return record["system"] + (f" ({record['tag']})" if record["tag"] else "")


def load_results(path: str) -> list:
    """Every run in results.jsonl, the newest of each tag/system/env/seed/budget only
    (a rerun replaces its older self rather than counting as one more seed). A run
    recorded before its fall after best was kept gets it from its curve."""
    newest = {}
    with open(path) as fh:
        for line in fh:
            if line.strip():
                r = json.loads(line)
                r.setdefault("fall_after_best", fall_after_best(r["curve"]))
                newest[(r["tag"], r["system"], r["env"], r["seed"], r["seconds"])] = r
    return list(newest.values())


def _median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(value, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}{unit}" if abs(value) >= 1000 else f"{value:.1f}{unit}"


def table(results: list) -> str:
    """Markdown: one row per env, system (with tag) and budget, medians over seeds.
    The median time to target counts a seed that never reached it as longer than the
    budget, so it reads "> budget" when fewer than half the seeds got there."""
    groups = {}
    for r in results:
        groups.setdefault((r["env"], label(r), r["seconds"]), []).append(r)
    rows = ["| env | system | budget | seeds | target | reached | time to target (median) "
            f"| return at budget (median) | return, last {LATE_WINDOW_S:g} s (median) | frames at budget (median) "
            "| return at equal frames (median) | evaluation at equal frames (median) | largest fall (median) "
            "| fall after best (median) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (env, name, seconds), runs in sorted(groups.items()):
        target = runs[0]["target"]
        if target is None:
            reached = ttt = "-"
        else:
            times = [r["time_to_target"] for r in runs]
            reached = f"{sum(t is not None for t in times)}/{len(runs)}"
            median = statistics.median([math.inf if t is None else t for t in times])
            ttt = f"> {seconds:g} s" if math.isinf(median) else _fmt(median, " s")
        seeds = ", ".join(str(seed) for seed in sorted(r["seed"] for r in runs))
        rows.append(f"| {env} | {name} | {seconds:g} s | {seeds} "
                    f"| {'-' if target is None else f'{target:g}'} | {reached} | {ttt} "
                    f"| {_fmt(_median_or_none(r['return_at_budget'] for r in runs))} "
                    f"| {_fmt(_median_or_none(late_return(r['curve']) for r in runs))} "
                    f"| {_fmt(_median_or_none(r['frames'] for r in runs))} | {_at_frames_cell(runs)} "
                    f"| {_at_frames_cell(runs, 'evaluation_at_frames')} "
                    f"| {_share(_median_or_none(r.get('largest_fall') for r in runs))} "
                    f"| {_share(_median_or_none(r.get('fall_after_best') for r in runs))} |")
    return "\n".join(rows)


def _share(value) -> str:
    return "-" if value is None else f"{value:.0%}"


def _at_frames_cell(runs: list, key: str = "return_at_frames") -> str:
    """'2,345 at 1,000,000' (the median of `key`, a figure at the runs' --at_frames), or '-'."""
    at = runs[0].get("at_frames")
    median = _median_or_none(r.get(key) for r in runs) if at else None
    return "-" if median is None else f"{_fmt(median)} at {at:,}"


def headline(runs: list) -> dict:
    """One env's figures for benchmarks/results: per system, the median time to the
    target (None when fewer than half the seeds reached it), how many seeds did, and
    the median return at the budget."""
    figure = {"seeds": sorted({r["seed"] for r in runs})}
    for system in SYSTEMS:
        mine = [r for r in runs if r["system"] == system]
        if not mine:
            continue
        if mine[0]["target"] is not None:
            times = [r["time_to_target"] for r in mine]
            median = statistics.median([math.inf if t is None else t for t in times])
            figure[f"{system}_time_to_target_s"] = None if math.isinf(median) else round(median, 1)
            figure[f"{system}_reached"] = f"{sum(t is not None for t in times)}/{len(mine)}"
        at_budget = _median_or_none(r["return_at_budget"] for r in mine)
        figure[f"{system}_return_at_budget"] = None if at_budget is None else round(at_budget, 2)
        for key in ("largest_fall", "fall_after_best"):
            fall = _median_or_none(r.get(key) for r in mine)
            if fall is not None:
                figure[f"{system}_{key}"] = round(fall, 2)
        if mine[0].get("at_frames"):
            at_frames = _median_or_none(r.get("return_at_frames") for r in mine)
            figure[f"{system}_return_at_{mine[0]['at_frames']:,}_frames"] = (None if at_frames is None
                                                                             else round(at_frames, 2))
            evaluated = _median_or_none(r.get("evaluation_at_frames") for r in mine)
            if evaluated is not None:
                figure[f"{system}_evaluation_at_{mine[0]['at_frames']:,}_frames"] = round(evaluated, 2)
    return figure


def plot(results: list, out_dir: str) -> list:
    """One PNG per env: return(100) against wall time and against env frames, one line
    per system and seed (a colour per system, a line style per seed), the target dashed."""
    import matplotlib

    matplotlib.use("Agg")  # files only: works on machines without a display
    import matplotlib.pyplot as plt

    written = []
    names = sorted({label(r) for r in results})
    colours = {name: f"C{i % 10}" for i, name in enumerate(names)}
    styles = ("-", "--", ":", "-.")
    for env in sorted({r["env"] for r in results}):
        runs = sorted((r for r in results if r["env"] == env), key=lambda r: (label(r), r["seed"]))
        fig, (by_time, by_frames) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
        seeds = sorted({r["seed"] for r in runs})
        for r in runs:
            points = [p for p in r["curve"] if p[2] is not None]
            style = dict(color=colours[label(r)], linestyle=styles[seeds.index(r["seed"]) % len(styles)],
                         marker=".", label=f"{label(r)} seed {r['seed']}")
            by_time.plot([p[0] for p in points], [p[2] for p in points], **style)
            by_frames.plot([p[1] for p in points], [p[2] for p in points], **style)
        target = runs[0]["target"]
        for ax in (by_time, by_frames):
            if target is not None:
                ax.axhline(target, color="grey", linestyle="--", linewidth=1)
            ax.set_xlim(left=0)
            ax.grid(alpha=0.3)
        by_time.set_xlabel("wall time from launch (s)")
        by_frames.set_xlabel("env frames")
        by_time.set_ylabel("return, mean of last 100 episodes")
        by_time.set_title(env)
        by_time.legend(loc="best", fontsize="small")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{env}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def record_headlines(runs: list, tag: str, combined: bool = False) -> None:
    """One record per env and budget among `runs` (all of `tag`), unless one of its runs
    had a problem; named for the systems that ran, and stamped with the machine and
    commit that made the runs and the command (for a --combine, the runs' commands too)."""
    groups = {}
    for r in runs:
        groups.setdefault((r["env"], r["seconds"]), []).append(r)
    for (env, seconds), group in groups.items():
        if any(r["problems"] for r in group):
            continue
        systems = "_".join(s for s in SYSTEMS if any(r["system"] == s for r in group))
        question = re.sub(r"[^A-Za-z0-9._-]", "_", f"learning_{env}_{seconds:g}s_{systems}")
        records.append(question + (f"_{tag}" if tag else ""), headline(group),
                       combined_command(group) if combined else records.this_command(),
                       made_by=group[0]["made_by"])


def combined_command(runs: list) -> str:
    """The commands that made `runs` (each once, oldest first), then this --combine: one
    shell line that makes the figure again. Runs from before the suite kept its command
    name only the --combine."""
    made = sorted((r["date_utc"], r["suite_command"]) for r in runs if r.get("suite_command"))
    commands = list(dict.fromkeys(command for _, command in made))
    return " && ".join([*commands, records.this_command()])


def combine(args) -> int:
    """--combine: the runs of earlier calls' folders, each seed's newest, gathered into
    one table and plot in --out and one record per env, budget and tag. It lets seeds
    run in separate calls (two variants' seeds interleaved, so a change in the machine
    falls on both) and still be recorded as one figure."""
    runs = {}
    for folder in args.combine:
        path = os.path.join(folder, "results.jsonl")
        if not os.path.exists(path):
            print(f"learning_suite: error: {path} does not exist; --combine takes folders that earlier calls "
                  "were given as --out.", file=sys.stderr)
            return 2
        for r in load_results(path):
            if r["system"] == "fastrl" and "evaluations" not in r:  # recorded before the suite read them
                r["evaluations"] = read_evaluations(folder, experiment_name(r["env"], r["seed"], r["tag"]))
                r["evaluation_at_frames"] = (evaluation_at_frames(r["evaluations"], r["at_frames"])
                                             if r.get("at_frames") else None)
            key = (r["tag"], r["system"], r["env"], r["seed"], r["seconds"])
            if key not in runs or r["date_utc"] > runs[key]["date_utc"]:
                runs[key] = r
    kept = list(runs.values())
    groups = {}
    for r in kept:
        groups.setdefault((r["env"], r["seconds"], r["tag"]), []).append(r)
    for (env, seconds, tag), group in sorted(groups.items()):
        if len({json.dumps(r.get("made_by"), sort_keys=True) for r in group}) > 1 or "made_by" not in group[0]:
            print(f"learning_suite: error: the {env} runs of {seconds:g} s tagged {tag!r} were not all made on one "
                  "machine at one commit (or predate runs naming theirs); combine only runs one figure can stand "
                  "for.", file=sys.stderr)
            return 2
    os.makedirs(args.out, exist_ok=True)
    text = table(kept)
    with open(os.path.join(args.out, "table.md"), "w") as fh:
        fh.write(text + "\n")
    print(text)
    if args.plot:
        for path in plot(kept, args.out):
            print(f"wrote {path}")
    for tag in sorted({r["tag"] for r in kept}):
        record_headlines([r for r in kept if r["tag"] == tag], tag, combined=True)
    return 0


# ----------------------------------------------------------------------------------
# Main


def _names(text: str) -> list:
    return [x.strip() for x in text.split(",") if x.strip()]


def preflight(args, plan: list) -> str | None:
    """The one-sentence error for a missing install, else None."""
    if any(system == "sb3" for system, _, _ in plan) and importlib.util.find_spec("stable_baselines3") is None:
        return f"--systems sb3 needs Stable-Baselines3, which is not installed; run: {INSTALL_SB3}"
    if any(env.startswith("LunarLander") for _, env, _ in plan) and importlib.util.find_spec("Box2D") is None:
        return f"LunarLander needs Box2D, which is not installed; run: {INSTALL_BOX2D}"
    if any(env.split("-")[0] in MUJOCO_ENVS for _, env, _ in plan) and importlib.util.find_spec("mujoco") is None:
        return f"the MuJoCo envs need mujoco, which is not installed; run: {INSTALL_MUJOCO}"
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        return "--plot needs matplotlib, which is not installed; run: pip install matplotlib"
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--envs", type=_names, default=_names("CartPole-v1,LunarLander-v3,Pendulum-v1,doom_basic"),
                   help="comma-separated env names, fastrl's (doom_*) or gymnasium ids; targets: "
                        + ", ".join(f"{k} {'none' if v is None else f'{v:g}'}" for k, v in TARGETS.items()))
    p.add_argument("--systems", type=_names, default=["fastrl", "sb3"],
                   help=f"comma-separated, from {', '.join(SYSTEMS)}; a system that cannot run an env skips "
                        "it and says why (SB3: not Doom; SF: Doom only)")
    p.add_argument("--seeds", type=lambda s: [int(x) for x in _names(s)], default=[0, 1, 2],
                   help="comma-separated seeds; each seed is one run per system and env")
    p.add_argument("--seconds", type=float, default=300.0, help="wall-time budget of each run, from its launch")
    p.add_argument("--out", required=True, help="folder for results.jsonl, table.md, logs, experiments, plots")
    p.add_argument("--fastrl_extra", type=shlex.split, default=[],
                   help="extra fastrl.train options, one quoted string, e.g. \"--lr 3e-4 --rollout 64\" "
                        "(write --fastrl_extra=\"--opt\" when the string has no space)")
    p.add_argument("--tag", default="",
                   help="name for this invocation's runs (e.g. the --fastrl_extra variant; with --fastrl_extra, "
                        "fastrl's runs only): kept in results.jsonl, shown beside the system in the table and plots, "
                        "appended to experiment names")
    p.add_argument("--report_seconds", type=float, default=5.0,
                   help="seconds between fastrl's and SB3's reports (SF's are 5 s apart, fixed); time to target "
                        "is known to this resolution")
    p.add_argument("--sb3_past_zoo_budget", action="store_true",
                   help="SB3 trains on past rl-zoo3's n_timesteps until --seconds (sb3_runner.py --past_zoo_budget: "
                        "envs whose zoo settings are constant only), to time a target the zoo's budget ends short of")
    p.add_argument("--at_frames", type=int, default=1_000_000,
                   help="also read each run's return(100) at this many env frames (equal env steps)")
    p.add_argument("--plot", action="store_true", help="also draw <out>/<env>.png from the recorded curves")
    p.add_argument("--combine", nargs="+", metavar="DIR",
                   help="run nothing: gather the runs in these earlier --out folders into --out's table, plots and "
                        "one record per env, budget and tag")
    args = p.parse_args(argv)
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown:
        p.error(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    if args.tag and not re.fullmatch(r"[A-Za-z0-9._-]+", args.tag):
        p.error(f"--tag {args.tag!r} names folders: use letters, digits, '.', '_' and '-' only")
    args.out = os.path.abspath(args.out)
    if args.combine:
        return combine(args)

    plan, skipped = [], []
    for env in args.envs:
        for seed in args.seeds:
            for system in args.systems:
                reason = skip_reason(system, env)
                if reason:
                    if seed == args.seeds[0]:
                        skipped.append(f"{system}: skipping {env}: {reason}")
                else:
                    plan.append((system, env, seed))
    error = preflight(args, plan)
    if error:
        print(f"learning_suite: error: {error}.", file=sys.stderr)
        return 2
    for line in skipped:
        print(line, flush=True)
    if any(system == "sf" for system, _, _ in plan):
        vsf.ensure_venv(vsf.DEFAULT_VENV)  # a no-op once the pins are in place
    for env in args.envs:
        if env not in TARGETS:
            print(f"note: no target for {env}: its curve and return at the budget only", flush=True)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)

    info = vsf.machine()
    print(f"{info['date_utc']}; {info['cpu']}, {info['logical_cpus']} logical CPUs; fastrl {info['fastrl_commit']}; "
          f"{len(plan)} run(s) x {args.seconds:g} s, one at a time; results in {args.out}", flush=True)
    results_path = os.path.join(args.out, "results.jsonl")
    failed, this_call = [], []
    made_by = {"machine": records.machine(), "commit": records.git_commit()}
    for i, (system, env, seed) in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] {system} {env} seed {seed} ...", flush=True)
        record = {**run_one(args, system, env, seed), "made_by": made_by}
        this_call.append(record)
        with open(results_path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
        ttt = record["time_to_target"]
        print(f"    {len(record['curve'])} reports; return at budget {_fmt(record['return_at_budget'])} "
              f"(last {LATE_WINDOW_S:g} s: {_fmt(late_return(record['curve']))}), "
              f"{_fmt(record['frames'])} frames; time to target "
              f"{'-' if record['target'] is None else 'not reached' if ttt is None else _fmt(ttt, ' s')}; "
              f"wall {record['wall_s']} s ({record['stop']}); cores: run {record['cores_used_by_run']}, "
              f"others {record['cores_used_by_others']}", flush=True)
        if record["cores_used_by_others"] > 0.2:
            print(f"    note: other processes kept {record['cores_used_by_others']} cores busy during this run: "
                  "the machine was not quiet", flush=True)
        if record["problems"]:
            failed.append(record)
            print(f"    PROBLEM: {'; '.join(record['problems'])} (see {record['log']})", flush=True)

    kept = load_results(results_path) if os.path.exists(results_path) else []
    text = table(kept)
    with open(os.path.join(args.out, "table.md"), "w") as fh:
        fh.write(text + "\n")
    print("\n" + text)
    if args.plot and kept:
        for path in plot(kept, args.out):
            print(f"wrote {path}")
    record_headlines(this_call, args.tag)  # this call's runs only: the folder may hold other calls' too
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
