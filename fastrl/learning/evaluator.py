"""Evaluation during training, in its own process, so training never waits for it.

Every `eval_every_frames` env frames it plays `eval_episodes` deterministic episodes
with the newest parameters on its own envs and queues the mean return, length and
true objective; a new best writes <experiment>/checkpoints/best.pt (the evaluator
owns it). It runs on one thread at nice +5, so a busy machine delays evaluations
rather than training. Grid points it overran are skipped, never queued. At the end
of training the evaluation due is still played on the final weights; only `abandon`
cuts one short. Episode i always starts from the same seed, so evaluations are
comparable (at the price of an optimistic best). Atari plays full games. An episode
still going after EPISODE_STEP_LIMIT steps (an env with no time limit) is cut there,
and the first result so cut carries a warning for the user, so that evaluations keep coming.
"""
from __future__ import annotations

import math
import os
import time
import warnings
from typing import NamedTuple, Optional

import torch

from fastrl.algo.model import build_model, load_flat_state, obs_to_tensors
from fastrl.config import env_options
from fastrl.envs.registry import get_spec
from fastrl.learning.checkpoint import BEST_NAME, CheckpointError, checkpoint_dir, load_checkpoint, save_best
from fastrl.plumbing.context import SharedContext
from fastrl.plumbing.polling import put_many_polling
from fastrl.plumbing.ranks import run_count

POLL_S = 0.1
NICENESS = 5
MAX_ENVS = 4
SEED_OFFSET = 1_000_003  # keeps evaluation starts apart from the rollout workers' seeds
NO_VERSION = -2  # below every version, the unpublished -1 included
QUEUE_TIMEOUT_S = 10.0
# Past any built-in env's episode (a full Atari game is 108,000 frames even unskipped), yet reached within minutes.
EPISODE_STEP_LIMIT = 200_000


class Episode(NamedTuple):
    """One evaluation episode's outcome."""
    ret: float
    length: int
    objective: Optional[float]  # the env's true objective (Atari's unclipped score), when it reports one
    cut: bool  # still going at EPISODE_STEP_LIMIT, so ended there


