"""Action masking for discrete actions, gymnasium's way: an "action_mask" entry of a
Dict observation, 1 where an action is allowed. The distribution's maths against a
masked log-softmax worked out in numpy, the model's use of the mask (never an input
feature, the same in acting and learning), the checks that refuse a bad mask, and
a task the mask decides (tests/masked_env.py) trained end to end."""
import os
import subprocess
import sys

import gymnasium as gym
import masked_env  # registers the masked_env ids with gymnasium, as the runs' children do
import numpy as np
import pytest
import torch
from helpers import GPU_MARKS, REPO, TEST_ENVS_ON_PATH, TrainRun, read_summary

from fastrl.algo.distributions import ACTION_MASK_KEY, ActionSpec
from fastrl.algo.model import ActorCritic, ModelSpec, obs_layout, obs_to_tensors
from fastrl.cuda.graphs import GraphedPolicy, make_policy_runner
from fastrl.cuda.timing import NullClock
from fastrl.plumbing.buffers import TrajectoryBuffers
from fastrl.sampling.env_split import SplitEnvs, make_envs

B = 256
SPACES = {
    "discrete": gym.spaces.Discrete(6, start=1),
    "multi_discrete_unequal": gym.spaces.MultiDiscrete([3, 5, 2]),
    "multi_discrete_equal": gym.spaces.MultiDiscrete([4, 4, 4]),
    "tuple": gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Discrete(4, start=-1)]),
}


def _sizes(space) -> list:
    return ActionSpec.from_space(space).sizes


def _random_mask(sizes, rows: int, rng: np.random.Generator) -> np.ndarray:
    """bool [rows, sum(sizes)] with at least one allowed action per component, often exactly one."""
    parts = []
    for n in sizes:
        part = rng.random((rows, n)) < 0.4
        part[np.arange(rows), rng.integers(n, size=rows)] = True
        parts.append(part)
    return np.concatenate(parts, axis=1)


def _reference_log_probs(logits: np.ndarray, mask: np.ndarray, sizes) -> list:
    """Per component, log p [rows, n] of a masked log-softmax in float64: -inf where masked."""
    out, offset = [], 0
    for n in sizes:
        z = np.where(mask[:, offset:offset + n], logits[:, offset:offset + n].astype(np.float64), -np.inf)
        top = z.max(axis=1, keepdims=True)
        out.append(z - top - np.log(np.exp(z - top).sum(axis=1, keepdims=True)))
        offset += n
    return out


def _case(name: str, seed: int = 0):
    space = SPACES[name]
    spec = ActionSpec.from_space(space)
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((B, spec.num_params)) * 2).astype(np.float32)
    mask = _random_mask(spec.sizes, B, rng)
    return spec, logits, mask


@pytest.mark.parametrize("name", sorted(SPACES))
def test_masked_log_probs_entropy_and_mode_match_a_numpy_masked_softmax(name):
    spec, logits, mask = _case(name)
    dist = spec.distribution(torch.from_numpy(logits), mask=torch.from_numpy(mask))
    ref = _reference_log_probs(logits, mask, spec.sizes)

    actions = dist.sample()
    want_logp = sum(lp[np.arange(B), actions[:, i].numpy()] for i, lp in enumerate(ref))
    np.testing.assert_allclose(dist.log_prob(actions).numpy(), want_logp, rtol=1e-5, atol=1e-5)
    # The entropy of the allowed actions only: masked ones add nothing (0 log 0 = 0).
    want_entropy = sum(-(np.exp(lp) * np.where(np.isfinite(lp), lp, 0.0)).sum(axis=1) for lp in ref)
    np.testing.assert_allclose(dist.entropy().numpy(), want_entropy, rtol=1e-5, atol=1e-5)
    # The symmetric KL to the uniform policy over the allowed actions.
    want_kl = 0.0
    for lp in ref:
        allowed = np.isfinite(lp)
        k = allowed.sum(axis=1)
        p = np.exp(lp)
        finite_lp = np.where(allowed, lp, 0.0)
        kl_pu = (p * (finite_lp + np.log(k)[:, None])).sum(axis=1)
        kl_up = np.where(allowed, (-np.log(k)[:, None] - finite_lp) / k[:, None], 0.0).sum(axis=1)
        want_kl = want_kl + kl_pu + kl_up
    np.testing.assert_allclose(dist.symmetric_kl_to_uniform().numpy(), want_kl, rtol=1e-4, atol=1e-5)
    # The most likely allowed action, even where a masked one has the larger logit.
    want_mode = np.stack([lp.argmax(axis=1) for lp in ref], axis=1)
    assert np.array_equal(dist.mode().numpy(), want_mode)
    assert (logits[:, :spec.sizes[0]].argmax(1) != want_mode[:, 0]).any(), "the mask changed no argmax"


