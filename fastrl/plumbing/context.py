"""SharedContext: everything the processes of one run hold in common. Built once by
the runner before any child starts and passed to each: tensors travel as shared
memory, queues as faster-fifo handles. Nothing else is shared."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import faster_fifo
import gymnasium as gym
import torch

from fastrl.algo.distributions import ActionSpec
from fastrl.algo.model import Precision
from fastrl.plumbing.buffers import HeldBuffers, TrajectoryBuffers
from fastrl.plumbing.hyper import SharedHyper
from fastrl.plumbing.params import SharedParams, StopFlag
from fastrl.plumbing.ranks import RunTotals
from fastrl.plumbing.stats_board import StatsBoard


@dataclass
class SharedContext:
    obs_space: gym.Space
    action_space: gym.Space
    action_spec: ActionSpec
    buffers: TrajectoryBuffers
    params: List[SharedParams]  # one per policy: its learner publishes, every acting process reads
    board: StatsBoard  # one row of counters per process
    stop: StopFlag  # set by the runner; every loop polls it
    # The queues carry small messages only; the data stays in `buffers`.
    free_queue: faster_fifo.Queue  # buffer indices free to fill: consumer -> rollout workers
    # One per policy: indices of its full trajectories, rollout workers -> its learner (or the sink).
    traj_queues: List[faster_fifo.Queue]
    episode_queue: faster_fifo.Queue  # lists of (return, length, true objective, policy): rollout workers -> runner
    metrics_queue: faster_fifo.Queue  # dicts of loss statistics: learner -> runner
    request_queue: faster_fifo.Queue  # (worker, split, buffer, t, epoch) wanting actions: rollout -> policy workers
    response_queues: List[faster_fifo.Queue]  # one per rollout worker: (split, buffer, t) whose actions are written
    rnn_states: List[torch.Tensor]  # one [splits, envs, H] per rollout worker; empty with local inference
    # [1] int64: policy-worker restarts; a request from an earlier epoch is stale.
    inference_epoch: torch.Tensor
    held_buffers: HeldBuffers
    learner_threads: torch.Tensor  # [1]: the learner's torch threads, which the runner's adapter may move
    # [num_workers] int8: 1 once a rollout worker handed its first trajectory over.
    first_handed: torch.Tensor
    # The image encoders' arithmetic per role, decided once by the runner.
    precision: Precision
    # A multi-rank run's counters summed over ranks and the agreed stop; None in a run of one.
    totals: Optional[RunTotals] = None
    # Each policy's PBT hyperparameters (the runner writes, learners take); None without --with_pbt.
    hyper: Optional[SharedHyper] = None
