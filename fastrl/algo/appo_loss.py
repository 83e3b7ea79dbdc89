"""APPO loss: PPO-clip policy loss on V-trace advantages, value and entropy terms, over
time-major [T, B] tensors. `valid_t` is 0 for dropped samples (e.g. policy lag past
max_policy_lag); every mean is sum(x * valid) / max(sum(valid), 1).
"""

from typing import NamedTuple, Optional

import torch

from fastrl.algo.vtrace import VTraceReturns, bootstrap_truncation, check_time_major, episode_discounts, vtrace


def _masked_mean(x, valid_t):
    # where(), not x * valid alone: a dropped sample may hold inf, and inf * 0 is nan.
    return torch.where(valid_t > 0, x * valid_t, 0).sum() / valid_t.sum().clamp(min=1)


class PolicyLoss(NamedTuple):
    loss: torch.Tensor  # scalar, with grad
    clip_fraction: Optional[torch.Tensor]  # scalar, detached; None when not asked for


def ppo_clip_policy_loss(log_ratio_t, advantage_t, clip_ratio, valid_t, clip_fraction=True):
    """PPO clipped surrogate (Schulman et al. 2017), to be minimized:
    -mean(min(ratio * A, clamp(ratio, 1 - clip, 1 + clip) * A)), with the clip fraction
    unless clip_fraction=False. The advantage is a constant."""
    check_time_major(log_ratio_t=log_ratio_t, advantage_t=advantage_t, valid_t=valid_t)
    # Zero dropped samples' log-ratios before exp(): a masked inf still makes a nan gradient.
    log_ratio_t = torch.where(valid_t > 0, log_ratio_t, 0)
    ratio_t = torch.exp(log_ratio_t)
    advantage_t = advantage_t.detach()
    surrogate_t = torch.min(ratio_t * advantage_t, ratio_t.clamp(1 - clip_ratio, 1 + clip_ratio) * advantage_t)
    loss = -_masked_mean(surrogate_t, valid_t)
    if not clip_fraction:
        return PolicyLoss(loss, None)
    with torch.no_grad():
        return PolicyLoss(loss, _masked_mean(((ratio_t - 1).abs() > clip_ratio).to(ratio_t.dtype), valid_t))


def value_loss(v_tm1, target_tm1, valid_t, old_v_tm1=None, clip_value=None):
    """0.5 * mean((v - target)^2); with `old_v_tm1` and `clip_value`, PPO's clipped form
    0.5 * mean(max((v - target)^2, (old_v + clamp(v - old_v, +-clip) - target)^2))."""
    check_time_major(v_tm1=v_tm1, target_tm1=target_tm1, valid_t=valid_t)
    if (old_v_tm1 is None) != (clip_value is None):
        raise ValueError("value clipping needs both old_v_tm1 and clip_value, or neither.")
    target_tm1 = target_tm1.detach()
    sq_err_t = (v_tm1 - target_tm1) ** 2
    if clip_value is not None:
        check_time_major(v_tm1=v_tm1, old_v_tm1=old_v_tm1)
        old_v_tm1 = old_v_tm1.detach()
        v_clipped = old_v_tm1 + (v_tm1 - old_v_tm1).clamp(-clip_value, clip_value)
        sq_err_t = torch.max(sq_err_t, (v_clipped - target_tm1) ** 2)
    return 0.5 * _masked_mean(sq_err_t, valid_t)


def entropy_loss(entropy_t, valid_t):
    """-mean(entropy_t): adding coef * entropy_loss to a minimized loss raises entropy."""
    check_time_major(entropy_t=entropy_t, valid_t=valid_t)
    return -_masked_mean(entropy_t, valid_t)


def normalize_advantages(adv_t, valid_t, eps=1e-8):
    """(adv - mean) / (std + eps) over valid samples; the population std, so one valid
    sample gives 0, not nan."""
    check_time_major(adv_t=adv_t, valid_t=valid_t)
    mean = _masked_mean(adv_t, valid_t)
    std = _masked_mean((adv_t - mean) ** 2, valid_t).sqrt()
    return (adv_t - mean) / (std + eps)


def _explained_variance(v_tm1, target_tm1, valid_t):
    """1 - Var[target - v] / Var[target] over valid samples: 1 is perfect, <= 0 is useless."""
    def var(x):
        return _masked_mean((x - _masked_mean(x, valid_t)) ** 2, valid_t)

    var_target = var(target_tm1)
    return torch.where(var_target > 0, 1 - var(target_tm1 - v_tm1) / var_target, torch.nan)


