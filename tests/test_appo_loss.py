"""APPO loss terms: golden values, gradient signs, clipping, masking."""

import pytest
import torch

from fastrl.algo import appo_loss as loss_module
from fastrl.algo.appo_loss import (
    STAT_FIELDS,
    Behaviour,
    Current,
    LossSettings,
    Steps,
    TraceSettings,
    ValueScale,
    entropy_loss,
    normalize_advantages,
    ppo_clip_policy_loss,
    value_loss,
)
from fastrl.algo.vtrace import bootstrap_truncation, episode_discounts, vtrace

T, B = 6, 4
HPARAMS = dict(gamma=0.9, rho_bar=1.0, c_bar=1.0, clip_ratio=0.2, value_coef=0.5, entropy_coef=0.01, normalize_adv=True)


def batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    terminated = torch.zeros(T, B)
    truncated = torch.zeros(T, B)
    terminated[2, 0] = 1.0
    truncated[3, 1] = 1.0
    return dict(
        logp_t=(-torch.rand(T, B, generator=g) * 2).requires_grad_(),
        behaviour_logp_t=-torch.rand(T, B, generator=g) * 2,
        values=torch.randn(T + 1, B, generator=g).requires_grad_(),
        r_t=torch.randn(T, B, generator=g),
        terminated_t=terminated,
        truncated_t=truncated,
        v_final_t=truncated * 3.0,
        entropy_t=torch.rand(T, B, generator=g).requires_grad_(),
        valid_t=torch.ones(T, B),
    )


def appo_loss(logp_t, behaviour_logp_t, values, r_t, terminated_t, truncated_t, v_final_t, entropy_t, valid_t, *,
              gamma, rho_bar, c_bar, clip_ratio, value_coef, entropy_coef, normalize_adv, lambda_=1.0,
              exploration_t=None, value_mean=0.0, value_std=1.0, stats=True):
    """The loss with every input named, as the golden values below were written: the
    bundles fastrl.algo.appo_loss takes, built from them."""
    return loss_module.appo_loss(
        logp_t, Current(values, entropy_t, exploration_t), Behaviour(behaviour_logp_t),
        Steps(r_t, terminated_t, truncated_t, v_final_t, valid_t), TraceSettings(gamma, rho_bar, c_bar, lambda_),
        LossSettings(clip_ratio, value_coef, entropy_coef, normalize_adv), ValueScale(value_mean, value_std),
        stats=stats)


def grads(total, *tensors):
    return torch.autograd.grad(total, tensors)


# ---- ppo_clip_policy_loss ----


def test_policy_loss_golden():
    # clip = 0.2, all valid.  ratio:      1.0   1.5   0.5   1.1
    #                         advantage:  2.0   1.0  -1.0  -3.0
    # unclipped ratio*A:                  2.0   1.5  -0.5  -3.3
    # clipped (ratio in [0.8, 1.2])*A:    2.0   1.2  -0.8  -3.3
    # min:                                2.0   1.2  -0.8  -3.3  -> mean -0.225, loss 0.225
    # |ratio - 1| > 0.2:                  no    yes   yes   no   -> clip fraction 0.5
    ratio = torch.tensor([[1.0, 1.5, 0.5, 1.1]])
    adv = torch.tensor([[2.0, 1.0, -1.0, -3.0]])
    out = ppo_clip_policy_loss(ratio.log(), adv, 0.2, torch.ones(1, 4))
    torch.testing.assert_close(out.loss, torch.tensor(0.225))
    torch.testing.assert_close(out.clip_fraction, torch.tensor(0.5))
    assert out.loss.shape == () and out.clip_fraction.shape == ()


def test_positive_advantage_raises_logp_of_its_action():
    log_ratio = torch.zeros(1, 2, requires_grad=True)
    out = ppo_clip_policy_loss(log_ratio, torch.tensor([[1.0, -1.0]]), 0.2, torch.ones(1, 2))
    (g,) = grads(out.loss, log_ratio)
    assert g[0, 0] < 0  # gradient descent increases logp where A > 0
    assert g[0, 1] > 0  # and decreases it where A < 0


