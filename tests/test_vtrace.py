"""V-trace and GAE against independent float64 references written from the papers."""

import math

import numpy as np
import pytest
import torch

from fastrl.algo.vtrace import bootstrap_truncation, episode_discounts, gae, vtrace

T, B = 7, 5
GAMMA = 0.9


def random_rollout(seed, log_rho_scale=2.0):
    """A rollout with terminations and truncations mid-way (never both on one step).

    values[t] is V of the stored observation s_t (after an episode end, s_{t+1} is
    the next episode's first observation); v_final[t] is V of the real last
    observation of a truncated episode, which the rollout never stores.
    """
    rng = np.random.default_rng(seed)
    done_kind = rng.choice(3, size=(T, B), p=[0.7, 0.15, 0.15])  # 0 none, 1 terminated, 2 truncated
    done_kind[2, 0], done_kind[4, 1], done_kind[T - 1, 2] = 1, 2, 2  # always at least one of each
    terminated = (done_kind == 1).astype(np.float64)
    truncated = (done_kind == 2).astype(np.float64)
    return dict(
        values=rng.normal(size=(T + 1, B)),
        rewards=rng.normal(size=(T, B)),
        terminated=terminated,
        truncated=truncated,
        v_final=rng.normal(size=(T, B)) * truncated,
        log_rho=rng.uniform(-log_rho_scale, log_rho_scale, size=(T, B)),
    )


def module_inputs(ro):
    """The [T, B] tensors the module takes, built with the module's own helpers."""
    t = {k: torch.tensor(v, dtype=torch.float64) for k, v in ro.items()}
    r_t = bootstrap_truncation(t["rewards"], t["truncated"], t["v_final"], GAMMA)
    discount_t = episode_discounts(t["terminated"], t["truncated"], GAMMA)
    return dict(v_tm1=t["values"][:-1], v_t=t["values"][1:], r_t=r_t, discount_t=discount_t), t["log_rho"]


# ---- independent reference: plain loops, one env at a time, no recursion ----


def ref_next_value(ro, t, b):
    """V of the state after step t, or None when the episode really ended there."""
    if ro["terminated"][t, b]:
        return None
    if ro["truncated"][t, b]:
        return ro["v_final"][t, b]
    return ro["values"][t + 1, b]


def ref_episode_last_step(ro, t, b):
    """Last step at or after t that still belongs to t's episode within the rollout."""
    s = t
    while s < T - 1 and not (ro["terminated"][s, b] or ro["truncated"][s, b]):
        s += 1
    return s


def ref_delta(ro, s, b):
    """TD error r_s + gamma V(x_{s+1}) - V(x_s), the next value being 0 after termination."""
    next_v = ref_next_value(ro, s, b)
    return ro["rewards"][s, b] + (GAMMA * next_v if next_v is not None else 0.0) - ro["values"][s, b]


def ref_vtrace(ro, rho_bar, c_bar, pg_rho_bar, lam=1.0):
    """Espeholt et al. 2018, eq. (1) as an explicit n-step sum with lambda in every trace
    coefficient (their sec. 4.2), and the pg advantage bootstrapping from
    lambda * v_{s+1} + (1 - lambda) * V(x_{s+1})."""
    ratio = np.exp(ro["log_rho"])
    rho, c, pg_rho = np.minimum(rho_bar, ratio), lam * np.minimum(c_bar, ratio), np.minimum(pg_rho_bar, ratio)
    vs = np.zeros((T, B))
    adv = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            total = 0.0
            for s in range(t, ref_episode_last_step(ro, t, b) + 1):
                trace = np.prod(c[t:s, b])  # c_t ... c_{s-1}, empty product = 1
                total += GAMMA ** (s - t) * trace * rho[s, b] * ref_delta(ro, s, b)
            vs[t, b] = ro["values"][t, b] + total
        for t in range(T):
            if ro["terminated"][t, b]:
                next_target = 0.0
            elif ro["truncated"][t, b] or t == T - 1:
                next_target = ref_next_value(ro, t, b)  # nothing observed beyond: its value
            else:
                next_target = lam * vs[t + 1, b] + (1 - lam) * ro["values"][t + 1, b]
            adv[t, b] = pg_rho[t, b] * (ro["rewards"][t, b] + GAMMA * next_target - ro["values"][t, b])
    return vs, adv