class Evaluator:
    def __init__(self, cfg, ctx: SharedContext, result_queue, abandon, frames_offset: int = 0):
        if cfg.eval_every_frames <= 0:
            raise ValueError(f"eval_every_frames={cfg.eval_every_frames}: "
                             "start the evaluator only when it is positive.")
        self.cfg, self.ctx, self.result_queue = cfg, ctx, result_queue
        self.abandon = abandon  # a StopFlag: leave now, even mid-evaluation
        self.frames_offset = frames_offset
        # It plays as the actors do, so it computes as they do.
        self.model = build_model(cfg, ctx.obs_space, ctx.action_space, ctx.precision.acting).eval()
        self.version = NO_VERSION
        self._flat = torch.zeros_like(ctx.params[0].flat)
        self.best_path = os.path.join(checkpoint_dir(cfg), BEST_NAME)
        self.best = self._previous_best()
        self.warned_of_cut_episodes = False
        spec = get_spec(cfg.env)
        options = {**env_options(cfg), "atari_episodic_life": False}
        self.envs = []
        try:
            for i in range(min(cfg.eval_episodes, MAX_ENVS)):
                self.envs.append(spec.make(seed=cfg.seed + SEED_OFFSET + i, **options))
        except BaseException:
            self.close()
            raise
        # Counted from where this run starts, so a slow start cannot delay the first evaluation.
        self.next_at = self._next_grid_point(frames_offset)

    def env_frames(self) -> int:
        """Env frames of the run so far (every rank's in a multi-rank run)."""
        return int(run_count(self.ctx.board, self.ctx.totals, "env_frames")) + self.frames_offset

    def _next_grid_point(self, frames: int) -> int:
        every = self.cfg.eval_every_frames
        return (frames // every + 1) * every

    def _previous_best(self) -> float:
        """The score of an existing best.pt (a resumed run), so that it is replaced only by a better one."""
        if not os.path.isfile(self.best_path):
            return -math.inf
        try:
            return float(load_checkpoint(self.best_path).get("best_score", -math.inf))
        except CheckpointError as err:
            warnings.warn(f"Replacing unusable best checkpoint at the next evaluation: {err}.", RuntimeWarning,
                          stacklevel=2)
            return -math.inf

    # -- loop -----------------------------------------------------------------------------
    def run(self) -> None:
        stop = self.ctx.stop
        try:
            while not self.abandon.is_set():
                training_ended = stop.is_set()  # read before the frames, so the last ones are counted
                frames = self.env_frames()
                if frames < self.next_at:
                    if training_ended:
                        break
                    stop.wait(POLL_S)
                    continue
                self.next_at = self._next_grid_point(frames)
                result = self.evaluate(frames)
                if result is None:  # stopped mid-evaluation
                    break
                put_many_polling(self.result_queue, [result], QUEUE_TIMEOUT_S)
        finally:
            self.close()

    def evaluate(self, frames: int):
        """One evaluation of the newest params: the result dict, or None if abandoned meanwhile."""
        start = time.perf_counter()
        version = self.ctx.params[0].read_if_newer(self.version, self._flat)
        if version != self.version:
            load_flat_state(self.model, self._flat)
            self.version = version
        episodes = self.play(self.cfg.eval_episodes)
        if episodes is None:
            return None
        mean_return = sum(e.ret for e in episodes) / len(episodes)
        result = {"env_frames": frames, "version": version, "eval/return": mean_return,
                  "eval/length": sum(e.length for e in episodes) / len(episodes)}
        cut = sum(e.cut for e in episodes)
        if cut and not self.warned_of_cut_episodes:
            self.warned_of_cut_episodes = True
            result["warning"] = (f"{cut} of the {len(episodes)} evaluation episodes of {self.cfg.env} ran "
                                 f"{EPISODE_STEP_LIMIT:,} steps without ending and were cut there; give the env a "
                                 "time limit (gymnasium's max_episode_steps) so that evaluations score whole episodes")
        reported = [e.objective for e in episodes if e.objective is not None]
        if reported:
            result["eval/true_objective"] = sum(reported) / len(reported)
        if mean_return > self.best:
            self.best = mean_return
            state = {"model": self.model.state_dict(), "version": version, "env_frames": frames,
                     "env": self.cfg.env, "config": self.cfg.to_dict(), "eval_return": mean_return}
            save_best(checkpoint_dir(self.cfg), state, mean_return)
        result["eval/seconds"] = time.perf_counter() - start
        return result

    @torch.no_grad()
    def play(self, count: int):
        """`count` deterministic episodes spread over the open envs, in episode order, or
        None if abandoned meanwhile."""
        model, envs, abandon = self.model, self.envs, self.abandon
        results = [None] * count
        episode_of = [None] * len(envs)  # which episode each env is playing, None when idle
        obs = [None] * len(envs)
        totals = [[0.0, 0] for _ in envs]  # return, length of the episode each env plays
        rnn = torch.zeros(len(envs), model.rnn_state_size)
        upcoming = iter(range(count))

        def begin(slot: int) -> None:
            episode = next(upcoming, None)
            episode_of[slot] = episode
            if episode is not None:
                obs[slot], _ = envs[slot].reset(seed=self.cfg.seed + SEED_OFFSET + episode)
                totals[slot] = [0.0, 0]
                rnn[slot] = 0.0

        for slot in range(len(envs)):
            begin(slot)
        while any(e is not None for e in episode_of):
            if abandon.is_set():
                return None
            active = [s for s, e in enumerate(episode_of) if e is not None]
            tensors = [obs_to_tensors(obs[s], envs[s].observation_space) for s in active]
            batch = {key: torch.stack([t[key] for t in tensors]) for key in tensors[0]}
            out = model.act(batch, rnn[active], deterministic=True)
            rnn[active] = out.rnn_state
            actions = out.actions.numpy()
            for row, slot in enumerate(active):
                obs[slot], reward, terminated, truncated, info = envs[slot].step(model.action_spec.to_env(actions[row]))
                totals[slot][0] += float(reward)
                totals[slot][1] += 1
                cut = totals[slot][1] >= EPISODE_STEP_LIMIT and not (terminated or truncated)
                if terminated or truncated or cut:
                    objective = info.get("true_objective")
                    results[episode_of[slot]] = Episode(*totals[slot], None if objective is None else float(objective),
                                                        cut)
                    begin(slot)
        return results

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


def evaluator_main(cfg, ctx: SharedContext, result_queue, abandon, frames_offset: int = 0) -> None:
    """Entry point of the evaluator process. `abandon` ends it at once, ctx.stop after
    the evaluation due; frames_offset is the resumed checkpoint's env frames."""
    # One thread whatever --torch_threads says: evaluation must leave the cores to training.
    torch.set_num_threads(1)
    os.nice(NICENESS)  # on Linux this lowers only the calling thread, so tests may call this in a thread
    Evaluator(cfg, ctx, result_queue, abandon, frames_offset).run()