@pytest.mark.parametrize(
    "ratio,adv,clipped",
    [(1.5, 1.0, True), (0.5, -1.0, True), (1.5, -1.0, False), (0.5, 1.0, False), (1.1, 1.0, False)],
)
def test_clipping_zeroes_gradient_only_in_the_advantage_direction(ratio, adv, clipped):
    log_ratio = torch.tensor([[ratio]]).log().requires_grad_()
    out = ppo_clip_policy_loss(log_ratio, torch.tensor([[adv]]), 0.2, torch.ones(1, 1))
    (g,) = grads(out.loss, log_ratio)
    assert (g.item() == 0.0) == clipped


def test_policy_loss_ignores_masked_samples_even_if_non_finite():
    log_ratio = torch.tensor([[0.1, 1000.0]], requires_grad=True)
    adv = torch.tensor([[1.0, float("inf")]])
    out = ppo_clip_policy_loss(log_ratio, adv, 0.2, torch.tensor([[1.0, 0.0]]))
    (g,) = grads(out.loss, log_ratio)
    torch.testing.assert_close(out.loss, -torch.tensor(0.1).exp().clamp(max=1.2))
    assert out.clip_fraction.item() == 0.0
    assert torch.isfinite(g).all() and g[0, 1] == 0.0


# ---- value, entropy, normalization ----


def test_value_loss_golden():
    # errors v - target = 1, -2, (masked 10) -> 0.5 * (1 + 4) / 2 = 1.25
    v = torch.tensor([[1.0, 0.0, 10.0]])
    target = torch.tensor([[0.0, 2.0, 0.0]])
    torch.testing.assert_close(value_loss(v, target, torch.tensor([[1.0, 1.0, 0.0]])), torch.tensor(1.25))


def test_clipped_value_loss_golden():
    # clip 0.5.  old = 0, 0;  v = 2, 0.2;  target = 1, 1
    # sample 0: unclipped (2-1)^2 = 1;    v_clipped = 0.5, (0.5-1)^2 = 0.25 -> max 1
    # sample 1: unclipped (0.2-1)^2 = 0.64; v_clipped = 0.2, same 0.64    -> max 0.64
    # 0.5 * mean(1, 0.64) = 0.41
    v = torch.tensor([[2.0, 0.2]], requires_grad=True)
    loss = value_loss(v, torch.ones(1, 2), torch.ones(1, 2), old_v_tm1=torch.zeros(1, 2), clip_value=0.5)
    torch.testing.assert_close(loss, torch.tensor(0.41))
    # A clipped prediction moving away from the target still gets pulled back.
    (g,) = grads(loss, v)
    assert g[0, 0] > 0


def test_value_clipping_needs_both_arguments():
    x = torch.zeros(2, 2)
    with pytest.raises(ValueError, match="both old_v_tm1 and clip_value"):
        value_loss(x, x, x, clip_value=0.2)


def test_value_loss_does_not_backprop_into_target():
    target = torch.ones(2, 2, requires_grad=True)
    v = torch.zeros(2, 2, requires_grad=True)
    loss = value_loss(v, target, torch.ones(2, 2))
    assert grads(loss, v)[0].abs().sum() > 0
    assert torch.autograd.grad(loss, target, allow_unused=True)[0] is None


def test_entropy_loss_sign():
    entropy = torch.tensor([[0.5, 1.5, 100.0]], requires_grad=True)
    loss = entropy_loss(entropy, torch.tensor([[1.0, 1.0, 0.0]]))
    torch.testing.assert_close(loss, torch.tensor(-1.0))
    (g,) = grads(loss, entropy)
    assert (g[0, :2] < 0).all() and g[0, 2] == 0  # descending the loss raises entropy


