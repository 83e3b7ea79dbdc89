"""fastrl.cuda: the CPU fallbacks here, the GPU paths wherever a CUDA device exists."""

import pickle
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.multiprocessing as tmp
import torch.nn as nn
from helpers import GPU_MARKS

from fastrl.algo.model import ActorCritic, ActOutput, ModelSpec, flat_state, load_flat_state
from fastrl.cuda import cuda_available
from fastrl.cuda.graphs import (
    EagerPolicy,
    GraphCaptureError,
    GraphedPolicy,
    make_policy_runner,
    pad_ladder,
)
from fastrl.cuda.ipc import copy_and_wait, device_param_buffer, remove_driver_files
from fastrl.cuda.staging import BatchStager, CudaStager, PassThroughStager
from fastrl.cuda.timing import MAX_PENDING, DeviceClock, NullClock
from fastrl.plumbing.params import SharedParams, device_copies

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (5,), np.float32)
ACTION_SPACE = gym.spaces.MultiDiscrete([4, 4, 3])
NEEDS_NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a CUDA device")


def needs_gpu(test):
    for mark in GPU_MARKS:
        test = mark(test)
    return test


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _model(action_space=ACTION_SPACE, use_rnn=True, device="cpu"):
    model = ActorCritic(OBS_SPACE, action_space, ModelSpec(hidden_sizes=(32, 32), use_rnn=use_rnn, rnn_size=16))
    return model.to(device).eval()


def _inputs(batch, rnn_size=16, device="cpu"):
    obs = {"obs": torch.rand(batch, *OBS_SPACE.shape, device=device) * 2 - 1}
    return obs, torch.randn(batch, rnn_size, device=device)


def _batch(scale=1.0, rows=6):
    return {
        "rewards": torch.arange(rows * 2, dtype=torch.float32).view(rows, 2) * scale,
        "actions": torch.arange(rows, dtype=torch.int64) * int(scale),
        "obs": {"image": torch.full((rows, 3, 4), int(scale) % 256, dtype=torch.uint8),
                "measurements": torch.randn(rows, 2)},
    }


def _leaves(batch):
    for value in batch.values():
        yield from (_leaves(value) if isinstance(value, dict) else [value])


# -- CPU fallbacks (run everywhere) ------------------------------------------------------

def test_cuda_available_matches_torch():
    assert cuda_available() == torch.cuda.is_available()


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_cpu_stager_hands_back_the_same_tensors_without_copying(device):
    stager = BatchStager.for_device(device)
    assert isinstance(stager, PassThroughStager)
    batch = _batch()
    pointers = [t.data_ptr() for t in _leaves(batch)]
    out = stager.finish(stager.start(batch))
    assert out is batch
    assert [t.data_ptr() for t in _leaves(out)] == pointers


@NEEDS_NO_GPU
def test_cuda_stager_without_a_device_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no CUDA device"):
        BatchStager.for_device("cuda")


def test_stager_rejects_other_device_types():
    with pytest.raises(ValueError, match="cpu and cuda"):
        BatchStager.for_device("meta")


def test_pad_ladder_doubles_up_to_the_max_batch():
    assert pad_ladder(1) == [1]
    assert pad_ladder(64) == [1, 2, 4, 8, 16, 32, 64]
    assert pad_ladder(100) == [1, 2, 4, 8, 16, 32, 64, 100]
    with pytest.raises(ValueError):
        pad_ladder(0)


@pytest.mark.parametrize("deterministic", [False, True])
def test_cpu_policy_runner_equals_model_act_with_a_fixed_seed(deterministic):
    model = _model()
    runner = make_policy_runner(model, "cpu", max_batch=8, deterministic=deterministic)
    assert isinstance(runner, EagerPolicy)
    obs, rnn = _inputs(7)
    torch.manual_seed(123)
    with torch.no_grad():
        expected = model.act(obs, rnn, deterministic=deterministic)
    torch.manual_seed(123)
    got = runner(obs, rnn)
    assert not got.logp.requires_grad
    for name, want, have in zip(ActOutput._fields, expected, got):
        assert torch.equal(want, have), name


