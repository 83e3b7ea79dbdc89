"""The learner's gradient step as a whole: which samples it learns from, and that
rewards, their scale, episode ends and the truncation bootstrap reach the loss as
an independent float64 computation says they should."""
import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrl.algo.model import ActorCritic, ModelSpec
from fastrl.config import Config
from fastrl.learning.learner import (
    _columns,
    _rows,
    batch_targets,
    flat_samples,
    gradient_step,
    lag_mask,
    sample_gradient_step,
)

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
T, B = 5, 6


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _batch():
    """A time-major batch as Buffers.gather returns it, with an episode end of each
    kind and a truncation whose final obs is kept in final_obs / final_row."""
    g = torch.Generator().manual_seed(1)
    terminated = torch.zeros(T, B, dtype=torch.bool)
    truncated = torch.zeros(T, B, dtype=torch.bool)
    terminated[1, 0], truncated[3, 1], truncated[T - 1, 2] = True, True, True
    final_row = torch.full((T, B), -1, dtype=torch.long)
    final_row[3, 1], final_row[T - 1, 2] = 0, 1
    episode_start = torch.zeros(T + 1, B, dtype=torch.bool)
    episode_start[2, 0], episode_start[4, 1] = True, True
    return {
        "obs": {"obs": torch.rand(T + 1, B, 3, generator=g) * 2 - 1},
        "final_obs": {"obs": torch.rand(2, 3, generator=g) * 2 - 1},
        "final_row": final_row,
        "episode_start": episode_start,
        "actions": torch.randint(0, 2, (T, B, 1), generator=g),
        "behaviour_logp": torch.zeros(T, B),  # set per model below
        "behaviour_value": torch.zeros(T, B),
        "policy_version": torch.zeros(T, B, dtype=torch.long),
        "rewards": torch.randn(T, B, generator=g),
        "terminated": terminated,
        "truncated": truncated,
        "rnn_state0": torch.zeros(B, 0),
    }


def _on_policy(model, batch):
    with torch.no_grad():
        ev = model.evaluate(batch["obs"], batch["rnn_state0"], batch["episode_start"], batch["actions"])
    batch["behaviour_logp"] = ev.logp.clone()
    batch["behaviour_value"] = ev.values[:-1].clone()
    return batch


def _grads(model):
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def test_lag_mask():
    versions = torch.tensor([[10, 7, 5], [9, 4, 10]])
    lag, valid = lag_mask(10, versions, max_policy_lag=5)
    assert lag.tolist() == [[0, 3, 5], [1, 6, 0]]
    assert valid.tolist() == [[1, 1, 1], [1, 0, 1]]


def test_samples_past_max_policy_lag_get_no_gradient():
    # Columns 0-1 come from a policy 30 steps old, past max_policy_lag 25. The masked
    # step's gradient must equal the gradient of a step that never saw those columns.
    cfg = Config(env="CartPole-v1", max_grad_norm=0.0)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,)))
    batch = _on_policy(model, _batch())
    batch["policy_version"][:, :2] = -30
    _, valid = lag_mask(0, batch["policy_version"], cfg.max_policy_lag)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the step leaves .grad to read

    gradient_step(cfg, model, optimizer, batch, valid)
    masked = _grads(model)
    fresh = torch.arange(2, B)
    gradient_step(cfg, model, optimizer, _columns(batch, fresh), valid[:, fresh])
    for got, want in zip(masked, _grads(model)):
        torch.testing.assert_close(got, want)
    assert any(g.abs().sum() > 0 for g in masked)


def _reference_targets(model, batch, reward_scale, gamma, bootstrap_time_limits=True, reward_clip=0.0):
    """On-policy V-trace with rho = c = 1 and lambda = 1 is the discounted return to
    the rollout's end: written here as a plain float64 loop per env, from the
    episode-end rules alone. A termination ends the sum; a truncation ends it with
    gamma * V(final obs); the rollout's end bootstraps with V(s_T)."""
    with torch.no_grad():
        values = model.evaluate(batch["obs"], batch["rnn_state0"], batch["episode_start"], batch["actions"]).values
        v_final = model.values_with_state(batch["final_obs"], torch.zeros(2, 0)).double()
    values = values.double()
    r = batch["rewards"].double().numpy() * reward_scale
    if reward_clip:
        r = np.clip(r, -reward_clip, reward_clip)
    targets = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            total, discount, s = 0.0, 1.0, t
            while True:
                total += discount * r[s, b]
                if batch["terminated"][s, b]:
                    break
                if batch["truncated"][s, b]:
                    if bootstrap_time_limits:
                        total += discount * gamma * float(v_final[batch["final_row"][s, b]])
                    break
                if s == T - 1:
                    total += discount * gamma * float(values[T, b])
                    break
                discount *= gamma
                s += 1
            targets[t, b] = total
    return values[:-1].numpy(), targets


@pytest.mark.parametrize("reward_scale, bootstrap_time_limits, reward_clip",
                         [(1.0, True, 0.0), (0.1, True, 0.0), (1.0, False, 0.0), (3.0, True, 0.5)])