@pytest.mark.parametrize("name", sorted(SPACES))
def test_sampling_never_picks_a_masked_action_and_follows_the_masked_probabilities(name):
    spec, logits, mask = _case(name, seed=1)
    rows = 4  # a few distinct rows, each drawn many times
    draws = 20000
    logits_t = torch.from_numpy(logits[:rows]).repeat_interleave(draws, 0)
    mask_t = torch.from_numpy(mask[:rows]).repeat_interleave(draws, 0)
    torch.manual_seed(0)
    actions = spec.distribution(logits_t, mask=mask_t).sample().view(rows, draws, -1).numpy()
    ref = _reference_log_probs(logits[:rows], mask[:rows], spec.sizes)
    offset = 0
    for i, n in enumerate(spec.sizes):
        for row in range(rows):
            picked = actions[row, :, i]
            assert mask[row, offset + picked].all(), f"component {i} of row {row} drew a masked action"
            freq = np.bincount(picked, minlength=n) / draws
            np.testing.assert_allclose(freq, np.exp(ref[i][row]), atol=0.015)
        offset += n
    for row in actions.reshape(-1, spec.action_dim)[:500]:
        assert SPACES[name].contains(spec.to_env(row))


@pytest.mark.parametrize("uniform, expected", [(0.0, 2), (1.0 - 2.0 ** -24, 1)])
def test_draws_at_either_end_of_the_cdf_land_on_allowed_actions(monkeypatch, uniform, expected):
    # torch.rand's extremes, 0 and the largest float32 below 1: neither may reach the
    # masked first or last action.
    spec = ActionSpec.from_space(gym.spaces.Discrete(4))
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.full(shape, uniform, dtype=kw.get("dtype")))
    mask = torch.tensor([[False, True, True, False]])
    assert spec.distribution(torch.zeros(1, 4), mask=mask).sample().item() == expected


@pytest.mark.parametrize("masked_logit", [0.0, 50.0, -float("inf"), float("inf")])
def test_gradients_stay_finite_and_leave_masked_logits_alone(masked_logit):
    """Whatever the head says for a masked action (even +-inf), the loss and its
    gradients are those of the allowed actions alone, with no nan anywhere; an
    allowed action whose probability underflows to 0 keeps them finite too."""
    spec = ActionSpec.from_space(gym.spaces.MultiDiscrete([4, 3]))
    allowed = torch.tensor([[True, False, True, True, False, True, True],
                            [True, True, True, False, True, False, False]])
    head = torch.tensor([[1.0, 0.0, -200.0, 0.5, 0.0, 2.0, -1.0],  # -200: p underflows to 0, log p finite
                         [0.3, -0.2, 0.1, 0.0, 0.0, 0.0, 0.0]])
    head = torch.where(allowed, head, torch.tensor(masked_logit))
    logits = head.clone().requires_grad_(True)
    actions = torch.tensor([[0, 1], [1, 0]])  # allowed picks
    dist = spec.distribution(logits, mask=allowed)
    loss = -(dist.log_prob(actions).sum() + 0.1 * dist.entropy().sum() - 0.01 * dist.symmetric_kl_to_uniform().sum())
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all(), logits.grad
    assert (logits.grad[~allowed] == 0).all()

    # The reference: each component's categorical over its allowed actions only.
    ref_logits = head.clone().requires_grad_(True)
    ref_loss = 0.0
    for row in range(2):
        offset = 0
        for col, n in enumerate(spec.sizes):
            keep = allowed[row, offset:offset + n].nonzero().squeeze(1)
            z = ref_logits[row, offset:offset + n][keep]
            log_p = torch.log_softmax(z, 0)
            pick = (keep == actions[row, col]).nonzero().item()
            entropy = -(log_p.exp() * log_p).sum()
            kl = (log_p.exp() * log_p).sum() - log_p.mean()
            ref_loss = ref_loss - (log_p[pick] + 0.1 * entropy - 0.01 * kl)
            offset += n
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(logits.grad[allowed], ref_logits.grad[allowed])


