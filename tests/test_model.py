"""ActorCritic shapes, learner/inference consistency, flat state and normalisation."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from fastrl.algo.model import (
    IMAGE_NORM_ROWS,
    ActorCritic,
    ModelSpec,
    RunningNorm,
    flat_state,
    flat_state_size,
    gru_step,
    load_flat_state,
    obs_layout,
    obs_to_tensors,
    obs_zeros,
)

IMAGE = gym.spaces.Box(0, 255, (3, 72, 128), np.uint8)
VECTOR = gym.spaces.Box(-2.0, 2.0, (6,), np.float32)
OBS_SPACES = {
    "vector": VECTOR,
    "image": IMAGE,
    "dict": gym.spaces.Dict({"image": IMAGE, "measurements": gym.spaces.Box(-1, 1, (4,), np.float32)}),
    "discrete": gym.spaces.Discrete(7, start=-3),
}
ACTION_SPACES = {
    "vector": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
    "image": gym.spaces.Discrete(4),
    "dict": gym.spaces.MultiDiscrete([3, 3, 2]),
    "discrete": gym.spaces.Discrete(3),
}
T, B, H = 4, 3, 16


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    torch.set_num_threads(1)


def _batch(space, lead):
    """Random observations {key: [*lead, *shape]} in the layout dtypes."""
    rng = np.random.default_rng(0)
    out = {}
    for key, (shape, dtype) in obs_layout(space).items():
        if dtype == torch.uint8:
            out[key] = torch.from_numpy(rng.integers(0, 256, (*lead, *shape), dtype=np.uint8))
        elif dtype == torch.int64:
            sub = space[key] if isinstance(space, gym.spaces.Dict) else space
            out[key] = torch.from_numpy(rng.integers(sub.start, sub.start + sub.n, lead))
        else:
            out[key] = torch.from_numpy(rng.normal(size=(*lead, *shape)).astype(np.float32))
    return out


def _model(name, use_rnn, **kwargs):
    return ActorCritic(OBS_SPACES[name], ACTION_SPACES[name], ModelSpec(use_rnn=use_rnn, rnn_size=H, **kwargs))


@pytest.mark.parametrize("use_rnn", [False, True])
@pytest.mark.parametrize("name", sorted(OBS_SPACES))
def test_act_and_evaluate_shapes(name, use_rnn):
    model = _model(name, use_rnn)
    spec = model.action_spec
    hidden = H if use_rnn else 0
    assert model.rnn_state_size == hidden

    with torch.no_grad():
        out = model.act(_batch(OBS_SPACES[name], (B,)), torch.zeros(B, hidden))
    assert out.actions.shape == (B, spec.action_dim) and out.actions.dtype == spec.dtype
    assert out.logp.shape == out.values.shape == (B,)
    assert out.rnn_state.shape == (B, hidden)

    actions = torch.stack([out.actions] * T)
    episode_start = torch.zeros(T + 1, B)
    ev = model.evaluate(_batch(OBS_SPACES[name], (T + 1, B)), torch.zeros(B, hidden), episode_start, actions)
    assert ev.logp.shape == ev.entropy.shape == (T, B)
    assert ev.values.shape == (T + 1, B)
    assert ev.core_out.shape == (T + 1, B, model.core_size)
    assert ev.rnn_states.shape == (T + 1, B, hidden)
    (ev.logp.sum() + ev.values.sum() + ev.entropy.sum()).backward()
    assert model.policy_head.weight.grad is not None


@pytest.mark.parametrize("use_rnn", [False, True])
@pytest.mark.parametrize("name", ["vector", "dict"])
def test_evaluate_equals_stepwise_act(name, use_rnn):
    """The learner's unroll must reproduce what inference computed step by step."""
    model = _model(name, use_rnn)
    hidden = model.rnn_state_size
    obs = _batch(OBS_SPACES[name], (T + 1, B))
    episode_start = torch.zeros(T + 1, B)
    episode_start[0, 0] = episode_start[2, 1] = episode_start[3, 0] = 1
    h0 = torch.randn(B, hidden)

    h, actions, logps, values, states = h0, [], [], [], []
    with torch.no_grad():
        for t in range(T + 1):
            states.append(h)
            h = h * (1 - episode_start[t]).unsqueeze(-1)  # what the rollout worker does on reset
            out = model.act({k: v[t] for k, v in obs.items()}, h)
            h = out.rnn_state
            actions.append(out.actions)
            logps.append(out.logp)
            values.append(out.values)
        ev = model.evaluate(obs, h0, episode_start, torch.stack(actions[:T]))

        torch.testing.assert_close(ev.logp, torch.stack(logps[:T]))
        torch.testing.assert_close(ev.values, torch.stack(values))
        torch.testing.assert_close(ev.rnn_states, torch.stack(states))

        # The truncation bootstrap: the final obs of an episode that ended at step t is
        # evaluated with rnn_states[t + 1], the state right after step t.
        extra = {k: v[1] for k, v in obs.items()}
        v_extra = model.values_with_state(extra, ev.rnn_states[2])
        h_after_1 = model.act(extra, ev.rnn_states[2]).values
        torch.testing.assert_close(v_extra, h_after_1)
        if use_rnn:
            torch.testing.assert_close(ev.rnn_states[2], ev.core_out[1])


