"""Shared buffers, parameters and the stats board really cross spawned processes, and a run
whose shared memory cannot fit /dev/shm is refused before it starts."""
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import torch
import torch.multiprocessing as tmp
from helpers import REPO, read_summary

from fastrl.plumbing import shm_space
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


@pytest.mark.parametrize("layout, action_dim, action_dtype, rnn_size", [
    (LAYOUT, 2, torch.int64, 3),
    ({"obs": ((3, 72, 128), torch.uint8), "action_mask": ((6,), torch.bool)}, 1, torch.int64, 512),
    ({"obs": ((17,), torch.float32)}, 6, torch.float32, 0),
])
def test_the_bytes_a_run_needs_are_the_bytes_its_buffers_take(layout, action_dim, action_dtype, rnn_size):
    # The /dev/shm check counts without allocating; the buffers it stands for must agree to the byte.
    args = dict(num_buffers=3, rollout=5, envs_per_split=4, obs_layout=layout, action_dim=action_dim,
                action_dtype=action_dtype, rnn_size=rnn_size)
    assert TrajectoryBuffers.bytes_needed(**args) == TrajectoryBuffers(**args).nbytes()


def test_a_shortfall_says_what_is_needed_and_how_to_give_it():
    need = shm_space.SharedMemoryNeed(buffers=100 << 20, envs=16, per_env=10 << 20, weights=4 << 20)
    assert shm_space.shortfall(need, free=1 << 30) == ""
    assert shm_space.shortfall(need, free=None) == ""  # no /dev/shm to look at: nothing to refuse
    assert shm_space.shortfall(need, free=64 << 20) == (
        "This run needs about 280 MB of shared memory (/dev/shm: 100 MB of trajectory buffers and 16 envs at "
        "10.0 MB each) but /dev/shm has 64 MB free; give it more (in a container, docker run --shm-size=1g) or run "
        "fewer envs (--num_workers, --num_envs_per_worker).")


def _in_a_small_dev_shm(args: list) -> subprocess.CompletedProcess:
    """`python -m fastrl.train args` with a 64 MB /dev/shm of its own, as a container's default:
    a private mount namespace, so the machine's /dev/shm is untouched."""
    command = " ".join(["exec", shlex.quote(sys.executable), "-m", "fastrl.train", *map(shlex.quote, args)])
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           f"mount -t tmpfs -o size=64m tmpfs /dev/shm && {command}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


needs_a_mount_namespace = pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("unshare") is None or not sys.platform.startswith("linux"),
    reason="a private 64 MB /dev/shm takes root, Linux and unshare(1)")


@needs_a_mount_namespace
def test_a_doom_run_that_cannot_fit_a_small_dev_shm_is_refused_in_one_sentence(tmp_path):
    pytest.importorskip("vizdoom")
    refused = _in_a_small_dev_shm(["--env", "doom_basic", "--train_dir", str(tmp_path), "--plan", "off",
                                   "--precision", "fp32", "--num_workers", "2", "--num_envs_per_worker", "8"])
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(
        r"fastrl: error: This run needs about [\d,]+ MB of shared memory \(/dev/shm: [\d,]+ MB of trajectory "
        r"buffers and 16 envs at [\d.]+ MB each\) but /dev/shm has \d+ MB free; give it more \(in a container, "
        r"docker run --shm-size=\d+g\) or run fewer envs \(--num_workers, --num_envs_per_worker\)\.", lines[0]), lines
    assert not os.path.exists(tmp_path / "doom_basic" / "checkpoints")


@needs_a_mount_namespace
def test_a_small_run_in_a_small_dev_shm_trains(tmp_path):
    done = _in_a_small_dev_shm(["--env", "CartPole-v1", "--train_dir", str(tmp_path), "--plan", "off",
                                "--train_for_env_frames", "3000", "--num_workers", "1"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert read_summary(tmp_path, "CartPole-v1")["env_frames"] >= 3000