def approx_kl(log_ratio_t, valid_t):
    """KL(behaviour || current) by Schulman's k3, mean((ratio - 1) - log_ratio) >= 0."""
    log_ratio_t = torch.where(valid_t > 0, log_ratio_t, 0)
    return _masked_mean(torch.expm1(log_ratio_t) - log_ratio_t, valid_t)


class APPOLoss(NamedTuple):
    """`total` carries the gradient; the rest are detached 0-d tensors for logging (None
    with stats=False), kept as tensors to avoid a device sync every step."""

    total: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor  # mean policy entropy (positive)
    clip_fraction: torch.Tensor
    approx_kl: torch.Tensor  # KL(behaviour || current), estimator mean((ratio - 1) - log_ratio)
    advantage_mean: torch.Tensor  # before normalization
    advantage_std: torch.Tensor  # before normalization
    explained_variance: torch.Tensor  # of the V-trace targets by the values; nan if targets are constant
    exploration: torch.Tensor  # mean of exploration_t, or -entropy when none was given
    value_target_mean: torch.Tensor  # of the V-trace targets, in return units
    value_target_std: torch.Tensor
    vs_tm1: torch.Tensor  # [T, B] V-trace targets in return units (for a return normalizer); not a log stat
    log_ratio_t: torch.Tensor  # [T, B] log(current / behaviour), detached (for a KL bound on the step); not a log stat


STAT_FIELDS = tuple(name for name in APPOLoss._fields if name not in ("total", "vs_tm1", "log_ratio_t"))


class Steps(NamedTuple):
    """What the trajectories recorded, each [T, B]: rewards, the episode-end flags, the
    final observation's value on truncated steps (return units), and valid_t."""
    r_t: torch.Tensor
    terminated_t: torch.Tensor
    truncated_t: torch.Tensor
    v_final_t: torch.Tensor
    valid_t: torch.Tensor


class Current(NamedTuple):
    """The learner's forward, with grad: normalised values ([T+1, B] for appo_loss,
    [T, B] for loss_on_targets), entropy [T, B], and an optional exploration penalty
    [T, B] that replaces -entropy (a KL to uniform, whose pull does not fade)."""
    values: torch.Tensor
    entropy_t: torch.Tensor
    exploration_t: Optional[torch.Tensor] = None


class Behaviour(NamedTuple):
    """The acting policy's log-probs [T, B] and, for the value clip, its values."""
    logp_t: torch.Tensor
    v_tm1: Optional[torch.Tensor] = None


class TraceSettings(NamedTuple):
    """V-trace's options (fastrl.algo.vtrace.vtrace)."""
    gamma: float
    rho_bar: float = 1.0
    c_bar: float = 1.0
    lambda_: float = 1.0


class LossSettings(NamedTuple):
    """The loss's options once its targets are known; `value_clip` None: unclipped."""
    clip_ratio: float
    value_coef: float
    entropy_coef: float
    normalize_adv: bool = True
    value_clip: Optional[float] = None


class ValueScale(NamedTuple):
    """The targets' running mean and std: values are predicted in these units, so the
    value loss does not depend on the reward scale."""
    mean: float = 0.0
    std: float = 1.0


UNSCALED = ValueScale()


def appo_loss(logp_t, current: Current, behaviour: Behaviour, steps: Steps, trace: TraceSettings,
              settings: LossSettings, value_scale: ValueScale = UNSCALED, stats: bool = True) -> APPOLoss:
    """The learner's loss for one batch of trajectories, `logp_t` [T, B] with grad:
    total = policy_loss + value_coef * value_loss + entropy_coef * exploration.

    V-trace runs on values in return units; the value loss regresses onto targets
    normalised back. pi / mu is both the surrogate's ratio (clipped) and V-trace's
    weight, so a stale sample is weighted by its ratio twice. A dropped sample is left out of every mean and
    cuts the trace, so its data reaches no other sample.
    """
    check_time_major(logp_t=logp_t, behaviour_logp_t=behaviour.logp_t, entropy_t=current.entropy_t, **steps._asdict())
    T, B = steps.r_t.shape
    values = current.values
    if values.shape != (T + 1, B):
        raise ValueError(
            f"values has shape {tuple(values.shape)} but must be [T+1, B] = ({T + 1}, {B}): "
            "the values of s_0..s_T, the last one bootstrapping the rollout."
        )
    log_ratio_t = logp_t - behaviour.logp_t.detach()
    raw_values = values.detach() * value_scale.std + value_scale.mean
    returns = vtrace_targets(raw_values, log_ratio_t, steps, trace)
    return loss_on_targets(log_ratio_t, current._replace(values=values[:-1]), returns, steps.valid_t, settings,
                           behaviour_v_tm1=behaviour.v_tm1, value_scale=value_scale, stats=stats)