def ref_gae(ro, lam):
    """Schulman et al. 2016, eq. (16): A_t = sum_l (gamma lambda)^l delta_{t+l}, within the episode."""
    adv = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            for s in range(t, ref_episode_last_step(ro, t, b) + 1):
                adv[t, b] += (GAMMA * lam) ** (s - t) * ref_delta(ro, s, b)
    return adv


def assert_close64(actual, expected):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float64), rtol=1e-12, atol=1e-12)


# ---- tests ----


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    "rho_bar,c_bar,pg_rho_bar,lam",
    [(1.0, 1.0, None, 1.0), (2.0, 0.9, None, 1.0), (1.0, 1.0, 1.5, 1.0), (math.inf, math.inf, None, 1.0),
     (1.0, 1.0, None, 0.95), (2.0, 0.9, 1.5, 0.5), (1.0, 1.0, None, 0.0)],
)
def test_vtrace_matches_reference(seed, rho_bar, c_bar, pg_rho_bar, lam):
    ro = random_rollout(seed)
    ratio = np.exp(ro["log_rho"])
    assert (ratio < min(1.0, c_bar)).any() and (ratio > 2.0).any(), "need ratios on both sides of the clips"
    inputs, log_rho_t = module_inputs(ro)
    out = vtrace(**inputs, log_rho_t=log_rho_t, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar, lambda_=lam)
    ref_vs, ref_adv = ref_vtrace(ro, rho_bar, c_bar, rho_bar if pg_rho_bar is None else pg_rho_bar, lam)
    assert_close64(out.vs_tm1, ref_vs)
    assert_close64(out.pg_advantage_t, ref_adv)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("lam", [0.0, 0.95, 1.0])
def test_gae_matches_reference(seed, lam):
    ro = random_rollout(seed)
    inputs, _ = module_inputs(ro)
    assert_close64(gae(**inputs, lambda_=lam), ref_gae(ro, lam))


def test_vtrace_golden():
    # gamma = 0.9, rho_bar = 1, c_bar = 0.8, no episode end.
    # V(s_0..s_3) = 1, 2, 3, 4;  r = 1, 0, 2;  pi/mu = 2, 0.5, 1
    # rho = min(1, pi/mu) = 1, 0.5, 1;   c = min(0.8, pi/mu) = 0.8, 0.5, 0.8
    # delta_0 = 1   * (1 + 0.9*2 - 1) = 1.8
    # delta_1 = 0.5 * (0 + 0.9*3 - 2) = 0.35
    # delta_2 = 1   * (2 + 0.9*4 - 3) = 2.6
    # acc_2 = 2.6
    # acc_1 = 0.35 + 0.9*0.5*2.6  = 1.52
    # acc_0 = 1.8  + 0.9*0.8*1.52 = 2.8944
    # vs = V + acc = 3.8944, 3.52, 5.6
    # adv_0 = 1   * (1 + 0.9*3.52 - 1) = 3.168   (vs_1)
    # adv_1 = 0.5 * (0 + 0.9*5.6  - 2) = 1.52    (vs_2)
    # adv_2 = 1   * (2 + 0.9*4    - 3) = 2.6     (bootstrap V(s_3))
    col = lambda *x: torch.tensor(x, dtype=torch.float64)[:, None]  # noqa: E731
    out = vtrace(
        v_tm1=col(1, 2, 3), v_t=col(2, 3, 4), r_t=col(1, 0, 2), discount_t=col(0.9, 0.9, 0.9),
        log_rho_t=torch.log(col(2, 0.5, 1)), rho_bar=1.0, c_bar=0.8,
    )
    assert_close64(out.vs_tm1, col(3.8944, 3.52, 5.6))
    assert_close64(out.pg_advantage_t, col(3.168, 1.52, 2.6))