def _act_on_host(runner, obs, rnn):
    """The policy worker's way in: fill the runner's host inputs, act on them."""
    host_obs, host_rnn = runner.host_inputs(rnn.shape[0])
    for key, value in obs.items():
        host_obs[key].copy_(value)
    host_rnn.copy_(rnn)
    return runner.act_on_host(NullClock())


def test_cpu_policy_runner_acts_on_host_inputs_as_on_its_arguments():
    model = _model()
    runner = make_policy_runner(model, "cpu", max_batch=8, deterministic=True)
    obs, rnn = _inputs(7)
    want = runner(obs, rnn)
    have = _act_on_host(runner, obs, rnn)
    for name, a, b in zip(ActOutput._fields, want, have):
        assert b.device.type == "cpu" and torch.equal(a, b), name


@NEEDS_NO_GPU
def test_graphed_policy_is_unsupported_without_cuda():
    assert not GraphedPolicy.supported()
    model = _model()
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        GraphedPolicy(model, [1, 2], model.layout, model.rnn_state_size, "cpu")


def test_param_reload_keeps_every_tensor_address():
    # The premise that keeps captured graphs valid across reloads (see graphs.py):
    # load_flat_state writes new values into the existing parameter and buffer memory.
    model, other = _model(), _model()
    addresses = {name: t.data_ptr() for name, t in model.state_dict().items()}
    load_flat_state(model, flat_state(other))
    assert {name: t.data_ptr() for name, t in model.state_dict().items()} == addresses
    assert torch.equal(flat_state(model), flat_state(other))


def _child_adds_one(buffer):
    copy_and_wait(buffer, buffer + 1)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=GPU_MARKS)])
def test_param_buffer_round_trips_through_a_spawned_process(device):
    buffer = device_param_buffer(5, device)
    assert buffer.dtype == torch.float32 and buffer.shape == (5,)
    assert buffer.device.type == device
    if device == "cpu":
        assert buffer.is_shared()
    copy_and_wait(buffer, torch.arange(5, dtype=torch.float32))
    # The producer (this process) holds `buffer` until the consumer has exited.
    child = tmp.get_context("spawn").Process(target=_child_adds_one, args=(buffer,))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert buffer.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def _child_reads_params(params, copies, device, out):
    # A policy worker's read: into a tensor on its own device, the version with it;
    # on a GPU through the device copy the runner hands it apart from the context.
    with device_copies([params], copies):
        assert (params.on_device is not None) == (device == "cuda")
        flat = torch.zeros(params.flat.shape, device=device)
        version = params.read_if_newer(-1, flat)
    out[0] = version
    out[1:] = flat.cpu()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=GPU_MARKS)])
def test_a_published_version_reaches_another_process_on_its_device(device):
    params = SharedParams(4, device)
    assert (params.on_device is not None) == (device == "cuda")
    weights = torch.tensor([0.5, -1.0, 2.0, 3.5], device=device)
    params.publish(weights, version=7)
    out = torch.zeros(5).share_memory_()
    copies = [params.on_device] if device == "cuda" else None
    child = tmp.get_context("spawn").Process(target=_child_reads_params, args=(params, copies, device, out))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert out.tolist() == [7.0, 0.5, -1.0, 2.0, 3.5]
    # CPU readers (local actors, the evaluator) see the same version through the host copy.
    host = torch.zeros(4)
    assert params.read_if_newer(-1, host) == 7 and torch.equal(host, weights.cpu())


def test_the_device_copy_of_the_weights_stays_out_of_the_pickled_context():
    # Every child gets the shared context; a CUDA tensor in it would start CUDA in each
    # (plumbing/params.py). Without a GPU a CPU tensor stands in for the device copy.
    params = SharedParams(3)
    params.on_device = torch.ones(3)
    copy = pickle.loads(pickle.dumps(params))
    assert copy.on_device is None and params.on_device is not None
    copies = [params.on_device]  # a child's Process argument
    with device_copies([copy], copies):
        assert copy.on_device is params.on_device
    assert copy.on_device is None and copies == []  # let go on leaving, the argument's reference too


class _Row:
    def __init__(self):
        self.added = []

    def add(self, field, seconds):
        self.added.append((field, seconds))