def test_gru_step_is_torchs_gru_cell():
    cell = torch.nn.GRUCell(5, 4)
    x_t, h_tm1 = torch.randn(3, 5), torch.randn(3, 4)
    gi_t = torch.nn.functional.linear(x_t, cell.weight_ih, cell.bias_ih)
    with torch.no_grad():
        torch.testing.assert_close(gru_step(gi_t, h_tm1, cell.weight_hh, cell.bias_hh), cell(x_t, h_tm1),
                                   rtol=1e-6, atol=1e-7)
    # A hand-checked case: zero weights make every gate sigmoid(0) = 0.5 and n = tanh(0) = 0,
    # so h_t = 0.5 * h_tm1.
    zeros = torch.zeros(12, 4)
    torch.testing.assert_close(gru_step(torch.zeros(1, 12), torch.tensor([[2.0, -4.0, 0.0, 1.0]]), zeros,
                                        torch.zeros(12)), torch.tensor([[1.0, -2.0, 0.0, 0.5]]))
    with pytest.raises(ValueError, match=r"gi_t \[N, 3H\]"):
        gru_step(torch.zeros(1, 8), h_tm1[:1], cell.weight_hh, cell.bias_hh)


def test_flat_state_round_trip():
    source = _model("dict", True, normalize_obs=True)
    target = _model("dict", True, normalize_obs=True)
    obs = _batch(OBS_SPACES["dict"], (B,))
    source.update_normalizer(_batch(OBS_SPACES["dict"], (T, B)))
    h = torch.randn(B, H)

    flat = flat_state(source)
    assert flat.dim() == 1 and flat.dtype == torch.float32 and flat.numel() == flat_state_size(source)
    with torch.no_grad():
        before = target.act(obs, h, deterministic=True)
        load_flat_state(target, flat)
        after = target.act(obs, h, deterministic=True)
        expected = source.act(obs, h, deterministic=True)
    assert not torch.allclose(before.values, expected.values)
    for got, want in zip(after, expected):
        assert torch.equal(got, want)
    assert torch.equal(flat_state(target), flat)

    with pytest.raises(ValueError, match="same config"):
        load_flat_state(_model("vector", False), flat)