@torch.no_grad()
def vtrace_targets(raw_values, log_ratio_t, steps: Steps, trace: TraceSettings) -> VTraceReturns:
    """V-trace's targets and advantages in return units, from `raw_values` [T+1, B]
    (return units) and log pi / mu."""
    r_t, terminated_t, truncated_t, v_final_t, valid_t = steps
    valid_t = valid_t.to(r_t.dtype)
    # A step that both terminated and truncated ended for real: no bootstrap.
    bootstrapped_t = (truncated_t != 0) & (terminated_t == 0)
    r_t = bootstrap_truncation(r_t, bootstrapped_t, v_final_t, trace.gamma)
    discount_t = episode_discounts(terminated_t.to(r_t.dtype), truncated_t, trace.gamma)
    # A dropped sample cuts the trace (rho = c = 0): its importance weight means nothing,
    # so earlier samples bootstrap from V(s_t) instead.
    log_rho_t = torch.where(valid_t > 0, log_ratio_t.detach(), -torch.inf)
    return vtrace(raw_values[:-1], raw_values[1:], r_t, discount_t, log_rho_t,
                  rho_bar=trace.rho_bar, c_bar=trace.c_bar, lambda_=trace.lambda_)


def loss_on_targets(log_ratio_t, current: Current, targets: VTraceReturns, valid_t, settings: LossSettings, *,
                    behaviour_v_tm1=None, value_scale: ValueScale = UNSCALED, stats: bool = True) -> APPOLoss:
    """appo_loss once its targets are known; a minibatch of single samples is [1, N].
    With stats=False the logging fields are None: for a small model their many small
    ops are a noticeable share of a step."""
    v_tm1, entropy_t, exploration_t = current
    vs_tm1, pg_advantage_t = targets
    check_time_major(log_ratio_t=log_ratio_t, v_tm1=v_tm1, vs_tm1=vs_tm1, pg_advantage_t=pg_advantage_t,
                     entropy_t=entropy_t, valid_t=valid_t)
    valid_t = valid_t.to(vs_tm1.dtype)
    value_mean, value_std = value_scale
    adv_t = normalize_advantages(pg_advantage_t, valid_t) if settings.normalize_adv else pg_advantage_t
    policy = ppo_clip_policy_loss(log_ratio_t, adv_t, settings.clip_ratio, valid_t, clip_fraction=stats)
    clipped = settings.value_clip is not None
    value = value_loss(v_tm1, (vs_tm1 - value_mean) / value_std, valid_t,
                       old_v_tm1=behaviour_v_tm1 if clipped else None, clip_value=settings.value_clip)
    entropy = entropy_loss(entropy_t, valid_t)
    if exploration_t is None:
        exploration = entropy
    else:
        check_time_major(exploration_t=exploration_t, valid_t=valid_t)
        exploration = _masked_mean(exploration_t, valid_t)
    total = policy.loss + settings.value_coef * value + settings.entropy_coef * exploration
    if not stats:
        return APPOLoss(total=total, vs_tm1=vs_tm1, log_ratio_t=log_ratio_t.detach(), **dict.fromkeys(STAT_FIELDS))

    with torch.no_grad():
        adv_mean = _masked_mean(pg_advantage_t, valid_t)
        target_mean = _masked_mean(vs_tm1, valid_t)
        return APPOLoss(
            total=total,
            policy_loss=policy.loss.detach(),
            value_loss=value.detach(),
            entropy=-entropy.detach(),
            clip_fraction=policy.clip_fraction,
            approx_kl=approx_kl(log_ratio_t, valid_t),
            advantage_mean=adv_mean,
            advantage_std=_masked_mean((pg_advantage_t - adv_mean) ** 2, valid_t).sqrt(),
            explained_variance=_explained_variance(v_tm1.detach() * value_std + value_mean, vs_tm1, valid_t),
            exploration=exploration.detach(),
            value_target_mean=target_mean,
            value_target_std=_masked_mean((vs_tm1 - target_mean) ** 2, valid_t).sqrt(),
            vs_tm1=vs_tm1,
            log_ratio_t=log_ratio_t.detach(),
        )