def test_a_row_with_nothing_allowed_is_found_and_named():
    spec = ActionSpec.from_space(gym.spaces.MultiDiscrete([2, 3]))
    mask = torch.ones(5, 5, dtype=torch.bool)
    assert spec.fully_masked(mask) is None
    mask[3, 2:] = False  # row 3 allows nothing of component 1
    assert spec.fully_masked(mask) == (3, 1)
    # Still no nan: the distribution stays defined (uniform there) for whoever reads it.
    dist = spec.distribution(torch.randn(5, 5), mask=mask)
    assert torch.isfinite(dist.entropy()).all() and torch.isfinite(dist.log_prob(dist.sample())).all()


# -- the model ---------------------------------------------------------------------------------------------------

def _obs_space(action_space, mask_shape=None, mask_space=None):
    sizes = _sizes(action_space)
    shape = mask_shape or (sum(sizes),)
    return gym.spaces.Dict({
        "features": gym.spaces.Box(-1.0, 1.0, (5,), np.float32),
        ACTION_MASK_KEY: mask_space or gym.spaces.Box(0, 1, shape, np.int8),
    })


def _model(action_space, use_rnn=False, **space_options) -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic(_obs_space(action_space, **space_options), action_space,
                       ModelSpec(hidden_sizes=(16,), use_rnn=use_rnn, rnn_size=8, policy_init_gain=1.0))


def _obs(model, rows: int, rng: np.random.Generator) -> dict:
    mask = torch.from_numpy(_random_mask(model.action_spec.sizes, rows, rng))
    shape = model.layout[ACTION_MASK_KEY][0]
    return {"features": torch.from_numpy(rng.standard_normal((rows, 5)).astype(np.float32)),
            ACTION_MASK_KEY: mask.view(rows, *shape)}


def test_the_mask_is_stored_as_bool_and_is_no_input_feature():
    space = SPACES["multi_discrete_unequal"]
    assert obs_layout(_obs_space(space))[ACTION_MASK_KEY] == ((10,), torch.bool)
    model = _model(space)
    plain = ActorCritic(gym.spaces.Dict({"features": gym.spaces.Box(-1.0, 1.0, (5,), np.float32)}), space,
                        ModelSpec(hidden_sizes=(16,)))
    assert model.obs_keys == ["features"] and len(model.encoders) == 1
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in plain.parameters())
    # Another mask moves no value.
    obs = _obs(model, 64, np.random.default_rng(0))
    everything = {**obs, ACTION_MASK_KEY: torch.ones_like(obs[ACTION_MASK_KEY])}
    with torch.no_grad():
        masked, full = model.act(obs, torch.zeros(64, 0)), model.act(everything, torch.zeros(64, 0))
    torch.testing.assert_close(masked.values, full.values)


