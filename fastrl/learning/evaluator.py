"""Evaluation during training, in its own process, so training never waits for it.

Every `eval_every_frames` env frames the evaluator copies the newest published
parameters, plays `eval_episodes` full episodes with the deterministic policy (the
mode of the action distribution) on its own envs, and puts one result on its queue:

    {"env_frames", "version", "eval/return", "eval/length", "eval/seconds",
     "eval/true_objective" (when the env reports one)}      (means over the episodes)

When the mean return beats every earlier evaluation (of this experiment, across
resumes) it writes <experiment>/checkpoints/best.pt. The evaluator owns best.pt; the
learner owns the periodic checkpoints.

Choices and their costs:
- Cost: eval_episodes episodes per eval_every_frames training frames, on one core at
  most (one torch thread, envs stepped in turn). The process runs at a lower CPU
  priority (nice +5): when the cores are busy, evaluation results arrive later rather
  than training slowing down.
- Evaluation points lie on the grid F, 2F, 3F... of total env frames. If one
  evaluation takes longer than F frames of training, the points it overran are
  skipped, never queued: evaluation can fall behind, it cannot pile up.
- When training ends (the run's stop flag), an evaluation under way or a grid point
  passed and not yet evaluated is still played, on the final weights, before the
  evaluator leaves: a short run whose training outpaced the evaluator's start (a
  busy machine, Doom engines) still reports the evaluations it asked for. Only the
  `abandon` flag (a signal, a failure, the runner's patience running out) cuts one
  short.
- Episode i of every evaluation starts from the same seed, so two evaluations differ
  only by their policies and scores are comparable over time. The price: the best
  checkpoint is chosen on those few starts, an optimistic estimate of its return.
- Atari envs run with episodic life off, so a return is a full game's score.
- At most MAX_ENVS envs are open, kept between evaluations (Doom engines are slow to
  start); their actions are computed in one batched forward pass.
"""
from __future__ import annotations

import math
import os
import time
import warnings

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
        spec = get_spec(cfg.env)
        options = {**env_options(cfg), "atari_episodic_life": False}
        self.envs = []
        try:
            for i in range(min(cfg.eval_episodes, MAX_ENVS)):
                self.envs.append(spec.make(seed=cfg.seed + SEED_OFFSET + i, **options))
        except BaseException:
            self.close()
            raise
        # Counted from where this run starts, not from when this process got ready, so a
        # slow start (Doom engines) cannot push the first evaluation a whole interval back.
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
        returns, lengths, objectives = zip(*episodes)
        mean_return = sum(returns) / len(returns)
        result = {"env_frames": frames, "version": version, "eval/return": mean_return,
                  "eval/length": sum(lengths) / len(lengths)}
        reported = [o for o in objectives if o is not None]
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
        """`count` deterministic episodes, episode i from seed SEED_OFFSET + i, spread
        over the open envs: a list of (return, length, true objective or None), in
        episode order; None if abandoned meanwhile."""
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
                if terminated or truncated:
                    objective = info.get("true_objective")
                    results[episode_of[slot]] = (*totals[slot], None if objective is None else float(objective))
                    begin(slot)
        return results

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []


def evaluator_main(cfg, ctx: SharedContext, result_queue, abandon, frames_offset: int = 0) -> None:
    """Entry point of the evaluator process. `abandon` (a StopFlag) ends it at once;
    ctx.stop only after the evaluation due. frames_offset is the env frames of the
    checkpoint a run resumed from, as the learner gets it, so that reported frames
    count from the experiment's start."""
    # One thread whatever --torch_threads says: evaluation must leave the cores to training.
    torch.set_num_threads(1)
    os.nice(NICENESS)  # on Linux this lowers only the calling thread, so tests may call this in a thread
    Evaluator(cfg, ctx, result_queue, abandon, frames_offset).run()