class _FakeEvent:
    """A CUDA event stand-in: `record` stamps the next tick of a shared clock;
    `fired` says whether the fake GPU has reached it."""
    ticks = iter(range(1000))

    def __init__(self):
        self.stamp, self.fired, self.waited = None, False, False

    def record(self, stream):
        self.stamp = next(_FakeEvent.ticks)

    def query(self):
        return self.fired

    def synchronize(self):
        self.waited = self.fired = True

    def elapsed_time(self, end):
        assert end.fired, "reading a span before its end fired would block"
        return float(end.stamp - self.stamp)  # milliseconds, as torch's


def test_the_device_clock_adds_spans_in_order_once_their_end_fired():
    row, events = _Row(), []

    def new_event():
        events.append(_FakeEvent())
        return events[-1]

    clock = DeviceClock(row, new_event, current_stream=lambda: None)
    with clock.span("gpu_s"):
        pass
    start, end = events[-2:]
    other_start, other_end = _FakeEvent(), _FakeEvent()
    other_start.record(None)
    other_end.record(None)
    clock.add_events("h2d_s", other_start, other_end)
    clock.collect()
    assert row.added == []  # nothing has fired: nothing read, nothing waited for
    other_end.fired = True
    clock.collect()
    assert row.added == [], "a later span does not pass an earlier one still running"
    end.fired = True
    clock.collect()
    assert row.added == [("gpu_s", (end.stamp - start.stamp) / 1000), ("h2d_s", 1 / 1000)]
    assert not end.waited and not other_end.waited


def test_the_device_clock_waits_for_its_oldest_span_only_past_its_bound():
    row = _Row()
    clock = DeviceClock(row, _FakeEvent, current_stream=lambda: None)
    for _ in range(MAX_PENDING + 1):
        with clock.span("gpu_s"):
            pass
    assert len(row.added) == 1 and row.added[0][0] == "gpu_s"


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_a_cpu_device_gets_a_clock_that_records_nothing(device):
    row = _Row()
    clock = DeviceClock.for_device(device, row)
    assert isinstance(clock, NullClock)
    with clock.span("gpu_s"):
        clock.add_events("h2d_s", None, None)
    clock.collect()
    assert row.added == []


# -- GPU paths (skipped without a CUDA device) ----------------------------------------

@needs_gpu
def test_the_device_clock_times_kernels_and_the_stager_its_uploads():
    row = _Row()
    clock = DeviceClock.for_device("cuda", row)
    stager = BatchStager.for_device("cuda", clock)
    big = {"frames": torch.ones(64, 3, 72, 128, dtype=torch.uint8)}  # ~1.8 MB, as a small Doom batch
    staged = stager.finish(stager.start(big))
    a = torch.randn(2048, 2048, device="cuda")
    with clock.span("gpu_s"):
        for _ in range(10):
            a = a @ a / 2048
    torch.cuda.synchronize()
    clock.collect()
    fields = dict(row.added)
    assert set(fields) == {"h2d_s", "gpu_s"}, row.added
    assert 0 < fields["h2d_s"] < 1 and 0 < fields["gpu_s"] < 1
    assert torch.equal(staged["frames"].cpu(), big["frames"])


@needs_gpu
def test_staged_batches_equal_their_sources_while_prefetching():
    stager = BatchStager.for_device("cuda")
    assert isinstance(stager, CudaStager)
    sources = [_batch(scale=k + 1) for k in range(4)]
    # The learner's pattern: batch k+1 starts before batch k is used, so every
    # start overwrites pinned buffers an earlier upload read from.
    handle = stager.start(sources[0])
    for k, source in enumerate(sources):
        staged = stager.finish(handle)
        if k + 1 < len(sources):
            handle = stager.start(sources[k + 1])
        for want, have in zip(_leaves(source), _leaves(staged)):
            assert have.is_cuda and have.dtype == want.dtype
            assert torch.equal(have.cpu(), want)