def test_normalize_advantages_uses_valid_samples_only():
    adv = torch.tensor([[1.0, 3.0, 5.0, 1e6]])
    valid = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    out = normalize_advantages(adv, valid)
    std = (8.0 / 3.0) ** 0.5  # population std of 1, 3, 5
    torch.testing.assert_close(out[:, :3], torch.tensor([[-2.0, 0.0, 2.0]]) / std)


# ---- appo_loss ----


def test_appo_loss_outputs():
    out = appo_loss(**batch(), **HPARAMS)
    assert out.vs_tm1.shape == (T, B) and not out.vs_tm1.requires_grad
    for name in STAT_FIELDS + ("total",):
        value = getattr(out, name)
        assert value.shape == (), name
        assert torch.isfinite(value), name
        assert value.requires_grad == (name == "total"), name
    torch.testing.assert_close(
        out.total, out.policy_loss + HPARAMS["value_coef"] * out.value_loss - HPARAMS["entropy_coef"] * out.entropy
    )


def test_appo_loss_uses_vtrace_targets_with_truncation_bootstrap():
    b = batch(1)
    out = appo_loss(**b, **dict(HPARAMS, normalize_adv=False))
    with torch.no_grad():
        r = bootstrap_truncation(b["r_t"], b["truncated_t"], b["v_final_t"], 0.9)
        discount = episode_discounts(b["terminated_t"], b["truncated_t"], 0.9)
        v = b["values"]
        ret = vtrace(v[:-1], v[1:], r, discount, b["logp_t"] - b["behaviour_logp_t"])
    torch.testing.assert_close(out.value_loss, 0.5 * ((v[:-1] - ret.vs_tm1) ** 2).mean())
    torch.testing.assert_close(out.advantage_mean, ret.pg_advantage_t.mean())


def test_appo_gradient_sign_follows_advantage():
    # One on-policy step, V = 0 everywhere, reward +1 or -1: advantage = reward.
    for reward, expected_sign in [(1.0, -1.0), (-1.0, 1.0)]:
        logp = torch.tensor([[-0.7]], requires_grad=True)
        z = torch.zeros(1, 1)
        out = appo_loss(
            logp, logp.detach().clone(), torch.zeros(2, 1, requires_grad=True), torch.tensor([[reward]]),
            z, z, z, torch.zeros(1, 1), torch.ones(1, 1), **dict(HPARAMS, normalize_adv=False),
        )
        (g,) = grads(out.total, logp)
        assert torch.sign(g).item() == expected_sign


def test_appo_masked_sample_does_not_affect_loss():
    b = batch(2)
    b["valid_t"][3, 2] = 0.0  # mid-rollout: samples before it must not see its data
    out = appo_loss(**b, **HPARAMS)
    g = grads(out.total, b["logp_t"], b["values"], b["entropy_t"])

    changed = {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in b.items()}
    for key, value in [("logp_t", 5.0), ("behaviour_logp_t", -50.0), ("r_t", 100.0), ("entropy_t", 9.0),
                       ("terminated_t", 1.0), ("v_final_t", 7.0)]:
        changed[key][3, 2] = value
    for key in ("logp_t", "values", "entropy_t"):
        changed[key].requires_grad_()
    out2 = appo_loss(**changed, **HPARAMS)
    g2 = grads(out2.total, changed["logp_t"], changed["values"], changed["entropy_t"])

    for name in out._fields:
        if name == "log_ratio_t":  # per sample, not a mean: the masked sample's own ratio may change
            kept = b["valid_t"] > 0
            torch.testing.assert_close(out2.log_ratio_t[kept], out.log_ratio_t[kept], msg=name)
        else:
            torch.testing.assert_close(getattr(out2, name), getattr(out, name), msg=name)
    for before, after in zip(g, g2):
        torch.testing.assert_close(after, before)
    assert g[0][3, 2] == 0 and g[2][3, 2] == 0