def test_gradient_steps_value_loss_matches_a_float64_return_reference(reward_scale, bootstrap_time_limits, reward_clip):
    cfg = Config(env="CartPole-v1", reward_scale=reward_scale, gamma=0.9, normalize_advantages=False,
                 vtrace_lambda=1.0,  # the reference is the plain return, lambda 1's target
                 bootstrap_time_limits=bootstrap_time_limits, reward_clip=reward_clip)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,)))
    batch = _on_policy(model, _batch())
    values, targets = _reference_targets(model, batch, reward_scale, cfg.gamma, bootstrap_time_limits, reward_clip)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    out, _ = gradient_step(cfg, model, optimizer, batch, torch.ones(T, B))
    # The step computes in float32: agreement to float32 rounding.
    np.testing.assert_allclose(out.vs_tm1.numpy(), targets, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(out.value_loss), 0.5 * np.mean((values - targets) ** 2), rtol=1e-5)
    # On-policy, rho = 1: the advantage is the same return minus V(s_t).
    np.testing.assert_allclose(float(out.advantage_mean), np.mean(targets - values), rtol=1e-4, atol=1e-6)


def test_value_clipping_clips_around_the_acting_policys_values():
    from fastrl.algo.appo_loss import value_loss

    cfg = Config(env="CartPole-v1", value_clip=0.1)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,)))
    batch = _on_policy(model, _batch())
    batch["behaviour_value"] = batch["behaviour_value"] + torch.linspace(-2, 2, T * B).view(T, B)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    ones = torch.ones(T, B)
    clipped, _ = gradient_step(cfg, model, optimizer, batch, ones)
    plain, _ = gradient_step(Config(env="CartPole-v1"), model, optimizer, batch, ones)
    with torch.no_grad():
        values = model.evaluate(batch["obs"], batch["rnn_state0"], batch["episode_start"], batch["actions"]).values
    want = value_loss(values[:-1], plain.vs_tm1, ones, old_v_tm1=batch["behaviour_value"], clip_value=0.1)
    torch.testing.assert_close(clipped.value_loss, want)
    assert clipped.value_loss > plain.value_loss


def test_return_normalisation_learns_the_targets_statistics():
    cfg = Config(env="CartPole-v1", normalize_returns=True, lr=1e-3)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,), normalize_returns=True))
    batch = _on_policy(model, _batch())
    batch["rewards"] = batch["rewards"] * 50 + 100  # returns far from N(0, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    valid = torch.ones(T, B)
    out, _ = gradient_step(cfg, model, optimizer, batch, valid)
    mean, std = model.value_scale()
    torch.testing.assert_close(mean, out.vs_tm1.mean())
    torch.testing.assert_close(std, out.vs_tm1.std(unbiased=False), rtol=1e-4, atol=1e-4)
    assert model.return_norm.count.item() == T * B



@pytest.mark.parametrize("kind", ["plain", "lagged_and_masked", "clipped_value_symmetric_kl"])
def test_a_pass_of_single_samples_in_any_order_takes_the_whole_batch_step(kind):
    # With every sample in one minibatch, the shuffled path (targets over whole
    # trajectories first, then the loss on samples in a random order) must give the
    # trajectory path's loss terms and gradient: the targets, the masks, the
    # exploration term and the value clip reach it alike.
    options = {"plain": {}, "lagged_and_masked": {},
               "clipped_value_symmetric_kl": {"value_clip": 0.2, "exploration_loss": "symmetric_kl"}}[kind]
    cfg = Config(env="CartPole-v1", max_grad_norm=0.0, gamma=0.9, vtrace_lambda=0.95, **options)
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,), normalize_returns=True))
    batch = _on_policy(model, _batch())
    valid = torch.ones(T, B)
    if kind == "lagged_and_masked":  # behaviour policies that differ from the learner's, one column dropped
        batch["behaviour_logp"] += 0.3 * torch.randn(T, B)
        valid[:, 4] = 0.0
    twin = copy.deepcopy(model)  # a step updates the return normaliser: each path gets the same start
    whole, _ = gradient_step(cfg, model, torch.optim.SGD(model.parameters(), lr=0.0), batch, valid)
    whole_grads = _grads(model)

    model, optimizer = twin, torch.optim.SGD(twin.parameters(), lr=0.0)
    samples = flat_samples(batch, valid)
    targets, _ = batch_targets(cfg, model, batch, valid)
    samples.update(vs=targets.vs_tm1.flatten(), pg_advantage=targets.pg_advantage_t.flatten())
    order = torch.randperm(T * B)
    shuffled, _ = sample_gradient_step(cfg, model, optimizer, {k: _rows(v, order) for k, v in samples.items()})
    for name in ("total", "policy_loss", "value_loss", "entropy", "exploration", "approx_kl", "explained_variance"):
        torch.testing.assert_close(getattr(shuffled, name), getattr(whole, name), msg=name)
    for got, want in zip(_grads(model), whole_grads):
        torch.testing.assert_close(got, want)
    torch.testing.assert_close(targets.vs_tm1, whole.vs_tm1)


def test_evaluate_samples_is_evaluate_row_by_row_and_refuses_a_gru():
    model = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,)))
    batch = _batch()
    with torch.no_grad():
        ev = model.evaluate(batch["obs"], batch["rnn_state0"], batch["episode_start"], batch["actions"],
                            uniform_kl=True)
        logp, entropy, values, kl = model.evaluate_samples(
            {"obs": batch["obs"]["obs"][:-1].flatten(0, 1)}, batch["actions"].flatten(0, 1), uniform_kl=True)
    for got, want in ((logp, ev.logp), (entropy, ev.entropy), (values, ev.values[:-1]), (kl, ev.uniform_kl)):
        torch.testing.assert_close(got, want.flatten())
    recurrent = ActorCritic(OBS, gym.spaces.Discrete(2), ModelSpec(hidden_sizes=(8,), use_rnn=True, rnn_size=4))
    with pytest.raises(ValueError, match="without a GRU"):
        recurrent.evaluate_samples({"obs": torch.zeros(2, 3)}, torch.zeros(2, 1, dtype=torch.long))
