"""Acting with the newest published policy: a model copy that reloads only
when the learner's version moved, and writes its outputs into the trajectory
buffers. Used by policy workers (batched over many workers' splits) and by
rollout workers with `--inference local` (on their own envs)."""
from __future__ import annotations

import torch

from fastrl.model import ActorCritic, load_flat_state


def resolve_precision(cfg) -> str:
    """cfg.precision with auto decided. bf16 pays only where the CPU has bfloat16
    instructions: elsewhere oneDNN emulates it, slower than fp32. On CUDA auto stays
    fp32 because no GPU measurement backs another choice yet."""
    if cfg.precision != "auto":
        return cfg.precision
    on_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    # Private torch helpers: a torch without them counts as no native bf16.
    native = any(getattr(torch.cpu, probe, lambda: False)()
                 for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    return "bf16" if native and not on_cuda else "fp32"


def build_model(cfg, obs_space, action_space) -> ActorCritic:
    return ActorCritic(
        obs_space,
        action_space,
        hidden_sizes=cfg.hidden_size_tuple,
        use_rnn=cfg.use_rnn,
        rnn_size=cfg.rnn_size,
        activation=cfg.activation,
        normalize_obs=cfg.normalize_obs,
        separate_critic=cfg.separate_critic,
        conv_bf16=resolve_precision(cfg) == "bf16",
        normalize_returns=cfg.normalize_returns,
    )


class PolicyCopy:
    """A read-only copy of the learner's model on `device`."""

    def __init__(self, cfg, ctx, row, device: str = "cpu"):
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
