"""`python -m fastrl.export EXPERIMENT --out DIR`: a trained agent as a folder to share.

The folder holds the weights as safetensors (no pickle, so loading it runs no code),
the options it was trained with (config.json), the env's spaces and the agent's
details (export.json), a model card (README.md) with the learning curve
(learning_curve.png) where the run logged one, and a short replay (replay.mp4) where
the env renders. It is written beside DIR and renamed into place, so DIR is never
half-written. `python -m fastrl.enjoy --from DIR` and `fastrl.load_policy(DIR)` load
it; docs/sharing.md shows how to upload it to a model hub.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import sys
import tempfile
from typing import NamedTuple, Optional

from fastrl.agent import (
    CONFIG_FILE,
    EXPORT_FORMAT,
    EXPORT_INFO,
    WEIGHTS_FILE,
    AgentLoadError,
    Named,
    TrainedAgent,
    add_naming_options,
    experiment_folder,
    is_export,
    read_experiment,
    space_to_json,
)
from fastrl.config import OneLineParser, env_options
from fastrl.plumbing.files import cannot_write, write_json

CARD_FILE = "README.md"
CURVE_FILE = "learning_curve.png"
VIDEO_FILE = "replay.mp4"
# Origins (config.json) of the options a user chose, which the training command repeats; the
# presets and the plan would choose the others again.
CHOSEN_ORIGINS = ("given", "saved run")


class ExportError(Exception):
    """A request that cannot be exported; the message says what to do instead."""


class Replay(NamedTuple):
    """What the replay video shows, for the model card."""

    steps: int
    episode_return: float
    ended: bool  # the episode ended within the video, rather than at its step limit


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m fastrl.export", description="Write a trained agent as a folder to share.",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False,
                           error_name="fastrl.export")
    parser.add_argument("experiment", metavar="EXPERIMENT", help="Experiment name (under --train_dir) or folder.")
    parser.add_argument("--out", required=True, metavar="DIR", help="Folder to write; it must be new or empty.")
    parser.add_argument("--train_dir", default="train_dir", help="Root folder of experiments.")
    parser.add_argument("--checkpoint", default="latest",
                        help="'latest' (newest periodic checkpoint), 'best' (best by evaluation) or a checkpoint path.")
    parser.add_argument("--policy", type=int, default=0, help="Which policy of a --num_policies run (0 to N-1).")
    parser.add_argument("--no_video", action="store_true", help="Write no replay video.")
    parser.add_argument("--video_steps", type=int, default=500, help="Agent steps the replay video shows at most.")
    parser.add_argument("--repo_id", default="", metavar="USER/NAME",
                        help="The model hub repository it will be uploaded to, for the model card's download line.")
    parser.add_argument("--force", action="store_true", help="Replace an earlier export already in --out.")
    add_naming_options(parser)
    return parser


def check_out(out: str, force: bool) -> None:
    """Refuse an --out that holds something other than what this command may replace."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise ExportError(f"--out {out} is a file; give a folder to create.")
    if os.path.isdir(out) and os.listdir(out):
        if not force:
            raise ExportError(f"--out {out} exists and is not empty; choose a new or empty folder, or pass --force "
                              "to replace an earlier export there.")
        if not is_export(out):
            raise ExportError(f"--out {out} is not empty and holds no earlier export ({EXPORT_INFO}), so --force "
                              "does not replace it; choose a new or empty folder.")
    reason = cannot_write(out, folder=True)
    if reason:
        raise ExportError(f"--out {out} cannot be written ({reason}); choose another folder.")