def test_normalizer_statistics_outputs_and_flat_state():
    model = _model("vector", False, normalize_obs=True)
    norm = model.encoders[0].norm
    obs = _batch(VECTOR, (B,))
    with torch.no_grad():
        before = model.act(obs, torch.zeros(B, 0), deterministic=True).values
    flat_before = flat_state(model)

    data = torch.randn(3, 50, 6, dtype=torch.float64) * torch.arange(1, 7) + 5.0
    for chunk in data:  # incremental updates equal the statistics of all data at once
        model.update_normalizer({"obs": chunk.float()})
    all_data = data.reshape(-1, 6)
    torch.testing.assert_close(norm.mean, all_data.mean(0).float())
    torch.testing.assert_close(norm.var, all_data.var(0, unbiased=False).float())
    assert norm.count.item() == 150

    with torch.no_grad():
        after = model.act(obs, torch.zeros(B, 0), deterministic=True).values
        clipped = norm(torch.full((1, 6), 1e6))
    assert not torch.allclose(before, after)
    assert torch.all(clipped == 10.0)
    assert not torch.equal(flat_state(model), flat_before)

    fresh = _model("vector", False, normalize_obs=True)
    load_flat_state(fresh, flat_state(model))
    torch.testing.assert_close(fresh.encoders[0].norm.mean, norm.mean)

    unnormalized = _model("vector", False)
    unnormalized.update_normalizer({"obs": data[0].float()})  # a no-op by design
    assert flat_state_size(unnormalized) == flat_state_size(model) - (6 + 6 + 1)


def test_normalizer_folds_in_only_the_kept_samples():
    kept_model, rows_model = _model("vector", False, normalize_obs=True), _model("vector", False, normalize_obs=True)
    data = torch.randn(4, 5, 6) * 3 + 2  # [T, B, 6]
    keep = torch.rand(4, 5) < 0.6
    kept_model.update_normalizer({"obs": data}, keep=keep)
    rows_model.update_normalizer({"obs": data[keep]})
    for a, b in zip(kept_model.encoders[0].norm.buffers(), rows_model.encoders[0].norm.buffers()):
        torch.testing.assert_close(a, b)
    assert kept_model.encoders[0].norm.count.item() == keep.sum().item()


@pytest.mark.parametrize("bf16", [False, True])
def test_images_are_normalised_per_pixel(bf16):
    model = _model("image", False, normalize_obs=True)
    encoder = model.encoders[0]
    encoder.bf16 = bf16
    C, H, W = IMAGE.shape
    # Each pixel has its own level and spread; a batch larger than IMAGE_NORM_ROWS is subsampled.
    level = torch.randint(20, 200, (C, H, W)).float()
    frames = (level + torch.randint(-10, 11, (IMAGE_NORM_ROWS * 3, C, H, W))).clamp(0, 255).to(torch.uint8)
    model.update_normalizer({"obs": frames.view(3, IMAGE_NORM_ROWS, C, H, W)})
    assert encoder.norm.count.item() == IMAGE_NORM_ROWS
    torch.testing.assert_close(encoder.norm.mean, level, atol=1.5, rtol=0)

    # The conv layers see each pixel's z-score against its own statistics.
    x = frames[:4]
    z = ((x.float() - encoder.norm.mean) / torch.sqrt(encoder.norm.var + 1e-8)).clamp(-10, 10)
    with torch.no_grad():
        got = encoder(x)
        want = encoder.fc(encoder.conv(z))
    torch.testing.assert_close(got, want, atol=0.05 if bf16 else 1e-4, rtol=0.05 if bf16 else 1e-4)


def test_image_moments_in_float32_match_a_float64_reference():
    # Frames are summed in float32 (a speed matter); the sums about the running mean
    # must stay within rounding of float64's for a call's IMAGE_NORM_ROWS frames.
    torch.manual_seed(0)
    norm = RunningNorm(IMAGE.shape)
    norm.mean.copy_(torch.rand(IMAGE.shape) * 255)
    frames = torch.randint(0, 256, (IMAGE_NORM_ROWS, *IMAGE.shape), dtype=torch.uint8)
    d = frames.double() - norm.mean.double()
    k = d[0].numel()
    for x in (frames, frames.contiguous(memory_format=torch.channels_last)):
        got = norm.moments(x)
        assert got.dtype == torch.float64 and got[0].item() == IMAGE_NORM_ROWS
        assert (got[1:1 + k] - d.sum(0).reshape(-1)).abs().max() < 0.05
        torch.testing.assert_close(got[1 + k:], d.square().sum(0).reshape(-1), rtol=1e-6, atol=0.0)