@needs_gpu
def test_pinned_blocks_are_reused_grown_and_keep_the_layout():
    stager = BatchStager.for_device("cuda")
    stager.finish(stager.start(_batch()))
    first = {path: block.data_ptr() for path, block in stager._pinned.items()}
    assert all(block.is_pinned() for block in stager._pinned.values())
    assert set(first) == {("rewards",), ("actions",), ("obs", "image"), ("obs", "measurements")}

    # Same shapes, and fewer rows (a final_obs with fewer truncations): the same blocks.
    stager.finish(stager.start(_batch(scale=2.0)))
    staged = stager.finish(stager.start(_batch(rows=3)))
    assert {path: block.data_ptr() for path, block in stager._pinned.items()} == first
    assert staged["rewards"].shape == (3, 2) and torch.equal(staged["rewards"].cpu(), _batch(rows=3)["rewards"])

    staged = stager.finish(stager.start(_batch(rows=9)))
    assert stager._pinned[("rewards",)].numel() >= 9 * 2 * 4
    assert staged["rewards"].shape == (9, 2) and torch.equal(staged["rewards"].cpu(), _batch(rows=9)["rewards"])

    # A channels-last image (the trajectory buffers' layout) arrives channels-last.
    image = torch.randint(0, 255, (5, 3, 6, 7), dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    staged = stager.finish(stager.start({"obs": {"image": image}}))["obs"]["image"]
    assert staged.stride() == image.stride() and torch.equal(staged.cpu(), image)


def _sharpen(model):
    # The policy head starts with gain 0.01, leaving near-ties between logits that
    # kernel-level rounding differences could flip under argmax; sharpen it so the
    # deterministic actions compare exactly.
    with torch.no_grad():
        model.policy_head.weight.mul_(300.0)
    return model


def _assert_act_close(want, have):
    # Graph and eager runs may pick different GEMM kernels (the graph sees the padded
    # batch), so floats agree to rounding; discrete actions must agree exactly.
    if want.actions.is_floating_point():
        torch.testing.assert_close(have.actions, want.actions, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(want.actions, have.actions)
    for name in ("logp", "values", "rnn_state"):
        torch.testing.assert_close(getattr(have, name), getattr(want, name), rtol=1e-5, atol=1e-5)


@needs_gpu
@pytest.mark.parametrize("action_space", [gym.spaces.MultiDiscrete([4, 4, 3]), gym.spaces.Box(-1, 1, (2,))])
@pytest.mark.parametrize("use_rnn", [False, True])
def test_graphed_policy_equals_eager_when_deterministic(action_space, use_rnn):
    model = _sharpen(_model(action_space, use_rnn, device="cuda"))
    graphed = GraphedPolicy(model, [2, 8, 16], model.layout, model.rnn_state_size, "cuda", deterministic=True)
    for batch in (1, 2, 5, 16, 20):  # padded, exact, and above the largest capture (eager)
        obs, rnn = _inputs(batch, model.rnn_state_size, device="cuda")
        with torch.no_grad():
            want = model.act(obs, rnn, deterministic=True)
        have = graphed(obs, rnn)
        assert have.actions.shape[0] == batch
        _assert_act_close(want, have)


@needs_gpu
def test_graphed_policy_answers_host_inputs_on_the_host_as_eager_does():
    model = _sharpen(_model(device="cuda"))
    graphed = GraphedPolicy(model, [2, 8], model.layout, model.rnn_state_size, "cuda", deterministic=True)
    for batch in (1, 5, 8, 11):  # padded, exact, and above the largest capture (eager)
        obs, rnn = _inputs(batch, model.rnn_state_size)
        with torch.no_grad():
            want = model.act({k: v.cuda() for k, v in obs.items()}, rnn.cuda(), deterministic=True)
        have = _act_on_host(graphed, obs, rnn)
        assert all(value.device.type == "cpu" and value.shape[0] == batch for value in have)
        _assert_act_close(ActOutput(*(value.cpu() for value in want)), have)


@needs_gpu
def test_graph_stays_valid_across_in_place_param_reloads():
    model = _sharpen(_model(device="cuda"))
    other = _sharpen(_model(device="cuda"))
    graphed = GraphedPolicy(model, [4, 8], model.layout, model.rnn_state_size, "cuda", deterministic=True)
    obs, rnn = _inputs(6, device="cuda")
    before = graphed(obs, rnn)

    load_flat_state(model, flat_state(other).cpu())  # the policy worker's reload path
    with torch.no_grad():
        want = other.act(obs, rnn, deterministic=True)
    after = graphed(obs, rnn)
    _assert_act_close(want, after)
    assert not torch.allclose(before.values, after.values)


@needs_gpu
def test_graphed_sampling_draws_fresh_noise_on_every_replay():
    model = _model(gym.spaces.Box(-1, 1, (3,)), device="cuda")
    graphed = GraphedPolicy(model, [8], model.layout, model.rnn_state_size, "cuda", deterministic=False)
    obs, rnn = _inputs(8, device="cuda")
    first, second = graphed(obs, rnn), graphed(obs, rnn)
    assert not torch.equal(first.actions, second.actions)
    torch.testing.assert_close(first.values, second.values)
    # The log-probabilities belong to the actions that were actually drawn: score
    # them with the learner's unroll over one step (plus its bootstrap step).
    with torch.no_grad():
        ev = model.evaluate({"obs": obs["obs"].expand(2, -1, -1)}, rnn, torch.zeros(2, 8, device="cuda"),
                            second.actions.unsqueeze(0))
    torch.testing.assert_close(second.logp, ev.logp[0], rtol=1e-5, atol=1e-5)


class _HostSyncingModel(nn.Module):
    """An act() that reads a value back to the host, which no graph can record."""

    layout = {"obs": ((3,), torch.float32)}
    rnn_state_size = 0

    def act(self, obs, rnn_state, deterministic=False):
        x = obs["obs"]
        scale = 2.0 if x.abs().max().item() > 1.0 else 1.0
        return ActOutput(x[:, :1] * scale, x.sum(1), x.mean(1), rnn_state)


@needs_gpu
def test_host_syncing_act_is_refused_and_the_runner_falls_back_to_eager():
    model = _HostSyncingModel()
    with pytest.raises(GraphCaptureError, match="synchronises with the host"):
        GraphedPolicy(model, [4], model.layout, 0, "cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner = make_policy_runner(model, "cuda", max_batch=4)
    assert isinstance(runner, EagerPolicy)
    assert any("running eagerly" in str(w.message) for w in caught)
    assert torch.cuda.get_sync_debug_mode() == 0  # the probe restored the default


def test_driver_files_of_gone_processes_are_removed_and_others_kept(tmp_path):
    for name in ("cuda.shm.0.29f.1", "cuda.shm.0.29f.2", "cuda.shm.0.2a0.1", "ViZDoomSM29f", "cuda.shm.x"):
        (tmp_path / name).write_bytes(b"\0" * 16)
    removed = remove_driver_files([0x29f], shm_dir=str(tmp_path))
    assert sorted(removed) == ["cuda.shm.0.29f.1", "cuda.shm.0.29f.2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ViZDoomSM29f", "cuda.shm.0.2a0.1", "cuda.shm.x"]
    assert remove_driver_files([0x29f], shm_dir=str(tmp_path / "missing")) == []


@needs_gpu
def test_graphed_bf16_acting_follows_a_weight_reload():
    # bf16 encoders act through weight copies a graph reads by address; the policy
    # copy refreshes them in place after each reload (model.refresh_acting_copies).
    space = gym.spaces.Box(0, 255, (3, 36, 36), np.uint8)
    spec = ModelSpec(use_rnn=True, rnn_size=16, conv_bf16=True)
    model = _sharpen(ActorCritic(space, ACTION_SPACE, spec).cuda().eval())
    other = _sharpen(ActorCritic(space, ACTION_SPACE, spec).cuda().eval())
    graphed = GraphedPolicy(model, [8], model.layout, model.rnn_state_size, "cuda", deterministic=True)
    obs = {"obs": torch.randint(0, 256, (8, 3, 36, 36), dtype=torch.uint8, device="cuda")}
    rnn = torch.zeros(8, 16, device="cuda")
    load_flat_state(model, flat_state(other))
    model.refresh_acting_copies()
    with torch.no_grad():
        want = other.act(obs, rnn, deterministic=True)
    _assert_act_close(want, graphed(obs, rnn))