@pytest.mark.parametrize("name", sorted(SPACES))
@pytest.mark.parametrize("use_rnn", [False, True])
def test_acting_keeps_to_the_mask_and_the_learner_recomputes_the_same_log_probs(name, use_rnn):
    space = SPACES[name]
    model = _model(space, use_rnn=use_rnn)
    T, n = 6, 32
    rng = np.random.default_rng(2)
    obs_seq = _obs(model, (T + 1) * n, rng)
    obs_seq = {k: v.view(T + 1, n, *v.shape[1:]) for k, v in obs_seq.items()}
    rnn = torch.zeros(n, model.rnn_state_size)
    acted, logps, greedy = [], [], []
    with torch.no_grad():
        for t in range(T):
            step = {k: v[t] for k, v in obs_seq.items()}
            out = model.act(step, rnn)
            greedy.append(model.act(step, rnn, deterministic=True).actions)
            rnn = out.rnn_state
            acted.append(out.actions)
            logps.append(out.logp)
    actions = torch.stack(acted)
    flat_mask = obs_seq[ACTION_MASK_KEY][:T].reshape(T, n, -1)
    for choice in (actions, torch.stack(greedy)):
        offsets = torch.tensor(np.cumsum([0] + model.action_spec.sizes[:-1]))
        assert flat_mask.gather(-1, choice + offsets).all(), "an action the mask forbids was chosen"
    with torch.no_grad():
        ev = model.evaluate(obs_seq, torch.zeros(n, model.rnn_state_size), torch.zeros(T + 1, n, dtype=torch.bool),
                            actions)
    torch.testing.assert_close(ev.logp, torch.stack(logps), rtol=1e-5, atol=1e-5)
    assert torch.isfinite(ev.entropy).all() and torch.isfinite(ev.logp).all()
    if not use_rnn:
        logp, entropy, _, _ = model.evaluate_samples({k: v[:T].flatten(0, 1) for k, v in obs_seq.items()},
                                                     actions.flatten(0, 1))
        torch.testing.assert_close(logp, ev.logp.flatten(), rtol=1e-5, atol=1e-5)


def test_the_mask_travels_through_the_trajectory_buffers_unchanged():
    space = SPACES["multi_discrete_equal"]
    model = _model(space, mask_shape=(3, 4))  # one row of 4 per component
    buffers = TrajectoryBuffers(3, 4, 2, model.layout, model.action_spec.action_dim, model.action_spec.dtype, 0)
    env_mask = np.array([[1, 0, 0, 1], [0, 1, 0, 0], [1, 1, 1, 1]], np.int8)  # what an env returns
    raw = {"features": np.zeros(5, np.float32), ACTION_MASK_KEY: env_mask}
    buffers.obs[ACTION_MASK_KEY].numpy()[1, 2, 0] = env_mask  # a rollout worker's numpy write
    as_tensors = obs_to_tensors(raw, _obs_space(space, mask_shape=(3, 4)))
    batch = buffers.gather([1])
    assert batch["obs"][ACTION_MASK_KEY].dtype == torch.bool
    assert torch.equal(batch["obs"][ACTION_MASK_KEY][2, 0], as_tensors[ACTION_MASK_KEY])
    assert torch.equal(as_tensors[ACTION_MASK_KEY], torch.from_numpy(env_mask != 0))


# aot_eager traces the forward as --compile_actors does, skipping the mask check there;
# inductor's code generation on top costs ~20 s of compiling on 2 cores.
@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_the_compiled_forward_keeps_to_the_mask(backend):
    model = _model(SPACES["discrete"]).eval()
    act = torch.compile(model.act, backend=backend)
    obs = _obs(model, 512, np.random.default_rng(3))
    with torch.no_grad():
        eager, compiled = model.act(obs, torch.zeros(512, 0), True), act(obs, torch.zeros(512, 0), True)
        sampled = act(obs, torch.zeros(512, 0)).actions
    assert torch.equal(compiled.actions, eager.actions)
    assert obs[ACTION_MASK_KEY].gather(1, sampled).all()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=GPU_MARKS)])
def test_a_policy_workers_forward_keeps_to_the_mask(device):
    """The policy workers' path: rows copied into the runner's host inputs, acted on in
    one batch (on a GPU through CUDA graphs captured on all-zero masks)."""
    model = _model(SPACES["multi_discrete_unequal"], use_rnn=True).to(device).eval()
    runner = make_policy_runner(model, device, max_batch=64)
    assert device == "cpu" or isinstance(runner, GraphedPolicy), "the masked forward could not be captured"
    obs = _obs(model, 48, np.random.default_rng(5))
    host_obs, host_rnn = runner.host_inputs(48)
    for key, value in obs.items():
        host_obs[key].copy_(value)
    host_rnn.zero_()
    with torch.no_grad():
        out = runner.act_on_host(NullClock())
    offsets = torch.tensor(np.cumsum([0] + model.action_spec.sizes[:-1]))
    assert obs[ACTION_MASK_KEY].gather(1, out.actions.cpu() + offsets).all()
    assert torch.isfinite(out.logp).all()