def test_the_pixel_z_score_is_the_same_whatever_the_images_layout():
    # The statistics are laid out as the images are before the arithmetic (a speed
    # matter only): channels-last and contiguous frames, uint8 or float, give the
    # textbook z-score to the last bit.
    norm = RunningNorm(IMAGE.shape)
    norm.mean.copy_(torch.rand(IMAGE.shape) * 255)
    norm.var.copy_(torch.rand(IMAGE.shape) * 50)
    norm.var[0, 0, :3] = 0.0  # static pixels: the epsilon and the clip decide
    frames = torch.randint(0, 256, (5, *IMAGE.shape), dtype=torch.uint8)
    want = ((frames.float() - norm.mean) * torch.rsqrt(norm.var + 1e-8)).clamp(-10, 10)
    for x in (frames, frames.contiguous(memory_format=torch.channels_last), frames.float()):
        got = norm(x)
        assert got.dtype == torch.float32 and torch.equal(got, want)


def test_image_statistics_are_stored_as_the_frames_are_and_load_from_any_layout():
    # An image encoder's statistics live channels-last, as its frames do, so that a
    # compiled z-score reads both in one order; checkpoints and flat_state carry
    # values, not the layout, so statistics saved [C, H, W] load into them unchanged.
    norm = RunningNorm(IMAGE.shape, channels_last=True)
    for stat in (norm.mean, norm.var):
        assert stat.shape == IMAGE.shape and stat.unsqueeze(0).is_contiguous(memory_format=torch.channels_last)
    saved = {"mean": torch.rand(IMAGE.shape) * 255, "var": torch.rand(IMAGE.shape) * 50, "count": torch.tensor(7.0)}
    norm.load_state_dict(saved)
    assert torch.equal(norm.mean, saved["mean"]) and torch.equal(norm.var, saved["var"])
    assert norm.mean.unsqueeze(0).is_contiguous(memory_format=torch.channels_last)
    copy = RunningNorm(IMAGE.shape, channels_last=True)
    load_flat_state(copy, flat_state(norm))
    assert torch.equal(copy.mean, norm.mean) and torch.equal(copy.var, norm.var)
    frames = torch.randint(0, 256, (4, *IMAGE.shape), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    plain = RunningNorm(IMAGE.shape)
    plain.load_state_dict(saved)
    assert torch.equal(norm(frames), plain(frames))
    with pytest.raises(ValueError, match="images"):
        RunningNorm((4,), channels_last=True)


def test_obs_layout_and_conversion():
    space = gym.spaces.Dict(
        {"image": IMAGE, "vec": gym.spaces.Box(-1, 1, (2, 3), np.float64), "d": gym.spaces.Discrete(5)}
    )
    layout = obs_layout(space)
    assert layout == {
        "d": ((), torch.int64),
        "image": ((3, 72, 128), torch.uint8),
        "vec": ((2, 3), torch.float32),
    }
    raw = {"image": IMAGE.sample()[:, ::-1], "vec": np.ones((2, 3)), "d": np.int64(4)}
    tensors = obs_to_tensors(raw, space)
    for key, (shape, dtype) in layout.items():
        assert tensors[key].shape == shape and tensors[key].dtype == dtype
    assert np.array_equal(tensors["image"].numpy(), raw["image"])
    assert tensors["d"].item() == 4
    assert obs_layout(gym.spaces.Discrete(3)) == {"obs": ((), torch.int64)}
    assert obs_to_tensors(2, gym.spaces.Discrete(3))["obs"].dtype == torch.int64


def test_channel_last_image_is_rejected_with_fix():
    with pytest.raises(ValueError, match=r"channel-last.*transpose"):
        obs_layout(gym.spaces.Box(0, 255, (72, 128, 3), np.uint8))
    with pytest.raises(ValueError, match=r"channel-last.*transpose"):
        ActorCritic(gym.spaces.Dict({"img": gym.spaces.Box(0, 255, (84, 84, 1), np.uint8)}), gym.spaces.Discrete(2))


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="too small"):
        ActorCritic(gym.spaces.Box(0, 255, (3, 20, 20), np.uint8), gym.spaces.Discrete(2))
    with pytest.raises(ValueError, match="activation"):
        ActorCritic(VECTOR, gym.spaces.Discrete(2), ModelSpec(activation="gelu"))
    with pytest.raises(ValueError, match="unsupported space"):
        obs_layout(gym.spaces.MultiBinary(4))
    model = _model("vector", True)
    with pytest.raises(ValueError, match="expects"):
        model.act({"wrong": torch.zeros(B, 6)}, torch.zeros(B, H))
    with pytest.raises(ValueError, match=r"rnn_state must be \[B, 16\]"):
        model.act(_batch(VECTOR, (B,)), torch.zeros(B, 0))


