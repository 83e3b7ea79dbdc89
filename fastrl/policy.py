"""A trained agent as a plain callable for use outside fastrl: observation(s) in,
action(s) out, as env.step takes them.

The observation normaliser lives inside the model as buffers, so it travels with
the weights and is applied as in training, never updated. A GRU's state is kept
between calls, one row per observation of the batch; `reset` clears it where an
episode ends.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import gymnasium as gym
import numpy as np
import torch

from fastrl.agent import AgentLoadError, TrainedAgent
from fastrl.algo.model import build_model, obs_layout, obs_to_tensors


class Policy:
    """Call it with one observation for one action, or a batch (a leading axis, as a
    gymnasium vector env gives) for an array of actions. `deterministic` takes the most
    likely action instead of sampling; each call may override it."""

    def __init__(self, agent: TrainedAgent, deterministic: bool = False, device: str = "cpu"):
        self.cfg = agent.cfg
        self.env = agent.cfg.env
        self.observation_space = agent.observation_space
        self.action_space = agent.action_space
        self.info = agent.info
        self.deterministic = deterministic
        self.device = torch.device(device)
        model = build_model(agent.cfg, agent.observation_space, agent.action_space)
        try:
            model.load_state_dict(agent.weights)
        except RuntimeError as err:
            first = str(err).strip().splitlines()[0]
            raise AgentLoadError(f"The weights in {agent.info.get('source')} do not fit the model its config "
                             f"builds ({first}); export or train the agent again.") from None
        self.model = model.to(self.device).eval()
        self._first_key, (self._first_shape, _) = next(iter(obs_layout(agent.observation_space).items()))
        self._state: Optional[torch.Tensor] = None

    @property
    def recurrent(self) -> bool:
        """Whether the policy carries a GRU state between calls (trained with use_rnn)."""
        return self.model.rnn_state_size > 0

    def reset(self, rows: Union[None, int, Sequence[int], np.ndarray] = None) -> None:
        """Forget the recurrent state: of every row (None), or of the batch rows given by
        index or by a boolean mask (a vector env's terminated | truncated)."""
        if rows is None or self._state is None:
            self._state = None
            return
        index = torch.as_tensor(np.asarray(rows))
        if index.dtype == torch.bool:
            index = index.nonzero().flatten()
        self._state[index.to(self.device)] = 0.0

    @torch.no_grad()
    def __call__(self, obs, deterministic: Optional[bool] = None):
        batch, batched = self._to_batch(obs)
        size = len(next(iter(batch.values())))
        if self._state is None or len(self._state) != size:  # a new batch size starts every row afresh
            self._state = torch.zeros(size, self.model.rnn_state_size, device=self.device)
        chosen = self.deterministic if deterministic is None else deterministic
        out = self.model.act(batch, self._state, deterministic=chosen)
        self._state = out.rnn_state
        actions = [self.model.action_spec.to_env(row) for row in out.actions.cpu().numpy()]
        if not batched:
            return actions[0]
        return actions if isinstance(self.action_space, gym.spaces.Tuple) else np.stack(actions)

    def _to_batch(self, obs) -> tuple:
        """({key: [B, ...] tensor} on the device, whether `obs` was a batch), by the rank of its first entry."""
        first = obs[self._first_key] if isinstance(self.observation_space, gym.spaces.Dict) else obs
        rank, expected = np.ndim(first), len(self._first_shape)
        if rank not in (expected, expected + 1):
            raise ValueError(f"The observation has {rank} dimensions, but {self.env}'s have {expected} (shape "
                             f"{self._first_shape}), or {expected + 1} as a batch.")
        if rank == expected:
            rows = [obs]
        elif isinstance(self.observation_space, gym.spaces.Dict):
            rows = [{key: value[i] for key, value in obs.items()} for i in range(len(first))]
        else:
            rows = list(obs)
        tensors = [obs_to_tensors(row, self.observation_space) for row in rows]
        batch = {key: torch.stack([t[key] for t in tensors]).to(self.device) for key in tensors[0]}
        return batch, rank == expected + 1
