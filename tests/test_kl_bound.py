"""--target_kl: a batch's passes end at the first minibatch whose policy has moved
past the bound from the weights at the batch's start; that minibatch takes no step,
every rank refuses together, and a run counts the batches it cut short."""
import copy

import gymnasium as gym
import numpy as np
import torch
from helpers import TrainRun, read_summary

from fastrl.algo.model import ActorCritic, ModelSpec
from fastrl.config import Config
from fastrl.learning.learner import (
    batch_targets,
    flat_samples,
    gradient_step,
    kl_bound_crossed,
    sample_gradient_step,
    start_log_ratios,
)

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
T, B = 4, 5


def _model_and_batch():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = ActorCritic(OBS, gym.spaces.Discrete(3), ModelSpec(hidden_sizes=(8,)))
    batch = {
        "obs": {"obs": torch.rand(T + 1, B, 3, generator=g) * 2 - 1},
        "final_obs": {"obs": torch.zeros(0, 3)},
        "final_row": torch.full((T, B), -1, dtype=torch.long),
        "episode_start": torch.zeros(T + 1, B, dtype=torch.bool),
        "actions": torch.randint(0, 3, (T, B, 1), generator=g),
        # Acting policies a few versions old: not the learner's weights.
        "behaviour_logp": torch.full((T, B), -1.1) + 0.2 * torch.randn(T, B, generator=g),
        "behaviour_value": torch.zeros(T, B),
        "policy_version": torch.zeros(T, B, dtype=torch.long),
        "rewards": torch.randn(T, B, generator=g),
        "terminated": torch.zeros(T, B, dtype=torch.bool),
        "truncated": torch.zeros(T, B, dtype=torch.bool),
        "rnn_state0": torch.zeros(B, 0),
    }
    valid = torch.ones(T, B)
    valid[:, 2] = 0.0  # one column past the lag bound: left out of the KL as of every mean
    return model, batch, valid


def _kl64(model, batch, start_logp, valid):
    """KL(start || now) as a float64 reference: mean of (r - 1) - log r over the
    valid samples, r = pi_now / pi_start at the actions taken."""
    with torch.no_grad():
        now = model.evaluate(batch["obs"], batch["rnn_state0"], batch["episode_start"], batch["actions"]).logp
    d = (now.double() - start_logp.double())[valid > 0]
    return float((torch.exp(d) - 1 - d).mean())


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_a_step_past_the_bound_is_refused_and_changes_nothing():
    model, batch, valid = _model_and_batch()
    with torch.no_grad():
        start_logp = model.evaluate(batch["obs"], batch["rnn_state0"], batch["episode_start"], batch["actions"]).logp
    batch["start_log_ratio"] = start_log_ratios(model, batch)
    torch.testing.assert_close(batch["start_log_ratio"], start_logp - batch["behaviour_logp"])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)

    # The first step starts at the batch's weights: KL 0, under any bound.
    cfg = Config(env="CartPole-v1", target_kl=1e-4)
    out, grad_norm = gradient_step(cfg, model, optimizer, batch, valid)
    assert grad_norm is not None and out is not None
    moved = _kl64(model, batch, start_logp, valid)
    assert moved > 1e-4  # lr 0.05 moved it past the bound

    # The next step sees the move: refused, the weights and Adam's state untouched.
    before, adam_before = _params(model), copy.deepcopy(optimizer.state_dict())
    out, grad_norm = gradient_step(cfg, model, optimizer, batch, valid)
    assert grad_norm is None and out is not None
    for got, want in zip(_params(model), before):
        assert torch.equal(got, want)
    assert optimizer.state_dict()["state"][0]["step"] == adam_before["state"][0]["step"]
    # The loss's own estimate is the reference's, on the valid samples only.
    assert kl_bound_crossed(Config(env="CartPole-v1", target_kl=moved * 0.99), out, batch, valid)
    assert not kl_bound_crossed(Config(env="CartPole-v1", target_kl=moved * 1.01), out, batch, valid)
    unbounded = {k: v for k, v in batch.items() if k != "start_log_ratio"}  # what a run at --target_kl 0 steps on
    assert not kl_bound_crossed(cfg, out, unbounded, valid)

    # A looser bound lets the same step through.
    out, grad_norm = gradient_step(Config(env="CartPole-v1", target_kl=moved * 2), model, optimizer, batch, valid)
    assert grad_norm is not None
    assert any(not torch.equal(got, want) for got, want in zip(_params(model), before))


def test_single_sample_minibatches_measure_from_the_batch_targets_forward():
    model, batch, valid = _model_and_batch()
    cfg = Config(env="CartPole-v1", target_kl=1e-4, minibatch_split="samples", max_batches_ahead=0)
    targets, start_log_ratio = batch_targets(cfg, model, batch, valid)
    torch.testing.assert_close(start_log_ratio, start_log_ratios(model, batch))
    samples = flat_samples(batch, valid)
    samples.update(vs=targets.vs_tm1.flatten(), pg_advantage=targets.pg_advantage_t.flatten(),
                   start_log_ratio=start_log_ratio.flatten())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    assert sample_gradient_step(cfg, model, optimizer, samples)[1] is not None
    before = _params(model)
    assert sample_gradient_step(cfg, model, optimizer, samples)[1] is None
    assert all(torch.equal(got, want) for got, want in zip(_params(model), before))


class _OtherRankRefuses:
    """Peers whose other rank's minibatch crossed the bound: the gradient all-reduce
    brings back its refusal with the summed decisions."""

    def __init__(self):
        self.extras_sent = None

    def average_gradients(self, params, weight, extras, riders=None):
        self.extras_sent = list(extras)
        return weight * 2, [extras[0], extras[1] + 1.0], None if riders is None else riders * 2


def test_another_ranks_refusal_is_every_ranks():
    model, batch, valid = _model_and_batch()
    batch["start_log_ratio"] = start_log_ratios(model, batch)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    peers = _OtherRankRefuses()
    before = _params(model)
    out, grad_norm = gradient_step(Config(env="CartPole-v1", target_kl=1.0), model, optimizer, batch, valid, peers)
    assert peers.extras_sent == [0.0, 0.0]  # this rank's own step was under the bound
    assert grad_norm is None
    assert all(torch.equal(got, want) for got, want in zip(_params(model), before))


def test_a_run_counts_the_batches_the_bound_cut_short(tmp_path):
    # A bound no step stays under: every batch ends after its first step, and says so.
    run = TrainRun(["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--plan", "off", "--num_workers", "1",
                    "--num_envs_per_worker", "8", "--batch_size", "256", "--train_for_env_frames", "6000",
                    "--target_kl", "1e-9"])
    assert run.wait(timeout=120) == 0, run.output()
    summary = read_summary(tmp_path, "CartPole-v1")
    assert summary["learner_steps"] > 0 and summary["kl_stops"] == summary["learner_steps"], summary
    assert summary["gradient_steps"] == summary["learner_steps"], summary  # each batch's first step, and no more