def export(args) -> str:
    """Write the export of args.experiment into args.out; returns what it wrote, one line."""
    if args.video_steps < 1:
        raise ExportError(f"--video_steps is {args.video_steps} but must be at least 1.")
    check_out(args.out, args.force)
    folder = experiment_folder(args.experiment, args.train_dir)
    try:
        agent = read_experiment(folder, args.checkpoint, args.policy, Named(args.modules, args.doom_scenario))
    except AgentLoadError as err:
        raise ExportError(str(err)) from None
    parent = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(parent, exist_ok=True)
    # Beside --out, so the rename stays on one file system; made by mkdir, so it has the umask's modes.
    staging = os.path.join(parent, f".{os.path.basename(os.path.abspath(args.out))}.partial-{os.getpid()}")
    os.mkdir(staging)
    try:
        notes = write_export(staging, folder, agent, args)
        _move_into_place(staging, args.out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return "; ".join([f"wrote {', '.join(sorted(os.listdir(args.out)))}", *notes])


def write_export(into: str, experiment: str, agent: TrainedAgent, args) -> list:
    """Every file of the export, into the folder `into`; returns a note for each optional file left out."""
    from safetensors.torch import save_file

    cfg = agent.cfg
    tensors = {name: value.detach().clone().contiguous() for name, value in agent.weights.items()}
    save_file(tensors, os.path.join(into, WEIGHTS_FILE), metadata={"format": EXPORT_FORMAT, "env": cfg.env})
    with open(os.path.join(experiment, CONFIG_FILE)) as fh:
        saved = json.load(fh)  # as the run saved it, origins included
    write_json(os.path.join(into, CONFIG_FILE), saved, indent=2, sort_keys=True)
    summary = _read_summary(experiment)
    info = {"format": EXPORT_FORMAT, "env": cfg.env, "env_frames": agent.info["env_frames"],
            "policy_version": agent.info["policy_version"], "best_score": agent.info["best_score"],
            "checkpoint": os.path.basename(agent.info["source"]), "policy": args.policy,
            "mean_return_100": _mean_return(summary, args.policy), "train_command": training_command(saved),
            "observation_space": space_to_json(agent.observation_space),
            "action_space": space_to_json(agent.action_space)}
    write_json(os.path.join(into, EXPORT_INFO), info, indent=2)
    notes = []
    curve_note = _write_curve(experiment, os.path.join(into, CURVE_FILE))
    if curve_note:
        notes.append(curve_note)
    replay = None
    if not args.no_video:
        replay, video_note = _write_replay(agent, os.path.join(into, VIDEO_FILE), args.video_steps)
        if video_note:
            notes.append(video_note)
    with open(os.path.join(into, CARD_FILE), "w") as fh:
        fh.write(model_card(info, args.repo_id, has_curve=curve_note is None, replay=replay))
    return notes


def _read_summary(experiment: str) -> dict:
    try:
        with open(os.path.join(experiment, "summary.json")) as fh:
            summary = json.load(fh)
    except (OSError, ValueError):  # a run still going, or killed before its end: the card does without
        return {}
    return summary if isinstance(summary, dict) else {}


def _mean_return(summary: dict, policy: int) -> Optional[float]:
    """The exported policy's mean return of its last 100 episodes at the end of training: a run of
    several policies reports each apart."""
    each = summary.get("policies")
    if isinstance(each, list) and policy < len(each):
        return each[policy].get("mean_return_100")
    return summary.get("mean_return_100")


def training_command(saved: dict) -> str:
    """The command line that trains these options: --env and each option the user chose."""
    chosen = sorted(k for k, origin in saved.get("origins", {}).items()
                    if origin in CHOSEN_ORIGINS and k not in ("env", "restart"))
    parts = ["python", "-m", "fastrl.train", "--env", saved["env"]]
    for name in chosen:
        value = saved[name]
        parts += [f"--{name}", str(value).lower() if isinstance(value, bool) else "none" if value is None
                  else str(value)]
    return shlex.join(parts)


def _write_curve(experiment: str, path: str) -> Optional[str]:
    """The run's mean return against frames and time; a note instead where it has none."""
    if importlib.util.find_spec("matplotlib") is None:
        return "no learning curve: plotting needs matplotlib (pip install matplotlib)"
    from fastrl.plot import PlotError, draw, read_curve

    try:
        curve = read_curve(experiment)
    except PlotError:
        return "no learning curve: the run logged no mean return to TensorBoard"
    draw([curve], path)
    return None


def _write_replay(agent: TrainedAgent, path: str, max_steps: int) -> tuple:
    """(Replay, None) after writing one deterministic episode, at most `max_steps` steps,
    to `path`; (None, note) where the env cannot render or OpenCV is missing."""
    from fastrl.enjoy import DEFAULT_VIDEO_FPS, EnjoyError, VideoSink
    from fastrl.envs.registry import get_spec
    from fastrl.policy import Policy

    policy = Policy(agent, deterministic=True)
    try:
        env = get_spec(agent.cfg.env).make(seed=agent.cfg.seed, render_mode="rgb_array",
                                           **{**env_options(agent.cfg), "atari_episodic_life": False})
    except Exception as err:  # noqa: BLE001 - any env's failure to render means the same here
        return None, f"no replay video: the env cannot be made to render ({type(err).__name__}: {err})"
    video = None
    try:
        video = VideoSink(path, env.metadata.get("render_fps") or DEFAULT_VIDEO_FPS)
        obs, _ = env.reset(seed=agent.cfg.seed)
        video.write(env.render())
        steps, total, ended = 0, 0.0, False
        while steps < max_steps and not ended:
            obs, reward, terminated, truncated, _ = env.step(policy(obs))
            video.write(env.render())
            steps, total, ended = steps + 1, total + float(reward), terminated or truncated
        return Replay(steps, total, ended), None
    except EnjoyError as err:
        if os.path.exists(path):
            os.unlink(path)
        return None, f"no replay video: {err}"
    finally:
        if video is not None:
            video.close()
        env.close()


def model_card(info: dict, repo_id: str, has_curve: bool, replay: Optional[Replay]) -> str:
    """README.md: the model hub's metadata block, then what the agent is and how to use it."""
    env, score = info["env"], info["mean_return_100"]
    meta = ["---", "library_name: fastrl", "tags:", "- reinforcement-learning", "- fastrl", f"- {json.dumps(env)}"]
    if score is not None:
        meta += ["model-index:", f"- name: {json.dumps(f'APPO {env}')}", "  results:",
                 "  - task: {type: reinforcement-learning, name: reinforcement-learning}",
                 f"    dataset: {{type: {json.dumps(env)}, name: {json.dumps(env)}}}",
                 f"    metrics:\n    - {{type: mean_reward, value: {json.dumps(f'{score:.2f}')}, "
                 "name: mean return of the last 100 training episodes}"]
    lines = [*meta, "---", "", f"# APPO agent for {env}, trained with fastrl", "",
             "| | |", "| --- | --- |", f"| env | `{env}` |", f"| env frames trained | {info['env_frames']:,} |"]
    if score is not None:
        lines.append(f"| mean return, last 100 training episodes | {score:.2f} |")
    if info["best_score"] is not None:
        lines.append(f"| evaluation return of this checkpoint | {info['best_score']:.2f} |")
    lines += [f"| policy version (learner steps) | {info['policy_version']} |",
              f"| checkpoint | `{info['checkpoint']}` |", ""]
    if has_curve:
        lines += ["## Learning curve", "", f"![Mean return of the last 100 episodes]({CURVE_FILE})", ""]
    if replay is not None:
        how = "one episode" if replay.ended else f"the first {replay.steps} steps of an episode"
        lines += ["## Replay", "", f"[{VIDEO_FILE}]({VIDEO_FILE}): {how}, deterministic actions, return "
                  f"{replay.episode_return:.2f} over {replay.steps} steps.", ""]
    lines += ["## How it was trained", "", "```bash", info["train_command"], "```", "",
              "## Using it", "", "With fastrl installed:", "", "```bash"]
    if repo_id:
        lines.append(f"huggingface-cli download {repo_id} --local-dir agent")
    where = "agent" if repo_id else "path/to/this/folder"
    lines += [f"python -m fastrl.enjoy --from {where}", "```", "", "```python", "import fastrl", "",
              f"policy = fastrl.load_policy({json.dumps(where)})  # on the CPU; deterministic=True: likeliest action",
              "action = policy(observation)  # or a batch of observations; policy.reset() between episodes",
              "```", "", f"The weights are `{WEIGHTS_FILE}` (safetensors), the options `{CONFIG_FILE}`, the "
              f"spaces and details `{EXPORT_INFO}`.", ""]
    return "\n".join(lines)


def _move_into_place(staging: str, out: str) -> None:
    """Rename the finished folder to `out`; an earlier export there (check_out allowed it)
    is renamed aside first and deleted once the new one is in place."""
    if os.path.isdir(out) and os.listdir(out):
        aside = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(out)), prefix=".replaced-")
        os.rename(out, os.path.join(aside, "old"))
        os.rename(staging, out)
        shutil.rmtree(aside)
        return
    os.replace(staging, out)  # over an empty folder, or where none is


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        wrote = export(args)
    except ExportError as err:
        print(f"fastrl.export: error: {err}", file=sys.stderr)
        return 2
    print(f"fastrl.export: {args.out}: {wrote}", flush=True)
    repo = args.repo_id or "USER/NAME"
    print(f"upload it with: huggingface-cli upload {repo} {shlex.quote(args.out)} .", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
