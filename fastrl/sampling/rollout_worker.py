"""Rollout worker process: steps its envs and writes trajectories into shared memory,
acting itself (`--inference local`) or asking the policy workers and stepping its
other env split meanwhile (double buffering). In games of several learning agents the
splits of a step group, one per agent, step together."""
from __future__ import annotations

import queue
import time

import torch

from fastrl.config import env_options
from fastrl.envs.registry import get_spec
from fastrl.plumbing.context import SharedContext
from fastrl.plumbing.polling import get_many_polling, put_many_polling
from fastrl.plumbing.proc import pin_to_core, usable_cores, use_batch_scheduling
from fastrl.plumbing.seeding import env_seed
from fastrl.plumbing.stats_board import Timer
from fastrl.plumbing.timeline import mark
from fastrl.sampling.env_split import SplitEnvs, SplitOptions, make_envs, make_match_agents
from fastrl.sampling.inference import LocalPolicy, RemotePolicy

QUEUE_TIMEOUT_S = 0.1  # how often a waiting loop looks at the stop flag (it polls: fastrl/plumbing/polling.py)
EPISODE_FLUSH_S = 0.5
MATCH_START_THREADS = 8  # multi-agent games a worker starts at once
FIRST_BATCH_POLL_S = 0.02  # how often a worker waiting to start looks at the first batch's workers