def test_appo_all_masked_gives_zero_loss():
    b = batch(3)
    b["valid_t"].zero_()
    out = appo_loss(**b, **HPARAMS)
    assert out.total.item() == 0.0
    assert all(g.abs().sum() == 0 for g in grads(out.total, b["logp_t"], b["values"], b["entropy_t"]))


def test_appo_terminated_and_truncated_together_is_a_termination():
    b = batch(4)
    both = dict(b, truncated_t=b["terminated_t"].clone(), v_final_t=b["terminated_t"] * 5.0)
    only_terminated = dict(b, truncated_t=torch.zeros(T, B), v_final_t=torch.zeros(T, B))
    torch.testing.assert_close(appo_loss(**both, **HPARAMS).total, appo_loss(**only_terminated, **HPARAMS).total)


def test_appo_approx_kl_and_clip_fraction():
    b = batch(5)
    on_policy = appo_loss(**dict(b, behaviour_logp_t=b["logp_t"].detach().clone()), **HPARAMS)
    assert on_policy.approx_kl.item() == 0.0 and on_policy.clip_fraction.item() == 0.0
    off_policy = appo_loss(**b, **HPARAMS)
    assert off_policy.approx_kl.item() > 0.0 and off_policy.clip_fraction.item() > 0.0


def test_appo_golden_policy_loss():
    # One step (T = 1), no episode end, lambda 1: V-trace's pg advantage is
    # min(rho_bar, pi / mu) * (r + gamma * v_1 - v_0), and the clip bounds pi / mu.
    # Written out here in float64, independent of vtrace().
    gamma, clip, rho_bar = 0.9, 0.2, 1.0
    logp = torch.tensor([[-1.0, -0.5, -2.0, -0.1]], dtype=torch.float64, requires_grad=True)
    mu = torch.tensor([[-0.7, -1.5, -1.5, -0.2]], dtype=torch.float64)
    v = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.0, 0.0, -1.0, 3.0]], dtype=torch.float64)
    r = torch.tensor([[1.0, -2.0, 0.5, 0.0]], dtype=torch.float64)
    zeros = torch.zeros(1, 4, dtype=torch.float64)
    out = appo_loss(logp, mu, v, r, zeros, zeros, zeros, zeros, torch.ones(1, 4, dtype=torch.float64),
                    gamma=gamma, rho_bar=rho_bar, c_bar=1.0, clip_ratio=clip, value_coef=0.5, entropy_coef=0.0,
                    normalize_adv=False)
    expected, log_ratio = 0.0, logp.detach() - mu
    for i in range(4):
        ratio = float(log_ratio[0, i].exp())
        adv = min(rho_bar, ratio) * (float(r[0, i]) + gamma * float(v[1, i]) - float(v[0, i]))
        expected -= min(ratio * adv, min(max(ratio, 1 - clip), 1 + clip) * adv) / 4
    assert out.policy_loss.item() == pytest.approx(expected, rel=1e-12)
    assert out.approx_kl.item() == pytest.approx(float((log_ratio.exp() - 1 - log_ratio).mean()), rel=1e-12)


def test_a_stale_sample_is_weighted_by_its_ratio_twice():
    # One stale sample whose action the policy has since made rarer (pi / mu = 0.5),
    # advantage +1 (V = 0, r = 1): pi / mu is both the surrogate's ratio and V-trace's
    # weight, so d loss / d logp = -(pi / mu) * rho = -0.25 (the trade-off appo_loss's
    # docstring names).
    logp = torch.tensor([[0.5]]).log().requires_grad_()
    mu = torch.tensor([[1.0]]).log()
    z = torch.zeros(1, 1)
    hp = dict(HPARAMS, normalize_adv=False, entropy_coef=0.0, clip_ratio=0.6)
    (g,) = grads(appo_loss(logp, mu, torch.zeros(2, 1), torch.ones(1, 1), z, z, z, z, torch.ones(1, 1), **hp).total,
                 logp)
    torch.testing.assert_close(g, torch.tensor([[-0.25]]))