def test_gae_golden():
    # gamma = 0.9, lambda = 0.5; same V and r as above.
    # delta = 1 + 0.9*2 - 1, 0 + 0.9*3 - 2, 2 + 0.9*4 - 3 = 1.8, 0.7, 2.6
    # A_2 = 2.6;  A_1 = 0.7 + 0.45*2.6 = 1.87;  A_0 = 1.8 + 0.45*1.87 = 2.6415
    col = lambda *x: torch.tensor(x, dtype=torch.float64)[:, None]  # noqa: E731
    adv = gae(v_tm1=col(1, 2, 3), v_t=col(2, 3, 4), r_t=col(1, 0, 2), discount_t=col(0.9, 0.9, 0.9), lambda_=0.5)
    assert_close64(adv, col(2.6415, 1.87, 2.6))


@pytest.mark.parametrize("seed", range(3))
def test_on_policy_vtrace_equals_lambda_one_returns(seed):
    inputs, log_rho_t = module_inputs(random_rollout(seed))
    out = vtrace(**inputs, log_rho_t=torch.zeros_like(log_rho_t), rho_bar=1.0, c_bar=1.0)
    adv = gae(**inputs, lambda_=1.0)
    assert_close64(out.vs_tm1, adv + inputs["v_tm1"])
    assert_close64(out.pg_advantage_t, adv)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("lam", [0.0, 0.8, 0.95])
def test_on_policy_vtrace_with_lambda_equals_gae(seed, lam):
    inputs, log_rho_t = module_inputs(random_rollout(seed))
    out = vtrace(**inputs, log_rho_t=torch.zeros_like(log_rho_t), rho_bar=1.0, c_bar=1.0, lambda_=lam)
    adv = gae(**inputs, lambda_=lam)
    assert_close64(out.vs_tm1, adv + inputs["v_tm1"])
    assert_close64(out.pg_advantage_t, adv)


def test_vtrace_lambda_golden():
    # The golden case above with lambda = 0.5: c = 0.5 * min(0.8, pi/mu) = 0.4, 0.25, 0.4
    # acc_2 = 2.6;  acc_1 = 0.35 + 0.9*0.25*2.6 = 0.935;  acc_0 = 1.8 + 0.9*0.4*0.935 = 2.1366
    # vs = 3.1366, 2.935, 5.6
    # q_t mixes the next state's target and value: q_0 = 0.5*vs_1 + 0.5*V(s_1) = 0.5*2.935 + 0.5*2 = 2.4675
    #                                              q_1 = 0.5*vs_2 + 0.5*V(s_2) = 0.5*5.6   + 0.5*3 = 4.3
    # adv_0 = 1   * (1 + 0.9*2.4675 - 1) = 2.22075
    # adv_1 = 0.5 * (0 + 0.9*4.3    - 2) = 0.935
    # adv_2 = 1   * (2 + 0.9*4      - 3) = 2.6     (bootstrap V(s_3))
    col = lambda *x: torch.tensor(x, dtype=torch.float64)[:, None]  # noqa: E731
    out = vtrace(
        v_tm1=col(1, 2, 3), v_t=col(2, 3, 4), r_t=col(1, 0, 2), discount_t=col(0.9, 0.9, 0.9),
        log_rho_t=torch.log(col(2, 0.5, 1)), rho_bar=1.0, c_bar=0.8, lambda_=0.5,
    )
    assert_close64(out.vs_tm1, col(3.1366, 2.935, 5.6))
    assert_close64(out.pg_advantage_t, col(2.22075, 0.935, 2.6))


