"""APPO loss: PPO-clip policy loss on V-trace advantages, value and entropy terms.

Pure tensor functions over time-major [T, B] inputs. `valid_t` weights each
sample (1 = use it, 0 = dropped, e.g. its policy lag is past max_policy_lag);
every mean here is the masked mean sum(x * valid) / max(sum(valid), 1).
"""

from typing import NamedTuple, Optional

import torch

from fastrl.algo.vtrace import bootstrap_truncation, check_time_major, episode_discounts, vtrace


def _masked_mean(x, valid_t):
    # where() rather than x * valid alone: a dropped sample may hold inf (a stale
    # log-ratio overflowing exp), and inf * 0 would turn the whole mean into nan.
    return torch.where(valid_t > 0, x * valid_t, 0).sum() / valid_t.sum().clamp(min=1)


class PolicyLoss(NamedTuple):
    loss: torch.Tensor  # scalar, with grad
    clip_fraction: Optional[torch.Tensor]  # scalar, detached; None when not asked for


def ppo_clip_policy_loss(log_ratio_t, advantage_t, clip_ratio, valid_t, clip_fraction=True):
    """PPO clipped surrogate (Schulman et al. 2017), to be minimized.

        ratio_t = exp(log_ratio_t)
        loss = -mean(min(ratio_t * A_t, clamp(ratio_t, 1 - clip, 1 + clip) * A_t))
        clip_fraction = mean(|ratio_t - 1| > clip)   (None with clip_fraction=False)

    The gradient flows through `log_ratio_t`; `advantage_t` is treated as a constant.
    """
    check_time_major(log_ratio_t=log_ratio_t, advantage_t=advantage_t, valid_t=valid_t)
    # Zero the log-ratio of dropped samples before exp(): their values may be huge,
    # and a masked inf in the forward pass still makes a nan gradient.
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
    """Squared-error value loss, 0.5 * mean((v_tm1 - target_tm1)^2).

    With `old_v_tm1` (the behaviour policy's values) and `clip_value`, the PPO
    clipped form: 0.5 * mean(max((v - target)^2, (v_clipped - target)^2)) with
    v_clipped = old_v + clamp(v - old_v, -clip_value, clip_value).
    """
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
    """(adv_t - mean) / (std + eps), with mean and (population) std over valid samples only.

    Population rather than sample std, so a batch with one valid sample gives 0, not nan.
    """
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
    """KL(behaviour || current) estimated from log(current / behaviour) on the
    behaviour policy's samples: mean((ratio - 1) - log_ratio), never negative (Schulman's k3)."""
    log_ratio_t = torch.where(valid_t > 0, log_ratio_t, 0)
    return _masked_mean(torch.expm1(log_ratio_t) - log_ratio_t, valid_t)


class APPOLoss(NamedTuple):
    """`total` carries the gradient; the rest are detached 0-d tensors for logging,
    or None when the loss was computed without its statistics (stats=False).

    Stats stay tensors: calling .item() here would force a device sync every step.
    """

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


def appo_loss(
    logp_t,
    behaviour_logp_t,
    values,
    r_t,
    terminated_t,
    truncated_t,
    v_final_t,
    entropy_t,
    valid_t,
    *,
    gamma,
    rho_bar,
    c_bar,
    clip_ratio,
    value_coef,
    entropy_coef,
    normalize_adv,
    lambda_=1.0,
    exploration_t=None,
    value_mean=0.0,
    value_std=1.0,
    behaviour_v_tm1=None,
    value_clip=None,
    stats=True,
):
    """The learner's loss for one batch of trajectories.

    Inputs are [T, B] except `values`, the current values of s_0..s_T, [T+1, B].
    `logp_t`, `values` and `entropy_t` come from the learner's forward pass (with
    grad); `behaviour_logp_t` is what the acting policy recorded; `v_final_t` is the
    value of the final observation on truncated steps (0 elsewhere).

        total = policy_loss + value_coef * value_loss + entropy_coef * exploration

    The exploration term is -mean(entropy_t) by default, or mean(exploration_t)
    when given (a per-sample penalty with grad, such as a KL to the uniform policy,
    whose pull does not fade as the policy sharpens the way entropy's does).

    Return normalisation: with value_mean / value_std (a running estimate of the
    targets' statistics), `values` are the model's normalised outputs. V-trace runs
    on values mapped back to return units, v * value_std + value_mean, and the value
    loss regresses `values` onto the targets normalised the same way, so its scale
    no longer depends on the env's reward scale. `v_final_t` is in return units.
    lambda_ is V-trace's lambda (fastrl.algo.vtrace.vtrace). With `behaviour_v_tm1` (the
    acting policy's values, in the same units as `values`) and `value_clip`, the
    value loss is PPO's clipped form (see `value_loss`).

    The policy loss is PPO-clip on the V-trace pg advantages with log_ratio =
    logp_t - behaviour_logp_t; the value loss regresses values[:-1] onto V-trace's
    targets vs_tm1.
    The clip bounds pi / mu, so a stale sample starts its update near or past the
    clip, and pi / mu is also inside the advantage. Decoupled PPO (a clip on the
    update's own step, V-trace correcting the staleness once) was built and
    measured against this, and learned no better (benchmarks/README.md).

    A sample with valid_t = 0 is left out of every mean and cuts the trace
    (rho = c = 0), so its reward, flags and log-probs reach no other sample.

    stats=False leaves out the logging statistics (see loss_on_targets).
    """
    check_time_major(
        logp_t=logp_t, behaviour_logp_t=behaviour_logp_t, r_t=r_t, terminated_t=terminated_t,
        truncated_t=truncated_t, v_final_t=v_final_t, entropy_t=entropy_t, valid_t=valid_t,
    )
    T, B = r_t.shape
    if values.shape != (T + 1, B):
        raise ValueError(
            f"values has shape {tuple(values.shape)} but must be [T+1, B] = ({T + 1}, {B}): "
            "the values of s_0..s_T, the last one bootstrapping the rollout."
        )
    log_ratio_t = logp_t - behaviour_logp_t.detach()
    raw_values = values.detach() * value_std + value_mean
    returns = vtrace_targets(raw_values, log_ratio_t, r_t, terminated_t, truncated_t, v_final_t, valid_t,
                             gamma=gamma, rho_bar=rho_bar, c_bar=c_bar, lambda_=lambda_)
    return loss_on_targets(
        log_ratio_t, values[:-1], returns.vs_tm1, returns.pg_advantage_t, entropy_t, valid_t,
        clip_ratio=clip_ratio, value_coef=value_coef, entropy_coef=entropy_coef, normalize_adv=normalize_adv,
        exploration_t=exploration_t, value_mean=value_mean, value_std=value_std,
        behaviour_v_tm1=behaviour_v_tm1, value_clip=value_clip, stats=stats,
    )


