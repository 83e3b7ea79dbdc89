"""Shared buffers, parameters and the stats board really cross spawned processes."""
import torch
import torch.multiprocessing as tmp

from fastrl.plumbing.buffers import COPY_PER_BUFFER_BYTES, TrajectoryBuffers
from fastrl.plumbing.params import SharedParams, StopFlag
from fastrl.plumbing.stats_board import StatsBoard

LAYOUT = {"obs": ((3, 4, 5), torch.uint8), "measurements": ((2,), torch.float32)}


def _make_buffers(n=3):
    return TrajectoryBuffers(num_buffers=n, rollout=4, envs_per_split=2, obs_layout=LAYOUT,
                             action_dim=2, action_dtype=torch.int64, rnn_size=3)


def _child_writes(buffers, params, board, buf):
    # Written through numpy views, as the rollout worker does.
    buffers.obs["obs"].numpy()[buf, 2, 1] = 7
    buffers.obs["measurements"][buf, 4] = torch.tensor([1.5, -2.0])
    buffers.actions[buf, 3, 0] = torch.tensor([4, 5])
    buffers.truncated.numpy()[buf, 1, 1] = True
    buffers.rnn_state0[buf] = 0.25
    flat = torch.empty_like(params.flat)
    version = params.read_if_newer(-1, flat)
    buffers.rewards[buf, 0, 0] = float(flat.sum()) + version
    row = board.row("rollout_0")
    row.add("env_frames", 123)
    row.beat()


def test_buffers_params_and_board_round_trip_through_a_spawned_process():
    ctx = tmp.get_context("spawn")
    buffers = _make_buffers()
    params = SharedParams(5)
    params.publish(torch.arange(5, dtype=torch.float32), version=9)
    board = StatsBoard(["runner", "rollout_0"])
    p = ctx.Process(target=_child_writes, args=(buffers, params, board, 1))
    p.start()
    p.join(60)
    assert p.exitcode == 0

    assert int(buffers.obs["obs"][1, 2, 1].sum()) == 7 * 60
    assert buffers.obs["obs"][1, 2].is_contiguous(memory_format=torch.channels_last)
    assert buffers.obs["obs"][0].sum() == 0 and buffers.obs["obs"][2].sum() == 0
    assert buffers.obs["measurements"][1, 4, 0].tolist() == [1.5, -2.0]
    assert buffers.actions[1, 3, 0].tolist() == [4, 5]
    assert buffers.truncated[1, 1, 1] and buffers.truncated.sum() == 1
    assert torch.all(buffers.rnn_state0[1] == 0.25)
    assert buffers.rewards[1, 0, 0] == 10 + 9  # the child saw the published params and version
    assert board.total("env_frames", "rollout_") == 123
    assert board.get("rollout_0", "heartbeat") > 0


def test_gather_makes_a_time_major_copy():
    buffers = _make_buffers(n=4)
    for b in range(4):
        buffers.rewards[b] = b * 100 + torch.arange(4).view(4, 1) * 10 + torch.arange(2)
        buffers.rnn_state0[b] = b
    batch = buffers.gather([3, 1])
    # columns: buffer 3's envs then buffer 1's; rows: time
    assert batch["rewards"].shape == (4, 4)
    assert batch["rewards"][2].tolist() == [320, 321, 120, 121]
    assert batch["obs"]["obs"].shape == (5, 4, 3, 4, 5)
    assert batch["rnn_state0"][:, 0].tolist() == [3, 3, 1, 1]
    batch["rewards"].zero_()
    assert buffers.rewards[3, 2, 0] == 320  # a copy: freeing the buffer cannot change the batch


def test_images_are_stored_and_gathered_channels_last():
    buffers = _make_buffers(n=4)
    image = torch.randint(0, 256, (3, 4, 5), dtype=torch.uint8)
    buffers.obs["obs"].numpy()[1, 2, 0] = image.numpy()  # as the rollout worker writes
    assert buffers.obs["obs"][1].flatten(0, 1).is_contiguous(memory_format=torch.channels_last)
    batch = buffers.gather([3, 1])
    frames = batch["obs"]["obs"].flatten(0, 1)  # what the encoder sees
    assert frames.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(batch["obs"]["obs"][2, 2], image)


