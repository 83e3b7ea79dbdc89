"""Acting with the newest published policy: a model copy that reloads only
when the learner's version moved, and writes its outputs into the trajectory
buffers. Used by policy workers (batched over many workers' splits) and by
rollout workers with `--inference local` (on their own envs)."""
from __future__ import annotations

import torch

from fastrl.algo.model import build_model, load_flat_state
from fastrl.plumbing.context import SharedContext
from fastrl.plumbing.stats_board import BoardRow


class PolicyCopy:
    """A read-only copy of the learner's model on `device`."""

    def __init__(self, cfg, ctx: SharedContext, row: BoardRow, device: str = "cpu"):
        self.ctx, self.row = ctx, row
        self.device = torch.device(device)
        self.model = build_model(cfg, ctx.obs_space, ctx.action_space).to(self.device)
        self.model.eval()
        self.rnn_size = self.model.rnn_state_size
        self._flat = torch.zeros_like(ctx.params.flat)
        self.version = -1
        self.refresh()

    def refresh(self) -> None:
        version = self.ctx.params.read_if_newer(self.version, self._flat)
        if version != self.version:
            load_flat_state(self.model, self._flat.to(self.device))
            self.version = version
            self.row.add("policy_reloads", 1)

    @torch.no_grad()
    def act(self, obs: dict, rnn_state: torch.Tensor):
        self.refresh()
        out = self.model.act({k: v.to(self.device) for k, v in obs.items()}, rnn_state.to(self.device))
        self.row.add("inference_batches", 1)
        self.row.add("inference_samples", out.actions.shape[0])
        return out


class LocalPolicy(PolicyCopy):
    """Inference inside a rollout worker, on one split at a time."""

    def act_into(self, buf: int, t: int, rnn_state: torch.Tensor) -> torch.Tensor:
        b = self.ctx.buffers
        out = self.act({k: v[buf, t] for k, v in b.obs.items()}, rnn_state)
        b.actions[buf, t] = out.actions
        b.behaviour_logp[buf, t] = out.logp
        b.behaviour_value[buf, t] = out.values
        b.policy_version[buf, t] = self.version
        return out.rnn_state