@torch.no_grad()
def vtrace_targets(raw_values, log_ratio_t, r_t, terminated_t, truncated_t, v_final_t, valid_t, *,
                   gamma, rho_bar, c_bar, lambda_=1.0):
    """V-trace's value targets and policy-gradient advantages (VTraceReturns), in
    return units, for trajectories [T, B] whose values of s_0..s_T are
    `raw_values` [T+1, B] (return units) and whose log pi / mu are `log_ratio_t`.
    See appo_loss for the flags and for what a dropped sample (valid_t = 0) does."""
    valid_t = valid_t.to(r_t.dtype)
    # A step that both terminated and truncated ended for real: no bootstrap.
    bootstrapped_t = (truncated_t != 0) & (terminated_t == 0)
    r_t = bootstrap_truncation(r_t, bootstrapped_t, v_final_t, gamma)
    discount_t = episode_discounts(terminated_t.to(r_t.dtype), truncated_t, gamma)
    # A dropped sample cuts the trace (rho = c = 0): its behaviour policy is too
    # stale (or foreign) for its importance weight to mean anything, so earlier
    # samples bootstrap from the current V(s_t) instead of through its data.
    log_rho_t = torch.where(valid_t > 0, log_ratio_t.detach(), -torch.inf)
    return vtrace(raw_values[:-1], raw_values[1:], r_t, discount_t, log_rho_t,
                  rho_bar=rho_bar, c_bar=c_bar, lambda_=lambda_)


def loss_on_targets(log_ratio_t, v_tm1, vs_tm1, pg_advantage_t, entropy_t, valid_t, *, clip_ratio, value_coef,
                    entropy_coef, normalize_adv, exploration_t=None, value_mean=0.0, value_std=1.0,
                    behaviour_v_tm1=None, value_clip=None, stats=True):
    """appo_loss once its targets are known: PPO-clip on `pg_advantage_t`, the
    value loss of `v_tm1` (the model's normalised values, with grad) onto `vs_tm1`
    (return units), and the exploration term. Inputs are [T, B]; a minibatch of
    single samples is [1, N].

    With stats=False the logging statistics (every field but `total` and `vs_tm1`)
    are None: the learner reports them once a second, and for a small model their
    ~40 small ops and their share of the backward's bookkeeping are ~12% of a step
    (Pendulum-v1, CartPole-v1, LunarLander-v3: 0.87-0.89x without them)."""
    check_time_major(log_ratio_t=log_ratio_t, v_tm1=v_tm1, vs_tm1=vs_tm1, pg_advantage_t=pg_advantage_t,
                     entropy_t=entropy_t, valid_t=valid_t)
    valid_t = valid_t.to(vs_tm1.dtype)
    adv_t = normalize_advantages(pg_advantage_t, valid_t) if normalize_adv else pg_advantage_t
    policy = ppo_clip_policy_loss(log_ratio_t, adv_t, clip_ratio, valid_t, clip_fraction=stats)
    value = value_loss(v_tm1, (vs_tm1 - value_mean) / value_std, valid_t,
                       old_v_tm1=behaviour_v_tm1, clip_value=value_clip)
    entropy = entropy_loss(entropy_t, valid_t)
    if exploration_t is None:
        exploration = entropy
    else:
        check_time_major(exploration_t=exploration_t, valid_t=valid_t)
        exploration = _masked_mean(exploration_t, valid_t)
    total = policy.loss + value_coef * value + entropy_coef * exploration
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