@pytest.mark.parametrize("action_space, mask_shape, expected", [
    (gym.spaces.Discrete(8), (7,), "has shape (7,), but the action space needs (8,)"),
    (gym.spaces.MultiDiscrete([3, 3]), (3,), "has shape (3,), but the action space needs (6,) or (2, 3)"),
    (gym.spaces.MultiDiscrete([2, 3]), (2, 3), "has shape (2, 3), but the action space needs (5,):"),
])
def test_a_mask_of_the_wrong_shape_is_refused_at_build_naming_both_shapes(action_space, mask_shape, expected):
    with pytest.raises(ValueError) as err:
        _model(action_space, mask_shape=mask_shape)
    assert expected in str(err.value) and str(err.value).count(". ") == 0, str(err.value)


def test_masks_that_fit_other_ways_are_taken_and_ones_that_cannot_are_refused():
    _model(gym.spaces.MultiDiscrete([3, 3]), mask_shape=(2, 3))
    _model(gym.spaces.Discrete(4), mask_space=gym.spaces.MultiBinary(4))
    with pytest.raises(ValueError, match="continuous"):
        ActorCritic(_obs_space(gym.spaces.Discrete(2)), gym.spaces.Box(-1.0, 1.0, (2,), np.float32))
    with pytest.raises(ValueError, match="integer or bool Box"):
        _model(gym.spaces.Discrete(4), mask_space=gym.spaces.Box(0.0, 1.0, (4,), np.float32))
    with pytest.raises(ValueError, match="holds only 'action_mask'"):
        ActorCritic(gym.spaces.Dict({ACTION_MASK_KEY: gym.spaces.Box(0, 1, (4,), np.int8)}), gym.spaces.Discrete(4))


def test_acting_on_a_row_with_nothing_allowed_says_so():
    model = _model(gym.spaces.MultiDiscrete([2, 3]))
    obs = _obs(model, 4, np.random.default_rng(4))
    obs[ACTION_MASK_KEY][2, 2:] = False
    refusal = r"^The 'action_mask' of observation 2 allows no action of action component 1;"
    with pytest.raises(ValueError, match=refusal), torch.no_grad():
        model.act(obs, torch.zeros(4, 0))


def test_an_env_split_refuses_a_step_with_nothing_allowed_and_its_random_steps_keep_to_the_mask():
    from fastrl.envs.registry import get_spec

    spec = get_spec("masked_env:MaskedChoiceDeadEnd-v0")
    n, T = 3, masked_env.DEAD_END_STEP + 2
    envs = make_envs(spec, {}, [1, 2, 3])
    layout = obs_layout(envs[0].observation_space)
    views = {"obs": {k: np.zeros((1, T + 1, n, *shape), torch.empty(0, dtype=dtype).numpy().dtype)
                     for k, (shape, dtype) in layout.items()},
             "final_obs": {k: np.zeros((1, T, n, *shape), np.float32) for k, (shape, _) in layout.items()},
             "actions": np.zeros((1, T, n, 1), np.int64), "rewards": np.zeros((1, T, n), np.float32),
             "terminated": np.zeros((1, T, n), bool), "truncated": np.zeros((1, T, n), bool),
             "episode_start": np.zeros((1, T + 1, n), bool)}
    action_spec = ActionSpec.from_space(envs[0].action_space)
    split = SplitEnvs(spec, {}, [1, 2, 3], envs, views, action_spec)
    try:
        split.reset_all(0, 0)
        for t in range(masked_env.DEAD_END_STEP - 1):
            mask = views["obs"][ACTION_MASK_KEY][0, t]
            views["actions"][0, t, :, 0] = mask.argmax(axis=1)  # an allowed action for each env
            split.receive(0, t)
        t = masked_env.DEAD_END_STEP - 1
        views["actions"][0, t, :, 0] = views["obs"][ACTION_MASK_KEY][0, t].argmax(axis=1)
        with pytest.raises(ValueError, match=r"^Env 0 of this worker \(masked_env:MaskedChoiceDeadEnd-v0\) returned an "
                                             r"observation whose 'action_mask' allows no action; an env must leave"):
            split.receive(0, t)
        assert all(env.unwrapped.illegal_actions == 0 for env in split.envs)
    finally:
        split.close()

    # The random steps that spread envs over their first episode keep to the mask too.
    env = gym.make("MaskedChoice-v0", max_episode_steps=400)
    obs, _ = env.reset(seed=0)
    from fastrl.algo.distributions import random_allowed_action
    for _ in range(300):
        obs, _, terminated, truncated, _ = env.step(random_allowed_action(env.action_space, obs))
        if terminated or truncated:
            obs, _ = env.reset()
    assert env.unwrapped.illegal_actions == 0