def test_return_normalisation_changes_only_the_value_losss_scale():
    # The same values in return units, once raw and once as a normaliser's outputs:
    # V-trace, advantages and the policy loss must not move; the value loss is the
    # squared error in normalised units, the raw one over std^2.
    b, mean, std = batch(6), 3.0, 2.5
    raw = appo_loss(**b, **HPARAMS)
    normalised = dict(b, values=((b["values"].detach() - mean) / std).requires_grad_())
    out = appo_loss(**normalised, **HPARAMS, value_mean=mean, value_std=std)
    for name in ("policy_loss", "advantage_mean", "advantage_std", "explained_variance", "approx_kl",
                 "value_target_mean", "value_target_std", "vs_tm1"):
        torch.testing.assert_close(getattr(out, name), getattr(raw, name), msg=name)
    torch.testing.assert_close(out.value_loss, raw.value_loss / std**2)


def test_vtrace_lambda_reaches_the_advantages():
    b = batch(7)
    out = appo_loss(**b, **dict(HPARAMS, normalize_adv=False), lambda_=0.9)
    with torch.no_grad():
        r = bootstrap_truncation(b["r_t"], b["truncated_t"], b["v_final_t"], 0.9)
        discount = episode_discounts(b["terminated_t"], b["truncated_t"], 0.9)
        v = b["values"]
        ret = vtrace(v[:-1], v[1:], r, discount, b["logp_t"] - b["behaviour_logp_t"], lambda_=0.9)
    torch.testing.assert_close(out.vs_tm1, ret.vs_tm1)
    torch.testing.assert_close(out.advantage_mean, ret.pg_advantage_t.mean())


def test_an_exploration_penalty_replaces_the_entropy_bonus():
    b = batch(8)
    penalty = torch.rand(T, B, requires_grad=True)
    out = appo_loss(**b, **HPARAMS, exploration_t=penalty)
    torch.testing.assert_close(out.exploration, penalty.detach().mean())
    torch.testing.assert_close(
        out.total, out.policy_loss + HPARAMS["value_coef"] * out.value_loss + HPARAMS["entropy_coef"] * out.exploration)
    (g,) = grads(out.total, penalty)
    torch.testing.assert_close(g, torch.full((T, B), HPARAMS["entropy_coef"] / (T * B)))


def test_appo_shape_errors():
    b = batch()
    with pytest.raises(ValueError, match=r"values has shape \(6, 4\) but must be \[T\+1, B\] = \(7, 4\)"):
        appo_loss(**dict(b, values=b["values"][:-1]), **HPARAMS)
    with pytest.raises(ValueError, match=r"logp_t has shape \(6, 4\) but r_t has \(5, 4\)"):
        appo_loss(**dict(b, r_t=b["r_t"][:-1]), **HPARAMS)
    with pytest.raises(ValueError, match="all inputs must be"):
        ppo_clip_policy_loss(torch.zeros(3), torch.zeros(3), 0.2, torch.ones(3))


def test_appo_without_statistics_is_the_same_loss_and_gradient():
    # The learner computes the logging statistics only on a step it reports.
    b = batch(6)
    full, bare = appo_loss(**b, **HPARAMS), appo_loss(**b, **HPARAMS, stats=False)
    torch.testing.assert_close(bare.total, full.total)
    torch.testing.assert_close(bare.vs_tm1, full.vs_tm1)
    for g_full, g_bare in zip(grads(full.total, b["logp_t"], b["values"]), grads(bare.total, b["logp_t"], b["values"])):
        torch.testing.assert_close(g_bare, g_full)
    assert all(getattr(bare, name) is None for name in STAT_FIELDS)
    assert all(torch.isfinite(getattr(full, name)) for name in STAT_FIELDS if name != "explained_variance")
