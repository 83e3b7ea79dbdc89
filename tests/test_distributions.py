"""ActionSpec and its distributions against torch.distributions references."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal, kl_divergence

from fastrl.algo.distributions import ActionSpec

B = 64

CATEGORICAL_SPACES = {
    "discrete": gym.spaces.Discrete(5, start=2),
    "multi_discrete_unequal": gym.spaces.MultiDiscrete([3, 3, 2, 5, 3]),
    "multi_discrete_equal": gym.spaces.MultiDiscrete([4, 4, 4]),
    "multi_discrete_2d": gym.spaces.MultiDiscrete([[2, 3], [3, 2]], start=[[1, 0], [0, -1]]),
    "tuple": gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Discrete(3, start=-1)]),
}
BOX_SPACES = {
    "box": gym.spaces.Box(-1.0, 2.0, (3,), np.float32),
    "box_2d": gym.spaces.Box(-0.5, 0.5, (2, 2), np.float64),
}


def _sizes(space):
    if isinstance(space, gym.spaces.Discrete):
        return [int(space.n)]
    if isinstance(space, gym.spaces.MultiDiscrete):
        return [int(n) for n in space.nvec.reshape(-1)]
    return [int(s.n) for s in space.spaces]


def _reference_categoricals(space, logits):
    return [Categorical(logits=chunk) for chunk in logits.split(_sizes(space), dim=-1)]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("name", sorted(CATEGORICAL_SPACES))
def test_categorical_matches_reference(name):
    space = CATEGORICAL_SPACES[name]
    spec = ActionSpec.from_space(space)
    assert spec.num_params == sum(_sizes(space))
    assert spec.action_dim == len(_sizes(space))
    assert spec.dtype == torch.int64 and not spec.is_continuous

    logits = torch.randn(B, spec.num_params) * 2
    dist = spec.distribution(logits)
    refs = _reference_categoricals(space, logits)
    actions = dist.sample()
    assert actions.shape == (B, spec.action_dim) and actions.dtype == torch.int64
    for col, n in enumerate(_sizes(space)):
        assert 0 <= actions[:, col].min() and actions[:, col].max() < n

    ref_logp = sum(r.log_prob(actions[:, i]) for i, r in enumerate(refs))
    ref_entropy = sum(r.entropy() for r in refs)
    torch.testing.assert_close(dist.log_prob(actions), ref_logp)
    torch.testing.assert_close(dist.entropy(), ref_entropy)
    assert dist.log_prob(actions).shape == (B,) and dist.entropy().shape == (B,)

    mode = dist.mode()
    expected_mode = torch.stack([chunk.argmax(-1) for chunk in logits.split(_sizes(space), -1)], 1)
    assert torch.equal(mode, expected_mode)

    for row in actions.numpy():
        assert space.contains(spec.to_env(row)), (name, row, spec.to_env(row))


@pytest.mark.parametrize("name", sorted(CATEGORICAL_SPACES))
def test_symmetric_kl_to_uniform_matches_torch_kl(name):
    space = CATEGORICAL_SPACES[name]
    spec = ActionSpec.from_space(space)
    logits = torch.randn(B, spec.num_params) * 2
    got = spec.distribution(logits).symmetric_kl_to_uniform()
    want = 0.0
    for ref in _reference_categoricals(space, logits):
        uniform = Categorical(logits=torch.zeros_like(ref.logits))
        want = want + kl_divergence(ref, uniform) + kl_divergence(uniform, ref)
    torch.testing.assert_close(got, want)


def test_symmetric_kl_is_zero_at_uniform_and_keeps_pulling_a_collapsed_policy_back():
    spec = ActionSpec.from_space(gym.spaces.Discrete(4))
    uniform = spec.distribution(torch.zeros(1, 4)).symmetric_kl_to_uniform()
    torch.testing.assert_close(uniform, torch.zeros(1), atol=1e-6, rtol=0)
    # One action left, the others at ~1e-33 (what a collapsed doom_basic policy
    # read): KL(u||p) is (3/4) * log(1e33 / 4) ~ 56 nats, and gradient descent on
    # it must still raise the dead actions' logits, by 1/4 each (d/dz_a of
    # KL(u||p) is p_a - 1/n, and KL(p||u)'s part vanishes here).
    logits = torch.tensor([[0.0, -76.0, -76.0, -76.0]], requires_grad=True)
    value = spec.distribution(logits).symmetric_kl_to_uniform()
    assert 50.0 < value.item() < 60.0
    value.sum().backward()
    torch.testing.assert_close(logits.grad, torch.tensor([[0.75, -0.25, -0.25, -0.25]]), atol=1e-6, rtol=0)


def test_categorical_sampling_follows_probabilities():
    spec = ActionSpec.from_space(gym.spaces.MultiDiscrete([2, 3]))
    probs = torch.tensor([[0.9, 0.1, 0.2, 0.3, 0.5]])
    logits = torch.cat([probs[:, :2].log(), probs[:, 2:].log()], 1).expand(20000, 5)
    actions = spec.distribution(logits).sample()
    freq0 = torch.bincount(actions[:, 0], minlength=2).float() / 20000
    freq1 = torch.bincount(actions[:, 1], minlength=3).float() / 20000
    torch.testing.assert_close(freq0, probs[0, :2], atol=0.015, rtol=0)
    torch.testing.assert_close(freq1, probs[0, 2:], atol=0.015, rtol=0)


def test_categorical_sampling_never_draws_an_impossible_action():
    # Masked actions (logit -inf) have probability 0: the inverse-CDF draw must skip
    # them wherever they sit, first, between two others or last.
    spec = ActionSpec.from_space(gym.spaces.MultiDiscrete([4, 3]))
    inf = float("inf")
    logits = torch.tensor([[-inf, 0.0, -inf, 0.0, 0.0, 1.0, -inf]]).expand(50000, 7)
    actions = spec.distribution(logits).sample()
    assert set(actions[:, 0].tolist()) == {1, 3}
    assert set(actions[:, 1].tolist()) == {0, 1}
    freq = torch.bincount(actions[:, 1], minlength=3).float() / 50000
    torch.testing.assert_close(freq[:2], torch.softmax(torch.tensor([0.0, 1.0]), 0), atol=0.01, rtol=0)


@pytest.mark.parametrize("name", sorted(BOX_SPACES))
def test_gaussian_matches_reference(name):
    space = BOX_SPACES[name]
    spec = ActionSpec.from_space(space)
    dim = int(np.prod(space.shape))
    assert spec.num_params == spec.action_dim == dim
    assert spec.dtype == torch.float32 and spec.is_continuous

    params = torch.randn(B, dim)
    log_std = torch.linspace(-1.0, 0.5, dim, requires_grad=True)
    dist = spec.distribution(params, log_std)
    low, high = (torch.as_tensor(b, dtype=torch.float32).reshape(-1) for b in (space.low, space.high))
    mean = (low + high) / 2 + (high - low) / 2 * torch.tanh(params)  # the bounds' centre +- half-width
    ref = Normal(mean, log_std.exp())
    actions = dist.sample()
    assert actions.shape == (B, dim) and actions.dtype == torch.float32
    torch.testing.assert_close(dist.log_prob(actions), ref.log_prob(actions).sum(-1))
    torch.testing.assert_close(dist.entropy(), ref.entropy().sum(-1))
    torch.testing.assert_close(dist.mode(), mean)

    dist.log_prob(actions).sum().backward()
    assert log_std.grad is not None and torch.all(log_std.grad != 0)

    far = actions * 10  # to_env must clip whatever the Gaussian produced
    for row in far.numpy():
        env_action = spec.to_env(row)
        assert env_action.dtype == np.float32 and space.contains(env_action)


def test_gaussian_mean_stays_inside_finite_bounds_and_is_raw_where_unbounded():
    # Pendulum's collapse: a mean far past the bound makes every clipped draw the same.
    spec = ActionSpec.from_space(gym.spaces.Box(np.array([-2.0, 0.0, -np.inf]), np.array([2.0, 1.0, np.inf])))
    params = torch.tensor([[0.0, 0.0, 0.0], [1e3, 1e3, 1e3], [-1e3, -1e3, -1e3], [0.3, -0.3, 5.0]])
    mean = spec.distribution(params, torch.zeros(3)).mode()
    expected = torch.tensor([[0.0, 0.5, 0.0], [2.0, 1.0, 1e3], [-2.0, 0.0, -1e3],
                             [2 * np.tanh(0.3), 0.5 - 0.5 * np.tanh(0.3), 5.0]], dtype=torch.float32)
    torch.testing.assert_close(mean, expected)
    # Near a bound the mean still moves with its param.
    params = torch.full((1, 3), 3.0, requires_grad=True)
    spec.distribution(params, torch.zeros(3)).mode().sum().backward()
    assert torch.all(params.grad > 0)


def test_to_env_types():
    assert type(ActionSpec.from_space(gym.spaces.Discrete(3, start=1)).to_env(np.array([2]))) is int
    assert ActionSpec.from_space(gym.spaces.Discrete(3, start=1)).to_env(np.array([2])) == 3
    multi = ActionSpec.from_space(gym.spaces.MultiDiscrete([3, 4])).to_env(np.array([1, 3]))
    assert multi.dtype == np.int64 and multi.tolist() == [1, 3]
    tup = ActionSpec.from_space(gym.spaces.Tuple([gym.spaces.Discrete(2)] * 2)).to_env(np.array([1, 0]))
    assert tup == (1, 0) and all(type(a) is int for a in tup)


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.MultiBinary(3),
        gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (1,))]),
        gym.spaces.Dict({"a": gym.spaces.Discrete(2)}),
    ],
)
def test_unsupported_space_names_supported_ones(space):
    with pytest.raises(ValueError, match="Discrete, MultiDiscrete, Tuple of Discrete, Box"):
        ActionSpec.from_space(space)


def test_bad_params_shape_and_log_std_misuse():
    discrete = ActionSpec.from_space(gym.spaces.Discrete(4))
    with pytest.raises(ValueError, match=r"\[B, 4\]"):
        discrete.distribution(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="no log-std"):
        discrete.distribution(torch.zeros(2, 4), torch.zeros(1))
    box = ActionSpec.from_space(gym.spaces.Box(-1, 1, (2,)))
    with pytest.raises(ValueError, match="log-std of shape"):
        box.distribution(torch.zeros(2, 2))


@pytest.mark.parametrize("exploration, recovers", [("entropy", False), ("symmetric_kl", True)])
def test_only_the_kl_to_uniform_brings_a_collapsed_policy_back(exploration, recovers):
    # doom_basic's collapse in miniature: the fire head holds 'fire' at ~1e-33 and
    # nothing else pulls on it (the agent never fires, so no advantage reaches
    # that action). Adam on the exploration term alone, as a learner would take it.
    spec = ActionSpec.from_space(gym.spaces.Discrete(2))
    logits = torch.tensor([[0.0, -76.0]], requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=0.1)
    for _ in range(1000):
        dist = spec.distribution(logits)
        loss = -dist.entropy() if exploration == "entropy" else dist.symmetric_kl_to_uniform()
        optimizer.zero_grad()
        loss.sum().backward()
        optimizer.step()
    p_fire = torch.softmax(logits.detach(), -1)[0, 1].item()
    assert (p_fire > 0.1) == recovers, p_fire
