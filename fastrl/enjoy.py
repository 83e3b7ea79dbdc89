"""`python -m fastrl.enjoy --env ENV --experiment NAME`: watch a trained agent.

Plays episodes with the experiment's policy, printing each return (and true
objective), and with --save_video writes the rendered frames to an mp4 (one per reset
and per agent step). The model is rebuilt from the experiment's config.json; the env
comes from --env, so a policy can be watched on a variant with the same spaces.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Optional

import torch
from tqdm import tqdm

from fastrl.algo.model import build_model, obs_to_tensors
from fastrl.config import Config, OneLineParser, config_from_saved, env_failure, env_options
from fastrl.learning.checkpoint import (
    BEST_NAME,
    CheckpointError,
    RefusedCheckpointError,
    checkpoint_dir,
    load_checkpoint,
    load_latest_checkpoint,
)
from fastrl.plumbing.files import cannot_write
from fastrl.plumbing.seeding import SEED_BITS
from fastrl.tuning.precision import resolve_precision

DEFAULT_VIDEO_FPS = 30


class EnjoyError(Exception):
    """A bad request (missing experiment, checkpoint or env); the message says how to fix it."""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="python -m fastrl.enjoy", description="Watch a trained agent play.",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False,
                           error_name="fastrl.enjoy")
    parser.add_argument("--env", required=True, help="Environment to play, as given to fastrl.train.")
    parser.add_argument("--experiment", default="", help="Experiment name (defaults to the env name, as in training).")
    parser.add_argument("--train_dir", default="train_dir", help="Root folder of experiments.")
    parser.add_argument("--episodes", type=int, default=3, help="Episodes to play.")
    parser.add_argument("--save_video", default="", metavar="PATH.mp4", help="Write the rendered frames to this mp4.")
    parser.add_argument("--checkpoint", default="latest",
                        help="'latest' (newest periodic checkpoint), 'best' (best by evaluation) or a checkpoint path.")
    parser.add_argument("--policy", type=int, default=0,
                        help="Which policy to play, in an experiment trained with --num_policies (0 to N-1).")
    parser.add_argument("--deterministic", action="store_true", help="Take the most likely action instead of sampling.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the first episode; episode i uses seed + i.")
    return parser


def load_experiment_config(experiment_dir: str) -> Config:
    """The Config an experiment was trained with, from its config.json."""
    path = os.path.join(experiment_dir, "config.json")
    if not os.path.isfile(path):
        raise EnjoyError(f"No experiment at {experiment_dir} (it has no config.json); "
                         "check --experiment and --train_dir, or train it first with python -m fastrl.train.")
    try:
        with open(path) as fh:
            saved = json.load(fh)
    except (OSError, ValueError) as err:  # ValueError: not JSON, or not even text
        raise EnjoyError(f"{path} cannot be read as the JSON fastrl writes ({err}); "
                         "restore it, or train the experiment again.") from None
    if not isinstance(saved, dict):
        raise EnjoyError(f"{path} holds a JSON {type(saved).__name__}, not the options fastrl writes; "
                         "restore it, or train the experiment again.")
    return config_from_saved(saved)


def select_checkpoint(cfg: Config, which: str, policy: int = 0) -> tuple:
    """(state, path) of policy `policy`'s checkpoint: latest, best or a path."""
    if not 0 <= policy < cfg.num_policies:
        raise EnjoyError(f"--policy {policy} does not exist: experiment {cfg.experiment_dir} trained "
                         f"{cfg.num_policies} polic{'y' if cfg.num_policies == 1 else 'ies'}; pass 0 to "
                         f"{cfg.num_policies - 1}.")
    ckpt_dir = checkpoint_dir(cfg, policy)
    if which == "latest":
        try:
            state, path = load_latest_checkpoint(ckpt_dir)
        except RefusedCheckpointError as err:
            raise EnjoyError(f"{err}; fastrl writes no such file, so delete it or pass --checkpoint PATH.") from None
        except CheckpointError as err:  # every checkpoint is damaged
            raise EnjoyError(f"{err}; pass --checkpoint best or the path of a good checkpoint.") from None
        if state is None:
            raise EnjoyError(f"Experiment {cfg.experiment_dir} has no usable checkpoint in {ckpt_dir}; "
                             "train it longer (one is written at exit) or pass --checkpoint PATH.")
        return state, path
    path = os.path.join(ckpt_dir, BEST_NAME) if which == "best" else which
    if which == "best" and not os.path.isfile(path):
        raise EnjoyError(f"Experiment {cfg.experiment_dir} has no best checkpoint ({path}); it is written by "
                         "evaluation during training (--eval_every_frames), or use --checkpoint latest.")
    try:
        return load_checkpoint(path), path
    except CheckpointError as err:
        raise EnjoyError(f"{err}; pass --checkpoint latest, best or the path of another checkpoint.") from None