class RolloutWorker:
    def __init__(self, cfg, index: int, ctx: SharedContext):
        self.cfg, self.index, self.ctx = cfg, index, ctx
        self.row = ctx.board.row(f"rollout_{index}")
        self.timer = Timer(self.row)
        self.spec = get_spec(cfg.env)
        self.frameskip = self.spec.frameskip
        self.T = cfg.rollout
        b = ctx.buffers
        self.views = {
            "obs": {k: t.numpy() for k, t in b.obs.items()},
            "final_obs": {k: t.numpy() for k, t in b.final_obs.items()},
            "episode_start": b.episode_start.numpy(),
            "actions": b.actions.numpy(),
            "rewards": b.rewards.numpy(),
            "terminated": b.terminated.numpy(),
            "truncated": b.truncated.numpy(),
        }
        n = cfg.envs_per_split
        # The envs' seeds derive from this process's (fastrl.plumbing.seeding), so a
        # restarted worker or a resumed run meets new episodes.
        worker_seed = torch.initial_seed()
        seeds = [env_seed(worker_seed, i) for i in range(cfg.num_splits * n)]
        # Make engines as many at once as this worker's share of the cores: that fills
        # the cores and no more. Workers outside the first batch wait (rollout_worker_main),
        # so the first batch's workers share the cores meanwhile (benchmarks/startup.py).
        leading = first_batch_workers(cfg)
        threads = max(1, usable_cores() // (leading if index < leading else cfg.num_workers))
        agents = cfg.agents_per_game
        if agents > 1:
            # A game's start is mostly its players' network handshake, so start many at once.
            envs = make_match_agents(self.spec, env_options(cfg), seeds, agents, cfg.num_splits,
                                     on_env_made=self._env_made, threads=max(threads, MATCH_START_THREADS))
        else:
            envs = make_envs(self.spec, env_options(cfg), seeds, on_env_made=self._env_made, threads=threads)
        # The splits that step together: agent a of a group's games is in its split a.
        self.groups = [list(range(g, g + agents)) for g in range(0, cfg.num_splits, agents)]
        self.splits = [SplitEnvs(self.spec, env_options(cfg), seeds[s * n:(s + 1) * n], envs[s * n:(s + 1) * n],
                                 self.views, ctx.action_spec,
                                 SplitOptions(on_restart=self._publish_env_restarts, decorrelate=cfg.decorrelate_envs,
                                              on_progress=self.row.beat))
                       for s in range(cfg.num_splits)]
        mark(f"rollout-worker {index}: envs made")
        self.buf = [0] * cfg.num_splits  # trajectory buffer each split writes into
        self.t = [0] * cfg.num_splits  # step within it
        self._last_flush = time.time()
        self._handed_first = False  # whether this worker said it handed a trajectory over (ctx.first_handed)
        # A restarted worker adds to its predecessor's count rather than resetting it.
        self._env_restarts_before = self.row.get("env_restarts")

    def _env_made(self) -> None:
        self.row.beat()  # making many slow envs (ViZDoom games) is progress, not a hang
        mark(f"rollout-worker {self.index}: env made")

    # -- trajectory bookkeeping -----------------------------------------------------
    def _take_free_buffer(self) -> int | None:
        """Block until the learner frees a buffer: production is throttled here, never
        dropped, when the learner falls behind."""
        with self.timer("wait_s"):
            while not self.ctx.stop.is_set():
                try:
                    return get_many_polling(self.ctx.free_queue, QUEUE_TIMEOUT_S, max_messages=1)[0]
                except queue.Empty:
                    self.row.beat()
        return None

    def _advance(self, s: int, rnn_state: torch.Tensor) -> bool:
        """Move split s one step on; at a trajectory's end hand it to the learner and
        continue in a fresh buffer. False when told to stop."""
        self.t[s] += 1
        if self.t[s] < self.T:
            return True
        b, old = self.ctx.buffers, self.buf[s]
        # The next trajectory starts with row T of `old`: copy it out before handing
        # `old` over, as the learner may free it and another split overwrite it while
        # this worker waits for a buffer. (Taking the next buffer first would delay
        # `old` by that wait.)
        with self.timer("comm_s"):
            carry_obs = {k: v[old, self.T].clone() for k, v in b.obs.items()}
            carry_start = b.episode_start[old, self.T].clone()
            self.ctx.held_buffers.set(self.index, s, -1)
            put_many_polling(self.ctx.traj_queues[self.cfg.policy_of_split(s)], [old], 10.0)
            if not self._handed_first:
                self.ctx.first_handed[self.index] = 1  # the workers waiting to start may go
                self._handed_first = True
        new = self._take_free_buffer()
        if new is None:
            return False
        self.ctx.held_buffers.set(self.index, s, new)
        with self.timer("comm_s"):
            for k, row in carry_obs.items():
                b.obs[k][new, 0] = row
            b.episode_start[new, 0] = carry_start
            b.rnn_state0[new] = rnn_state * ~carry_start[:, None]
        self.buf[s], self.t[s] = new, 0
        return True

    def _step_group(self, group: list) -> None:
        with self.timer("busy_s"):
            for s in group:
                self.splits[s].send(self.buf[s], self.t[s])
            for s in group:
                self.splits[s].receive(self.buf[s], self.t[s])
        n = sum(self.splits[s].n for s in group)
        self.row.add("env_steps", n)
        self.row.add("env_frames", n * self.frameskip)

    def _publish_env_restarts(self) -> None:
        # Published at once, before the replacement env is made, so the count is not
        # lost if the worker is killed while a new engine starts.
        self.row.set("env_restarts", self._env_restarts_before + sum(sp.restarts for sp in self.splits))

    def _flush_episodes(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_flush < EPISODE_FLUSH_S:
            return
        self._last_flush = now
        self.row.beat()
        done = [(*ep, self.cfg.policy_of_split(s))  # (return, length, objective, policy)
                for s, split in enumerate(self.splits) for ep in split.drain_finished()]
        if done:
            try:
                self.ctx.episode_queue.put(done, block=False)
            except queue.Full:
                pass  # the runner is behind on reading; stats are not worth blocking sampling for

    def _start_splits(self) -> bool:
        for s, split in enumerate(self.splits):
            buf = self._take_free_buffer()
            if buf is None:
                return False
            self.ctx.held_buffers.set(self.index, s, buf)
            self.buf[s], self.t[s] = buf, 0
            with self.timer("busy_s"):
                split.reset_all(buf, 0)
            self.ctx.buffers.rnn_state0[buf] = 0.0
        mark(f"rollout-worker {self.index}: envs reset")
        return True

    # -- main loops -----------------------------------------------------------------
    def run(self) -> None:
        try:
            if not self._start_splits():
                return
            if self.cfg.inference == "local":
                self._run_local()
            else:
                self._run_with_policy_workers()
        finally:
            self._flush_episodes(force=True)
            for split in self.splits:
                split.close()

    def _run_local(self) -> None:
        cfg = self.cfg
        # One copy of each policy's model; split s acts with policy_of_split(s)'s.
        policies = [LocalPolicy(cfg, self.ctx, self.row, self.index, policy=k) for k in range(cfg.num_policies)]
        acting = [policies[cfg.policy_of_split(s)] for s in range(len(self.splits))]
        b = self.ctx.buffers
        rnn = [torch.zeros(cfg.envs_per_split, policies[0].rnn_size) for _ in self.splits]
        while not self.ctx.stop.is_set():
            for group in self.groups:
                for s in group:
                    buf, t = self.buf[s], self.t[s]
                    with self.timer("busy_s"):
                        rnn[s] = acting[s].act_into(buf, t, rnn[s] * ~b.episode_start[buf, t, :, None])
                self._step_group(group)
                for s in group:
                    if not self._advance(s, rnn[s]):
                        return
            self._flush_episodes()

    def _run_with_policy_workers(self) -> None:
        policy = RemotePolicy(self.ctx, self.index)
        for s in range(len(self.splits)):
            with self.timer("comm_s"):
                policy.request(s, self.buf[s], self.t[s])
        answered: set = set()  # splits whose actions came, waiting for the rest of their group
        while not self.ctx.stop.is_set():
            with self.timer("wait_s"):
                ready = policy.answered(QUEUE_TIMEOUT_S)
            if not ready:
                self.row.beat()
                continue
            answered.update(ready)
            for group in self.groups:
                if not answered.issuperset(group):
                    continue
                answered.difference_update(group)
                self._step_group(group)
                for s in group:
                    if not self._advance(s, policy.rnn[s]):
                        return
                    with self.timer("comm_s"):
                        policy.request(s, self.buf[s], self.t[s])
            self._flush_episodes()


def first_batch_workers(cfg) -> int:
    """How many rollout workers, the lowest-numbered, fill the learner's first batch.
    The others make their envs only after these handed a trajectory over, so the
    first batch's envs get the cores. All workers with several policies or agents."""
    if cfg.num_policies > 1 or cfg.agents_per_game > 1:
        return cfg.num_workers
    return min(cfg.num_workers, -(-cfg.buffers_per_batch // cfg.num_splits))


def wait_for_first_batch_workers(cfg, index: int, ctx: SharedContext) -> bool:
    """Wait, beating, until the first batch's workers have each handed a trajectory
    over (no wait for those workers themselves). False if the run stopped meanwhile."""
    leading = first_batch_workers(cfg)
    if index < leading:
        return True
    row = ctx.board.row(f"rollout_{index}")
    while not bool(ctx.first_handed[:leading].all()):
        if ctx.stop.is_set():
            return False
        row.beat()
        time.sleep(FIRST_BATCH_POLL_S)
    mark(f"rollout-worker {index}: first batch's workers started")
    return True


def rollout_worker_main(cfg, index: int, ctx: SharedContext) -> None:
    # Before the envs are made, so their engines inherit the policy, niceness and core.
    use_batch_scheduling(cfg.worker_nice)
    if cfg.pin_workers:
        pin_to_core(index)
    if wait_for_first_batch_workers(cfg, index, ctx):
        RolloutWorker(cfg, index, ctx).run()
