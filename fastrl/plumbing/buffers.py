"""Trajectory buffers: preallocated shared-memory tensors that rollout workers write
and the learner reads; only buffer indices cross the queues. One buffer holds one env
split's trajectory (`rollout` steps of `envs_per_split` envs, plus the bootstrap
observation), so writes are row writes and a queue message is one integer.
"""
from __future__ import annotations

import math

import torch

from fastrl.algo.model import obs_zeros

# Above this many bytes per buffer, gather copies buffer by buffer (contiguous runs at
# memcpy speed); below it, one index_select beats a Python loop (batch_gather in
# benchmarks/experiments/README.md).
COPY_PER_BUFFER_BYTES = 256 * 1024


class TrajectoryBuffers:
    """Shared tensors indexed [buffer, t, env, ...].

    obs[k]            [N, T+1, n, *shape]  observation seen before step t (t=T: bootstrap obs);
                                           images channels-last in memory (model.obs_zeros)
    episode_start     [N, T+1, n]          obs[t] is the first of an episode (GRU resets there)
    actions           [N, T, n, A]         action taken at t
    behaviour_logp    [N, T, n]            its log-prob under the policy that chose it
    behaviour_value   [N, T, n]            that policy's value of obs[t] (what value clipping clips around)
    policy_version    [N, T, n]            learner version of that policy (for the lag)
    rewards           [N, T, n]
    terminated        [N, T, n]            the episode really ended after step t
    truncated         [N, T, n]            a time limit cut it after step t
    final_obs[k]      [N, T, n, *shape]    on truncation, the last obs, whose value bootstraps
    rnn_state0        [N, n, H]            GRU state before obs[0] (H = 0 without a GRU)
    """

    def __init__(self, num_buffers: int, rollout: int, envs_per_split: int, obs_layout: dict,
                 action_dim: int, action_dtype: torch.dtype, rnn_size: int):
        N, T, n = num_buffers, rollout, envs_per_split
        self.num_buffers, self.rollout, self.envs_per_split = N, T, n

        def shared(shape, dtype):
            return torch.zeros(shape, dtype=dtype).share_memory_()

        self.obs = {k: obs_zeros((N, T + 1, n), shape, dtype).share_memory_()
                    for k, (shape, dtype) in obs_layout.items()}
        # Truncations are rare, so this mostly idle copy of the obs is the price of an
        # exact bootstrap; the learner reads only the truncated rows.
        self.final_obs = {k: obs_zeros((N, T, n), shape, dtype).share_memory_()
                          for k, (shape, dtype) in obs_layout.items()}
        self.episode_start = shared((N, T + 1, n), torch.bool)
        self.actions = shared((N, T, n, action_dim), action_dtype)
        self.behaviour_logp = shared((N, T, n), torch.float32)
        self.behaviour_value = shared((N, T, n), torch.float32)
        self.policy_version = shared((N, T, n), torch.int64)
        self.rewards = shared((N, T, n), torch.float32)
        self.terminated = shared((N, T, n), torch.bool)
        self.truncated = shared((N, T, n), torch.bool)
        self.rnn_state0 = shared((N, n, rnn_size), torch.float32)

    @staticmethod
    def bytes_needed(num_buffers: int, rollout: int, envs_per_split: int, obs_layout: dict, action_dim: int,
                     action_dtype: torch.dtype, rnn_size: int) -> int:
        """nbytes() of the buffers these arguments make, without making them (the /dev/shm check)."""
        def size(dtype: torch.dtype) -> int:
            return torch.empty((), dtype=dtype).element_size()

        obs = sum(math.prod(shape) * size(dtype) for shape, dtype in obs_layout.values())
        # Per step: obs and final_obs, three flags, the action, logp, value, reward and the version.
        step = 2 * obs + 3 * size(torch.bool) + action_dim * size(action_dtype) + 3 * 4 + 8
        per_env = rollout * step + obs + size(torch.bool) + rnn_size * 4  # the bootstrap row, the GRU state
        return num_buffers * envs_per_split * per_env

    def nbytes(self) -> int:
        tensors = [*self.obs.values(), *self.final_obs.values(), self.episode_start, self.actions,
                   self.behaviour_logp, self.behaviour_value, self.policy_version, self.rewards, self.terminated,
                   self.truncated, self.rnn_state0]
        return sum(t.numel() * t.element_size() for t in tensors)

    def gather(self, indices: list) -> dict:
        """Copy the given buffers out into one time-major batch [T(+1), len*n, ...], so
        the buffers can be freed at once. final_obs comes back compact, the truncated
        steps' rows only, with final_row [T, len*n] giving each step's row (-1 if none).
        """
        idx = torch.as_tensor(indices, dtype=torch.long)
        n = self.envs_per_split

        def take(t: torch.Tensor) -> torch.Tensor:
            """[N, T', n, ...] -> [T', k*n, ...]: buffer j's envs become columns j*n.."""
            image = t.dim() == 6 and t.stride(-3) == 1  # channels-last frames stay channels-last
            if t.stride(0) * t.element_size() < COPY_PER_BUFFER_BYTES:  # (a buffer's bytes)
                # Small tensors: index_select, transpose, reshape beat a loop of copies.
                x = (t.movedim(-3, -1) if image else t).index_select(0, idx).transpose(0, 1)
                x = x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])
                return x.movedim(-1, -3) if image else x
            if image:
                out = t.new_empty((t.shape[1], len(indices) * n, *t.shape[4:], t.shape[3])).movedim(-1, -3)
            else:
                out = t.new_empty((t.shape[1], len(indices) * n, *t.shape[3:]))
            for j, i in enumerate(indices):
                out[:, j * n:(j + 1) * n].copy_(t[i])
            return out

        truncated = take(self.truncated)  # [T, k*n]
        t_idx, col = truncated.nonzero(as_tuple=True)
        buf, env = idx[col // self.envs_per_split], col % self.envs_per_split
        final_row = torch.full(truncated.shape, -1, dtype=torch.long)
        final_row[t_idx, col] = torch.arange(t_idx.numel())
        rnn0 = self.rnn_state0.index_select(0, idx)  # [k, n, H]
        return {
            "obs": {k: take(v) for k, v in self.obs.items()},
            "final_obs": {k: v[buf, t_idx, env] for k, v in self.final_obs.items()},
            "final_row": final_row,
            "episode_start": take(self.episode_start),
            "actions": take(self.actions),
            "behaviour_logp": take(self.behaviour_logp),
            "behaviour_value": take(self.behaviour_value),
            "policy_version": take(self.policy_version),
            "rewards": take(self.rewards),
            "terminated": take(self.terminated),
            "truncated": truncated,
            "rnn_state0": rnn0.flatten(0, 1),
        }


class HeldBuffers:
    """Which trajectory buffer each worker split holds: [worker, split], -1 = none. A
    worker clears its slot before handing a buffer over and sets it right after taking
    one, so a death in between loses an index rather than putting one in two places.
    """

    def __init__(self, num_workers: int, num_splits: int):
        self.table = torch.full((num_workers, num_splits), -1, dtype=torch.int64).share_memory_()

    def set(self, worker: int, split: int, buf: int) -> None:
        self.table[worker, split] = buf

    def release(self, worker: int) -> list:
        held = [int(b) for b in self.table[worker] if b >= 0]
        self.table[worker] = -1
        return held