def test_large_buffers_are_gathered_buffer_by_buffer_into_the_same_batch():
    # Doom-sized frames take gather's copy per buffer (past COPY_PER_BUFFER_BYTES), the
    # rewards its index_select: both must come out as the buffers side by side in time.
    layout = {"obs": ((3, 72, 128), torch.uint8)}
    buffers = TrajectoryBuffers(5, 4, 4, layout, 1, torch.int64, 2)
    assert buffers.obs["obs"].stride(0) >= COPY_PER_BUFFER_BYTES > buffers.rewards.stride(0) * 4
    buffers.obs["obs"].copy_(torch.randint(0, 256, buffers.obs["obs"].shape, dtype=torch.uint8))
    buffers.rewards.copy_(torch.randn(buffers.rewards.shape))
    batch = buffers.gather([4, 0, 2])
    for key, got in (("obs", batch["obs"]["obs"]), ("rewards", batch["rewards"])):
        source = buffers.obs["obs"] if key == "obs" else buffers.rewards
        assert torch.equal(got, torch.cat([source[4], source[0], source[2]], dim=1)), key
    assert batch["obs"]["obs"].flatten(0, 1).is_contiguous(memory_format=torch.channels_last)


def test_gather_copies_only_the_truncated_steps_final_obs():
    buffers = _make_buffers(n=4)
    buffers.truncated[3, 2, 1] = True  # batch column 1 (buffer 3 comes first)
    buffers.final_obs["obs"][3, 2, 1] = 9
    buffers.truncated[1, 0, 0] = True  # batch column 2
    buffers.final_obs["obs"][1, 0, 0] = 4
    buffers.final_obs["obs"][0] = 1  # a buffer not gathered
    batch = buffers.gather([3, 1])
    assert batch["final_obs"]["obs"].shape == (2, 3, 4, 5)
    assert batch["final_obs"]["measurements"].shape == (2, 2)
    rows = batch["final_row"]
    assert rows.shape == (4, 4) and int((rows >= 0).sum()) == 2
    assert batch["final_obs"]["obs"][rows[2, 1]].unique().tolist() == [9]
    assert batch["final_obs"]["obs"][rows[0, 2]].unique().tolist() == [4]


def test_params_reader_skips_the_copy_when_the_version_did_not_move():
    params = SharedParams(3)
    params.publish(torch.ones(3), version=4)
    out = torch.zeros(3)
    assert params.read_if_newer(4, out) == 4 and out.sum() == 0
    assert params.read_if_newer(3, out) == 4 and out.sum() == 3


def _hammer_publish(params, rounds):
    for v in range(1, rounds + 1):
        params.publish(torch.full((params.flat.numel(),), float(v)), version=v)


def test_readers_never_see_a_torn_parameter_copy():
    # A writer publishing constant vectors as fast as it can: every copy a reader
    # accepts must be one constant, and its version must be that constant.
    ctx = tmp.get_context("spawn")
    params = SharedParams(200_000)
    writer = ctx.Process(target=_hammer_publish, args=(params, 300))
    writer.start()
    out, version, checked = torch.empty(200_000), -1, 0
    while writer.is_alive() or version < 300:
        new = params.read_if_newer(version, out)
        if new != version:
            version = new
            assert out.min() == out.max() == float(version)
            checked += 1
        if not writer.is_alive() and params.version == version:
            break
    writer.join(30)
    assert writer.exitcode == 0 and checked > 1


def test_stop_flag_crosses_processes():
    flag = StopFlag()
    p = tmp.get_context("spawn").Process(target=flag.set)
    p.start()
    p.join(30)
    assert flag.is_set() and flag.wait(0.01)