class VideoSink:
    """Writes RGB frames to an mp4, opened at the first frame (whose size fixes the video's)."""

    def __init__(self, path: str, fps: float):
        try:
            import cv2
        except ImportError:
            raise EnjoyError("--save_video needs OpenCV: pip install opencv-python-headless.") from None
        self._cv2 = cv2
        self.path, self.fps = path, fps
        self._writer = None
        self.frames = 0
        self.size = None

    def write(self, frame) -> None:
        cv2 = self._cv2
        if frame is None:
            raise EnjoyError("The env returned no frame from render(); it cannot be recorded, so drop --save_video.")
        if self._writer is None:
            height, width = frame.shape[:2]
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._writer = cv2.VideoWriter(self.path, cv2.VideoWriter_fourcc(*"mp4v"), self.fps, (width, height))
            if not self._writer.isOpened():
                raise EnjoyError(f"OpenCV cannot write the video {self.path}; give a writable path ending in .mp4.")
            self.size = (width, height)
        self._writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))  # gymnasium renders RGB, OpenCV writes BGR
        self.frames += 1

    def close(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None


@torch.no_grad()
def play_episode(env, model, seed: int, deterministic: bool, video: Optional[VideoSink]) -> tuple:
    """One episode with the policy, the GRU state carried as in training: (return,
    length, true objective from the last step's info, or None)."""
    obs, _ = env.reset(seed=seed)
    rnn_state = torch.zeros(1, model.rnn_state_size)
    if video is not None:
        video.write(env.render())
    episode_return, length, info = 0.0, 0, {}
    done = False
    while not done:
        batch = {k: v.unsqueeze(0) for k, v in obs_to_tensors(obs, env.observation_space).items()}
        out = model.act(batch, rnn_state, deterministic=deterministic)
        rnn_state = out.rnn_state
        obs, reward, terminated, truncated, info = env.step(model.action_spec.to_env(out.actions[0].numpy()))
        episode_return += float(reward)
        length += 1
        done = terminated or truncated
        if video is not None:
            video.write(env.render())
    objective = info.get("true_objective")
    return episode_return, length, None if objective is None else float(objective)


def check_arguments(args) -> None:
    """What the arguments alone can refuse, before anything is loaded or played."""
    if args.episodes < 1:
        raise EnjoyError(f"--episodes is {args.episodes} but must be at least 1.")
    last_seed = 2**SEED_BITS - args.episodes  # episode i plays with seed --seed + i
    if not 0 <= args.seed <= last_seed:
        raise EnjoyError(f"--seed is {args.seed} but must lie in [0, {last_seed}], so that every episode's "
                         "seed (--seed + i) is one an env takes.")
    if args.save_video:
        if not args.save_video.lower().endswith(".mp4"):
            raise EnjoyError(f"--save_video {args.save_video} must name an .mp4 file, like videos/run.mp4.")
        reason = cannot_write(args.save_video)
        if reason:
            raise EnjoyError(f"--save_video {args.save_video} cannot be written ({reason}); choose another path.")


def run(args) -> None:
    from fastrl.envs.registry import UnknownEnvError, get_spec

    check_arguments(args)
    experiment_dir = os.path.join(args.train_dir, args.experiment or args.env)
    cfg = load_experiment_config(experiment_dir)
    # The folder the user named, not the saved config's (it may have moved).
    cfg = dataclasses.replace(cfg, train_dir=args.train_dir, experiment=args.experiment or args.env)
    state, ckpt_path = select_checkpoint(cfg, args.checkpoint, args.policy)
    try:
        spec = get_spec(args.env)
    except UnknownEnvError as err:
        raise EnjoyError(str(err)) from None
    # Episodes are full games: an Atari life lost ends only the learner's episode.
    try:
        env = spec.make(seed=args.seed, render_mode="rgb_array", **{**env_options(cfg), "atari_episodic_life": False})
    except Exception as err:  # noqa: BLE001 - the env's own failure, whatever it is (see env_failure)
        raise EnjoyError(env_failure(args.env, err)) from None
    video = None
    try:
        # A saved "auto" is decided on this machine now, as a resumed run would.
        precision = resolve_precision(cfg, env.observation_space, env.action_space)
        model = build_model(cfg, env.observation_space, env.action_space, precision.acting)
        try:
            model.load_state_dict(state["model"])
        except (RuntimeError, KeyError) as err:
            first = str(err).strip().splitlines()[0]
            raise EnjoyError(f"The checkpoint {ckpt_path} does not fit the model for {args.env} ({first}); "
                             "play it on the env it was trained on.") from None
        model.eval()
        print(f"fastrl: playing {args.episodes} episode(s) of {args.env} with {ckpt_path}"
              f" (policy version {state.get('version', '?')}, {state.get('env_frames', 0):,} env frames)", flush=True)
        if args.save_video:
            video = VideoSink(args.save_video, env.metadata.get("render_fps") or DEFAULT_VIDEO_FPS)
        returns = []
        for episode in tqdm(range(args.episodes), desc="episodes", unit="ep"):
            ret, length, objective = play_episode(env, model, args.seed + episode, args.deterministic, video)
            returns.append(ret)
            line = f"episode {episode + 1}: return {ret:.2f}, length {length}"
            if objective is not None:
                line += f", true objective {objective:.2f}"
            tqdm.write(line, file=sys.stdout)
        print(f"mean return over {len(returns)} episode(s): {sum(returns) / len(returns):.2f}", flush=True)
    finally:
        if video is not None:
            video.close()
        env.close()
    if video is not None:
        print(f"video: {video.path} ({video.frames} frames, {video.size[0]}x{video.size[1]})", flush=True)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except EnjoyError as err:
        print(f"fastrl.enjoy: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