# -- bf16 image encoders ---------------------------------------------------------------------

def _bf16_twin(name):
    """An fp32 model and a bf16-encoder model with the same weights."""
    fp32 = _model(name, True)
    bf16 = _model(name, True, conv_bf16=True)
    bf16.load_state_dict(fp32.state_dict())  # the same keys: checkpoints load either way
    return fp32, bf16


def _relative_error(a, b):
    return float((a - b).norm() / a.norm())


@pytest.mark.parametrize("name", ["image", "dict"])
def test_bf16_encoder_features_and_gradients_follow_fp32(name):
    fp32, bf16 = _bf16_twin(name)
    obs = _batch(OBS_SPACES[name], (32,))
    features = {}
    for label, model in (("fp32", fp32), ("bf16", bf16)):
        x = model._encode(obs)
        x.square().mean().backward()
        features[label] = x.detach()
    assert features["bf16"].dtype == torch.float32  # the GRU and heads get float32
    # bfloat16 keeps 8 significant bits (relative step 2^-8 = 0.4%).
    assert _relative_error(features["fp32"], features["bf16"]) < 0.02
    for (key, p32), p16 in zip(fp32.named_parameters(), bf16.parameters()):
        if p32.grad is not None:
            assert _relative_error(p32.grad, p16.grad) < 0.05, key


def test_bf16_learner_unroll_matches_inference_closely():
    # The learner's batch and the actor's differ in size, so their bf16 arithmetic could
    # round differently; it must stay far below the bf16-vs-fp32 difference (~1%), or
    # V-trace would read rounding as off-policyness. Measured: ~1e-7.
    _, model = _bf16_twin("image")
    obs = _batch(IMAGE, (T + 1, B))
    h, values, states, actions = torch.zeros(B, H), [], [], []
    with torch.no_grad():
        for t in range(T + 1):
            out = model.act({"obs": obs["obs"][t]}, h)
            h = out.rnn_state
            values.append(out.values)
            states.append(h)
            actions.append(out.actions)
        ev = model.evaluate(obs, torch.zeros(B, H), torch.zeros(T + 1, B), torch.stack(actions[:T]))
    assert _relative_error(torch.stack(values), ev.values) < 1e-4
    assert _relative_error(torch.stack(states), ev.core_out) < 1e-4


@pytest.mark.parametrize("conv_bf16", [False, True], ids=["fp32", "bf16"])
def test_encoder_reads_channels_last_storage_as_the_same_image(conv_bf16):
    model = _model("image", True, conv_bf16=conv_bf16)
    image = _batch(IMAGE, (8,))["obs"]
    stored = obs_zeros((8,), (3, 72, 128), torch.uint8).copy_(image)  # the buffers' layout
    assert stored.is_contiguous(memory_format=torch.channels_last) and torch.equal(stored, image)
    with torch.no_grad():
        torch.testing.assert_close(model._encode({"obs": stored}), model._encode({"obs": image}),
                                   rtol=1e-5, atol=1e-6)