# -- end to end --------------------------------------------------------------------------------------------------

def _illegal_lines(log_dir) -> list:
    return [line for name in sorted(os.listdir(log_dir)) for line in open(os.path.join(log_dir, name))]


@pytest.mark.parametrize("env, inference", [("MaskedChoice-v0", "local"), ("MaskedChoiceMulti-v0", "policy_worker")])
def test_a_task_the_mask_decides_is_learned_without_one_illegal_action(tmp_path, env, inference):
    """Random actions score about -0.8 here and random legal ones 10 of 20: the run
    must pass 18 within seconds of training, and no process of it, the start-up's
    timed env steps and the evaluator's greedy episodes included, nor `enjoy`
    afterwards, may send the env one action its mask forbids."""
    log_dir = tmp_path / "illegal"
    log_dir.mkdir()
    run_env = {**TEST_ENVS_ON_PATH, "MASKED_ENV_LOG": str(log_dir)}
    name = f"masked_env:{env}"
    run = TrainRun(["--env", name, "--experiment", "masked", "--train_dir", str(tmp_path),
                    "--num_workers", "1", "--num_envs_per_worker", "16", "--inference", inference,
                    "--eval_every_frames", "5000", "--eval_episodes", "4", "--stop_at_reward", "18",
                    "--train_for_env_frames", "400000", "--status_every_seconds", "2"], env=run_env)
    assert run.wait(timeout=180) == 0, run.output()
    summary = read_summary(tmp_path, "masked")
    assert summary["reached_reward_mean_100"] >= 18, run.output()
    assert summary["env_restarts"] == 0
    assert _illegal_lines(log_dir) == [], "illegal actions were taken:\n" + "".join(_illegal_lines(log_dir)[:10])

    played = subprocess.run([sys.executable, "-m", "fastrl.enjoy", "--env", name, "--experiment", "masked",
                             "--train_dir", str(tmp_path), "--episodes", "3", "--deterministic"],
                            cwd=REPO, env={**os.environ, **run_env}, capture_output=True, text=True, timeout=120)
    assert played.returncode == 0, played.stderr
    assert "mean return over 3 episode(s):" in played.stdout
    assert float(played.stdout.rsplit(":", 1)[1]) >= 18, played.stdout
    assert _illegal_lines(log_dir) == [], "enjoy took illegal actions:\n" + "".join(_illegal_lines(log_dir)[:10])


def test_an_env_whose_mask_does_not_fit_its_actions_is_refused_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fastrl.train", "--env", "masked_env:MaskedChoiceWrongMask-v0",
                           "--train_dir", str(tmp_path), "--plan", "off"],
                          cwd=REPO, env={**os.environ, **TEST_ENVS_ON_PATH}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "fastrl: error: masked_env:MaskedChoiceWrongMask-v0: The observation's 'action_mask' has shape (7,), but the "
        "action space needs (8,): one 0/1 for each of its 8 actions."], proc.stderr
    assert not os.listdir(tmp_path)
