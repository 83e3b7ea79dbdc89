"""`python -m fastrl.enjoy --env ENV --experiment NAME`, or `--from DIR`: watch a trained agent.

Plays episodes with the experiment's policy, or an export's (python -m fastrl.export),
printing each return (and true objective), and with --save_video writes the rendered
frames to an mp4 (one per reset and per agent step). The model is rebuilt from the saved
config.json; the env comes from --env (an export's own by default), so a policy can be
watched on a variant with the same spaces.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import NamedTuple, Optional

import torch
from tqdm import tqdm

from fastrl.agent import (
    AgentLoadError,
    Named,
    add_naming_options,
    is_export,
    load_experiment_config,
    naming,
    read_export,
    select_checkpoint,
)
from fastrl.algo.model import build_model, obs_to_tensors
from fastrl.config import Config, OneLineParser, env_failure, env_options
from fastrl.plumbing.files import cannot_write
from fastrl.plumbing.seeding import SEED_BITS
from fastrl.tuning.precision import resolve_precision

DEFAULT_VIDEO_FPS = 30


class EnjoyError(Exception):
    """A bad request (bad arguments, an env that cannot be made); the message says how to fix it.
    A missing experiment or checkpoint is fastrl.agent's AgentLoadError."""


def build_parser(env_required: bool = True) -> argparse.ArgumentParser:
    """env_required: whether --env must be given, as it must unless --from names an export."""
    parser = OneLineParser(prog="python -m fastrl.enjoy", description="Watch a trained agent play.",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter, allow_abbrev=False,
                           error_name="fastrl.enjoy")
    parser.add_argument("--env", default="", required=env_required,
                        help="Environment to play, as given to fastrl.train; with --from, the export's by default.")
    parser.add_argument("--from", dest="from_dir", default="", metavar="DIR",
                        help="Play the agent in this export folder (python -m fastrl.export) instead of an experiment.")
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
    add_naming_options(parser)
    return parser


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
    if args.from_dir and (args.experiment or args.checkpoint != "latest" or args.policy):
        raise EnjoyError("--from plays the export's own weights; drop --experiment, --checkpoint and --policy.")
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


class Playable(NamedTuple):
    """The weights to play and what the opening line says of them."""

    cfg: Config
    weights: dict  # the model's state_dict
    source: str  # the checkpoint's or the export's path
    version: object  # the policy version (learner steps), "?" where unknown
    env_frames: int


def _named(args) -> Named:
    return naming(args.modules, args.env)._replace(doom_scenario=args.doom_scenario)


def load_playable(args) -> Playable:
    """The experiment's checkpoint, or with --from the export's weights."""
    if args.from_dir:
        if not is_export(args.from_dir):
            raise EnjoyError(f"--from {args.from_dir} is not an export folder (it has no export.json); give a folder "
                             "python -m fastrl.export wrote, or play an experiment with --env and --experiment.")
        agent = read_export(args.from_dir, _named(args))
        info = agent.info
        return Playable(agent.cfg, agent.weights, args.from_dir, info.get("policy_version") or "?",
                        info.get("env_frames") or 0)
    experiment_dir = os.path.join(args.train_dir, args.experiment or args.env)
    cfg = load_experiment_config(experiment_dir, _named(args))
    # The folder the user named, not the saved config's (it may have moved).
    cfg = dataclasses.replace(cfg, train_dir=args.train_dir, experiment=args.experiment or args.env)
    state, ckpt_path = select_checkpoint(cfg, args.checkpoint, args.policy)
    if "model" not in state:
        raise EnjoyError(f"The checkpoint {ckpt_path} holds no model weights; pass --checkpoint with another one.")
    return Playable(cfg, state["model"], ckpt_path, state.get("version", "?"), state.get("env_frames", 0))


def run(args) -> None:
    from fastrl.envs.registry import UnknownEnvError, get_spec

    check_arguments(args)
    cfg, weights, source, version, frames = load_playable(args)
    env_name = args.env or cfg.env
    try:
        spec = get_spec(env_name)
    except UnknownEnvError as err:
        raise EnjoyError(str(err)) from None
    # Episodes are full games: an Atari life lost ends only the learner's episode.
    try:
        env = spec.make(seed=args.seed, render_mode="rgb_array", **{**env_options(cfg), "atari_episodic_life": False})
    except Exception as err:  # noqa: BLE001 - the env's own failure, whatever it is (see env_failure)
        raise EnjoyError(env_failure(env_name, err)) from None
    video = None
    try:
        # A saved "auto" is decided on this machine now, as a resumed run would.
        precision = resolve_precision(cfg, env.observation_space, env.action_space)
        model = build_model(cfg, env.observation_space, env.action_space, precision.acting)
        try:
            model.load_state_dict(weights)
        except RuntimeError as err:
            first = str(err).strip().splitlines()[0]
            kind = "export" if args.from_dir else "checkpoint"
            raise EnjoyError(f"The {kind} {source} does not fit the model for {env_name} ({first}); "
                             "play it on the env it was trained on.") from None
        model.eval()
        print(f"fastrl: playing {args.episodes} episode(s) of {env_name} with {source}"
              f" (policy version {version}, {frames:,} env frames)", flush=True)
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
    argv = sys.argv[1:] if argv is None else list(argv)
    from_given = any(token == "--from" or token.startswith("--from=") for token in argv)
    args = build_parser(env_required=not from_given).parse_args(argv)
    try:
        run(args)
    except (EnjoyError, AgentLoadError) as err:
        print(f"fastrl.enjoy: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