def test_truncation_bootstraps_and_termination_does_not():
    # One env, episode ends at step k; the only difference is terminated vs truncated.
    # Truncation adds gamma * v_final to delta_k, and (on-policy) step t <= k sees it
    # discounted by gamma^(k-t): a difference of gamma^(k-t+1) * v_final. Steps after
    # k belong to the next episode and must not change.
    k, v_final, n = 3, 2.5, 6
    rng = np.random.default_rng(0)
    values = torch.tensor(rng.normal(size=(n + 1, 1)))
    r_t = torch.tensor(rng.normal(size=(n, 1)))
    end = torch.zeros(n, 1, dtype=torch.float64)
    end[k] = 1.0
    v_final_t = end * v_final
    zeros = torch.zeros_like(end)

    def returns(terminated_t, truncated_t, lam):
        r = bootstrap_truncation(r_t, truncated_t, v_final_t, GAMMA)
        discount_t = episode_discounts(terminated_t, truncated_t, GAMMA)
        vt = vtrace(values[:-1], values[1:], r, discount_t, zeros).vs_tm1
        return vt, gae(values[:-1], values[1:], r, discount_t, lam) + values[:-1]

    vs_term, gae_term = returns(end, zeros, lam=0.7)
    vs_trunc, gae_trunc = returns(zeros, end, lam=0.7)
    t = torch.arange(n, dtype=torch.float64)[:, None]
    before = (t <= k).to(torch.float64)
    assert_close64(vs_trunc - vs_term, before * GAMMA ** (k - t + 1) * v_final)
    assert_close64(gae_trunc - gae_term, before * GAMMA * (GAMMA * 0.7) ** (k - t) * v_final)


def test_episode_discounts_and_bootstrap_accept_bool_flags():
    terminated = torch.tensor([[True], [False], [False]])
    truncated = torch.tensor([[False], [True], [False]])
    expected = torch.tensor([[0.0], [0.0], [0.99]], dtype=torch.float64)
    assert_close64(episode_discounts(terminated.double(), truncated, 0.99), expected)
    assert episode_discounts(terminated, truncated, 0.99).dtype == torch.get_default_dtype()
    r = torch.ones(3, 1, dtype=torch.float64)
    expected = torch.tensor([[1.0], [2.0], [1.0]], dtype=torch.float64)
    assert_close64(bootstrap_truncation(r, truncated, torch.full_like(r, 2.0), 0.5), expected)


def test_outputs_are_detached():
    v = torch.randn(T + 1, B, requires_grad=True)
    r, d, lr = torch.randn(T, B), torch.full((T, B), 0.9), torch.randn(T, B, requires_grad=True)
    out = vtrace(v[:-1], v[1:], r, d, lr)
    assert not out.vs_tm1.requires_grad and not out.pg_advantage_t.requires_grad
    assert not gae(v[:-1], v[1:], r, d, 0.95).requires_grad


def test_shape_errors():
    good, short = torch.zeros(5, 3), torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"v_tm1 has shape \(5, 3\) but r_t has \(4, 3\); all inputs must be \[T, B\]"):
        vtrace(good, good, short, good, good)
    with pytest.raises(ValueError, match=r"log_rho_t has shape \(5,\)"):
        vtrace(good, good, good, good, torch.zeros(5))
    with pytest.raises(ValueError, match=r"lambda_ is 1.5 but must lie in \[0, 1\]"):
        vtrace(good, good, good, good, good, lambda_=1.5)
    with pytest.raises(ValueError, match="must be"):
        gae(good, short, good, good, 0.9)
    with pytest.raises(ValueError, match="must be"):
        bootstrap_truncation(good, short, good, 0.9)
    with pytest.raises(ValueError, match="must be"):
        episode_discounts(good, torch.zeros(5, 3, 1), 0.9)


@pytest.mark.parametrize("steps, batch", [(1, 3), (7, 5), (32, 8)])
def test_the_backward_recurrence_is_the_step_by_step_loop(steps, batch):
    # The solve stands in for a loop over time; a rollout of one step and episode
    # ends (coefficient 0) included.
    from fastrl.algo.vtrace import _backward_accumulate

    gen = torch.Generator().manual_seed(steps)
    x = torch.randn(steps, batch, generator=gen)
    coef = torch.rand(steps, batch, generator=gen) * (torch.rand(steps, batch, generator=gen) > 0.2)
    acc, expected = torch.zeros(batch), torch.empty(steps, batch)
    for t in reversed(range(steps)):
        acc = x[t] + coef[t] * acc
        expected[t] = acc
    torch.testing.assert_close(_backward_accumulate(x, coef), expected, rtol=1e-6, atol=1e-6)