def test_bf16_inference_weights_give_autocasts_numbers_and_follow_every_update():
    model = _model("image", True, conv_bf16=True)
    encoder = model.encoders[0]
    image = _batch(IMAGE, (8,))["obs"]
    keys, size = list(model.state_dict()), flat_state_size(model)

    def autocast_features():
        x = image.contiguous(memory_format=torch.channels_last).to(torch.bfloat16).mul_(1.0 / 255.0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return encoder.fc(encoder.conv(x)).float()

    with torch.no_grad():
        before = encoder(image)
        assert torch.equal(before, autocast_features())
    # An optimizer step changes the weights in place: the bf16 copies must follow.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    encoder(image).square().mean().backward()  # with gradients: the autocast path
    optimizer.step()
    with torch.no_grad():
        after_step = encoder(image)
        assert not torch.equal(after_step, before) and torch.equal(after_step, autocast_features())
        # So must a parameter load (the actors' way to get new weights).
        load_flat_state(model, flat_state(_model("image", True, conv_bf16=True)))
        assert torch.equal(encoder(image), autocast_features())
    assert list(model.state_dict()) == keys and flat_state_size(model) == size


def test_build_model_computes_in_the_precision_it_is_given():
    from fastrl.algo.model import build_model
    from fastrl.config import Config

    cfg = Config(env="CartPole-v1", precision="bf16")  # only what the caller passes counts
    assert [e.bf16 for e in build_model(cfg, IMAGE, gym.spaces.Discrete(3)).encoders] == [False]
    assert [e.bf16 for e in build_model(cfg, IMAGE, gym.spaces.Discrete(3), "bf16").encoders] == [True]
    with pytest.raises(ValueError, match="resolve --precision auto first"):
        build_model(cfg, IMAGE, gym.spaces.Discrete(3), "auto")


def test_init_gains_reach_the_encoders_and_the_policy_head():
    # An orthogonal matrix's rows (or columns) have norm `gain`: the policy head's
    # rows, and each row of a wide-enough encoder layer, measure the gain back.
    obs = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    for enc_gain, pol_gain in ((math.sqrt(2.0), 0.01), (1.0, 1.0)):
        spec = ModelSpec(hidden_sizes=(16,), separate_critic=False, encoder_init_gain=enc_gain,
                         policy_init_gain=pol_gain)
        model = ActorCritic(obs, gym.spaces.Discrete(3), spec)
        head = model.policy_head.weight  # [3, 16]: 3 orthonormal rows, times the gain
        torch.testing.assert_close(head.norm(dim=1), torch.full((3,), pol_gain))
        first = next(m for m in model.encoders.modules() if isinstance(m, torch.nn.Linear)).weight  # [16, 4]
        torch.testing.assert_close(first.norm(dim=0), torch.full((4,), enc_gain))


def test_log_std_init_sets_the_gaussians_starting_spread_from_the_config():
    from fastrl.algo.model import build_model
    from fastrl.config import Config

    box = ACTION_SPACES["vector"]
    model = build_model(Config(env="Pendulum-v1", log_std_init=-1.0), VECTOR, box)
    torch.testing.assert_close(model.log_std.detach(), torch.full((2,), -1.0))
    # Sampled actions spread around the deterministic ones by exp(-1).
    obs = {key: value[:1].expand(20_000, *value.shape[1:]) for key, value in _batch(VECTOR, (1,)).items()}
    with torch.no_grad():
        sampled = model.act(obs, torch.zeros(20_000, 0)).actions
        mode = model.act(obs, torch.zeros(20_000, 0), deterministic=True).actions
    torch.testing.assert_close((sampled - mode).std(dim=0), torch.full((2,), math.exp(-1.0)), rtol=0.03, atol=0)
    assert build_model(Config(env="Pendulum-v1"), VECTOR, box).log_std.detach().eq(0.0).all()  # std 1 unless set
    # In half-widths of each bounded dimension; an unbounded one takes the value as it is.
    mixed = gym.spaces.Box(np.array([-2.0, -0.4, -np.inf], np.float32), np.array([2.0, 0.4, np.inf], np.float32))
    std = build_model(Config(env="Pendulum-v1", log_std_init=-1.0), VECTOR, mixed).log_std.detach().exp()
    torch.testing.assert_close(std, math.exp(-1.0) * torch.tensor([2.0, 0.4, 1.0]))


def test_bf16_acting_copies_refresh_in_place_with_new_weights():
    # A CUDA graph replays the bf16 copies' weights from their addresses, and runs no
    # Python that could notice a reload: refresh_acting_copies must write the new
    # weights into the same tensors, with the values a freshly built copy would hold.
    space = gym.spaces.Box(0, 255, (3, 36, 36), np.uint8)
    model = ActorCritic(space, gym.spaces.Discrete(3), ModelSpec(use_rnn=False, conv_bf16=True)).eval()
    other = ActorCritic(space, gym.spaces.Discrete(3), ModelSpec(use_rnn=False, conv_bf16=True)).eval()
    obs = {"obs": torch.randint(0, 256, (4, 3, 36, 36), dtype=torch.uint8)}
    with torch.no_grad():
        model.act(obs, torch.zeros(4, 0))
        held = [p.data_ptr() for p in model.encoders[0]._bf16_layers().parameters()]
        load_flat_state(model, flat_state(other))
        model.refresh_acting_copies()
        layers = model.encoders[0].__dict__["_bf16_copy"]
        assert [p.data_ptr() for p in layers.parameters()] == held
        for copied, weight in zip(layers.parameters(), [*other.encoders[0].conv.parameters(),
                                                        *other.encoders[0].fc.parameters()]):
            assert torch.equal(copied, weight.to(torch.bfloat16))
        torch.testing.assert_close(model.encoders[0](obs["obs"]), other.encoders[0](obs["obs"]))


def test_a_training_bf16_model_sees_its_optimizer_steps_without_gradients():
    # A fused optimizer step moves the weights without moving their version counters,
    # so a cache keyed on them would go stale: the learner's no-grad forwards (the
    # bootstrap of a truncated episode) must compute with the weights as they are.
    from fastrl.learning.adam import FusedAdam

    space = gym.spaces.Box(0, 255, (3, 36, 36), np.uint8)
    model = ActorCritic(space, gym.spaces.Discrete(3), ModelSpec(use_rnn=False, conv_bf16=True)).train()
    image = torch.randint(0, 256, (4, 3, 36, 36), dtype=torch.uint8)
    encoder = model.encoders[0]
    with torch.no_grad():
        before = encoder(image)
    encoder(image).square().mean().backward()
    versions = [p._version for p in model.parameters()]
    FusedAdam(model.parameters(), lr=0.1).step()
    assert [p._version for p in model.parameters()] == versions  # the premise: nothing to see there
    with torch.no_grad():
        after = encoder(image)
        torch.testing.assert_close(after, encoder(image.clone()))
    with_grad = encoder(image).detach()
    assert not torch.allclose(after, before)
    torch.testing.assert_close(after, with_grad)


@pytest.mark.parametrize("stack, cells", [("fastrl", 128 * 4 * 4), ("nature", 64 * 7 * 7)])
def test_the_conv_stacks_on_an_atari_frame(stack, cells):
    # An 84x84 frame: fastrl's stack ends at 4x4 cells of 128 channels, the Nature
    # DQN's at 7x7 of 64 (its 3x3 stride-1 last layer).
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    model = ActorCritic(frames, gym.spaces.Discrete(4), ModelSpec(conv_stack=stack))
    encoder = model.encoders[0]
    assert encoder.fc[0].in_features == cells
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    with torch.no_grad():
        assert encoder(obs).shape == (5, 512)
    with pytest.raises(ValueError, match="unknown; use one of"):
        ActorCritic(frames, gym.spaces.Discrete(4), ModelSpec(conv_stack="resnet"))
