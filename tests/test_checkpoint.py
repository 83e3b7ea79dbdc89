"""Checkpoint atomicity, verification, fallback and pruning, and files that could run code."""

import datetime
import hashlib
import io
import os
import shutil
import warnings
from collections import OrderedDict

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import MarkerPayload, forge_checkpoint

from fastrl.algo.model import build_model
from fastrl.config import config_from_saved
from fastrl.learning import checkpoint as ckpt
from fastrl.learning.checkpoint import (
    CheckpointError,
    RefusedCheckpointError,
    UnsafeTorchError,
    load_checkpoint,
    load_latest_checkpoint,
    save_best,
    save_checkpoint,
)

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def _state(step):
    return {"model": {"w": torch.full((3, 2), float(step))}, "step": step, "meta": {"lr": 1e-3}}


def _names(directory):
    return sorted(os.listdir(directory))


def test_round_trip(tmp_path):
    path = save_checkpoint(str(tmp_path), _state(7), name_step=7, keep=3)
    assert os.path.basename(path) == "checkpoint_000000000007.pt"
    state = load_checkpoint(path)
    assert torch.equal(state["model"]["w"], torch.full((3, 2), 7.0))
    assert state["step"] == 7 and state["meta"] == {"lr": 1e-3}
    assert load_latest_checkpoint(str(tmp_path))[1] == path


def test_keep_k_pruning_never_deletes_the_new_file(tmp_path):
    for step in (100, 200, 300, 400):
        save_checkpoint(str(tmp_path), _state(step), step, keep=2)
    assert _names(tmp_path) == ["checkpoint_000000000300.pt", "checkpoint_000000000400.pt"]

    # A restarted run writing a lower step number must still keep what it wrote.
    save_checkpoint(str(tmp_path), _state(5), 5, keep=2)
    assert _names(tmp_path) == ["checkpoint_000000000005.pt", "checkpoint_000000000400.pt"]
    save_checkpoint(str(tmp_path), _state(6), 6, keep=1)
    assert _names(tmp_path) == ["checkpoint_000000000006.pt"]


@pytest.mark.parametrize("damage", ["truncate", "bit_flip"])
def test_damaged_newest_is_skipped_with_warning(tmp_path, damage):
    good = save_checkpoint(str(tmp_path), _state(1), 1, keep=5)
    bad = save_checkpoint(str(tmp_path), _state(2), 2, keep=5)
    data = bytearray(open(bad, "rb").read())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) - 40] ^= 0x10
    with open(bad, "wb") as f:
        f.write(data)

    with pytest.raises(CheckpointError, match="truncated" if damage == "truncate" else "SHA-256"):
        load_checkpoint(bad)
    with pytest.warns(RuntimeWarning, match="checkpoint_000000000002.pt"):
        state, path = load_latest_checkpoint(str(tmp_path))
    assert path == good and state["step"] == 1


def test_a_damaged_newer_checkpoint_does_not_outlive_the_good_ones(tmp_path):
    for step in (1, 2, 3, 9):
        save_checkpoint(str(tmp_path), _state(step), step, keep=4)
    with open(tmp_path / "checkpoint_000000000009.pt", "r+b") as fh:
        fh.truncate(100)
    # A resume takes the newest good checkpoint...
    with pytest.warns(RuntimeWarning, match=r"checkpoint_000000000009.pt is truncated: .*; "
                                            r"using the older checkpoint_000000000003.pt"):
        state, _ = load_latest_checkpoint(str(tmp_path))
    assert state["step"] == 3
    # ...and the run numbers on upwards from it. Its first save deletes the damaged
    # file, which as the highest number would otherwise hold a slot for good while
    # the good checkpoints rotated out beside it.
    save_checkpoint(str(tmp_path), _state(4), 4, keep=2)
    assert _names(tmp_path) == ["checkpoint_000000000003.pt", "checkpoint_000000000004.pt"]
    for step in (5, 6):
        save_checkpoint(str(tmp_path), _state(step), step, keep=2)
    assert _names(tmp_path) == ["checkpoint_000000000005.pt", "checkpoint_000000000006.pt"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing left to skip
        assert load_latest_checkpoint(str(tmp_path))[0]["step"] == 6


def test_a_damaged_checkpoint_among_good_ones_takes_no_slot(tmp_path, monkeypatch):
    for step in (1, 2, 3):
        save_checkpoint(str(tmp_path), _state(step), step, keep=3)
    with open(tmp_path / "checkpoint_000000000002.pt", "r+b") as fh:
        fh.truncate(100)
    save_checkpoint(str(tmp_path), _state(4), 4, keep=3)
    assert _names(tmp_path) == ["checkpoint_000000000001.pt", "checkpoint_000000000003.pt",
                                "checkpoint_000000000004.pt"]
    # Telling them apart costs no reading in a run that wrote its own files: each
    # process verifies a file once, and knows the ones it wrote.
    reads = []
    monkeypatch.setattr(ckpt, "_verified_payload", lambda path: reads.append(path))
    for step in (5, 6, 7):
        save_checkpoint(str(tmp_path), _state(step), step, keep=3)
    assert reads == []


def test_when_every_checkpoint_is_damaged_loading_the_latest_is_an_error(tmp_path):
    for path in [save_checkpoint(str(tmp_path), _state(step), step, keep=5) for step in (1, 2)]:
        with open(path, "r+b") as fh:
            fh.truncate(100)
    # Not (None, None), which a resume would take as a fresh start.
    with pytest.raises(CheckpointError, match=r"checkpoint_000000000002.pt is truncated: .*, "
                                              r"and the 1 older one\(s\) beside it are damaged too"):
        load_latest_checkpoint(str(tmp_path))
    os.unlink(tmp_path / "checkpoint_000000000001.pt")
    with pytest.raises(CheckpointError, match="checkpoint_000000000002.pt is truncated: .*, and there is no older one"):
        load_latest_checkpoint(str(tmp_path))


def test_a_folder_named_like_a_checkpoint_is_left_alone(tmp_path):
    (tmp_path / "checkpoint_000000000009.pt").mkdir()
    path = save_checkpoint(str(tmp_path), _state(1), 1, keep=1)
    assert _names(tmp_path) == ["checkpoint_000000000001.pt", "checkpoint_000000000009.pt"]
    assert load_latest_checkpoint(str(tmp_path))[1] == path


def test_load_errors_name_the_file(tmp_path):
    missing = str(tmp_path / "nope.pt")
    with pytest.raises(CheckpointError, match="nope.pt does not exist"):
        load_checkpoint(missing)
    foreign = tmp_path / "foreign.pt"
    torch.save({"a": 1}, foreign)
    with pytest.raises(CheckpointError, match="foreign.pt is not a fastrl checkpoint"):
        load_checkpoint(str(foreign))
    (tmp_path / "tiny.pt").write_bytes(b"FRL")
    with pytest.raises(CheckpointError, match="tiny.pt is truncated"):
        load_checkpoint(str(tmp_path / "tiny.pt"))
    assert load_latest_checkpoint(str(tmp_path / "absent")) == (None, None)


def test_a_header_claiming_a_huge_payload_is_damaged_not_a_memory_error(tmp_path):
    old = save_checkpoint(str(tmp_path), _state(1), 1, keep=5)
    new = save_checkpoint(str(tmp_path), _state(2), 2, keep=5)
    with open(new, "r+b") as fh:
        magic, _, digest = ckpt._HEADER.unpack(fh.read(ckpt._HEADER.size))
        fh.seek(0)
        fh.write(ckpt._HEADER.pack(magic, 2**62, digest))
    with pytest.raises(CheckpointError, match=r"checkpoint_000000000002.pt is truncated: its header promises "
                                              r"4611686018427387904 payload bytes, the file holds \d+"):
        load_checkpoint(new)
    with pytest.warns(RuntimeWarning, match="Skipping unusable checkpoint"):
        assert load_latest_checkpoint(str(tmp_path))[1] == old  # skipped as damaged, like any other


def test_a_checkpoint_that_cannot_be_read_is_neither_kept_as_good_nor_deleted(tmp_path, monkeypatch):
    # EACCES or EIO says nothing about the file: it may be whole once the disk or its owner allows.
    paths = [save_checkpoint(str(tmp_path), _state(step), step, keep=2) for step in (1, 2)]
    ckpt._verified.clear()  # as a new process sees them
    real_open = open

    def refusing(path, *args, **kwargs):
        if path == paths[1]:
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(ckpt, "open", refusing, raising=False)
    with pytest.raises(ckpt.UnreadableCheckpointError, match="cannot be opened: Permission denied"):
        load_checkpoint(paths[1])
    save_checkpoint(str(tmp_path), _state(3), 3, keep=2)
    # Step 2 takes no slot (step 1 is kept as the good one) and is not deleted.
    assert _names(tmp_path) == ["checkpoint_000000000001.pt", "checkpoint_000000000002.pt",
                                "checkpoint_000000000003.pt"]


@pytest.mark.parametrize("failing", ["torch.save", "os.fsync"])
def test_failure_mid_save_leaves_no_temp_file(tmp_path, monkeypatch, failing):
    previous = save_checkpoint(str(tmp_path), _state(1), 1, keep=1)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    if failing == "torch.save":
        monkeypatch.setattr(ckpt.torch, "save", boom)
    else:
        monkeypatch.setattr(ckpt.os, "fsync", boom)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(str(tmp_path), _state(2), 2, keep=1)
    monkeypatch.undo()

    assert _names(tmp_path) == [os.path.basename(previous)]
    assert load_latest_checkpoint(str(tmp_path))[0]["step"] == 1


@pytest.mark.parametrize("version", ["2.5.1+cpu", "2.4.0"])
def test_no_checkpoint_is_opened_under_a_torch_whose_weights_only_loading_can_run_code(tmp_path, monkeypatch,
                                                                                      version):
    path = save_checkpoint(str(tmp_path), _state(1), 1, keep=1)
    monkeypatch.setattr(ckpt.torch, "__version__", version)
    sentence = (f"torch {version} can run code hidden in a checkpoint as it loads it (fixed in torch 2.6), so "
                "fastrl opens no checkpoint with it; pip install 'torch>=2.6'.")
    with pytest.raises(UnsafeTorchError) as raised:
        load_checkpoint(path)
    assert str(raised.value) == sentence
    with pytest.raises(UnsafeTorchError):  # not taken for damage, which would fall back to an older file
        load_latest_checkpoint(str(tmp_path))
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1


def test_stale_temp_file_from_killed_writer_is_removed(tmp_path):
    (tmp_path / ".tmp_abc.partial").write_bytes(b"half a checkpoint")
    save_checkpoint(str(tmp_path), _state(1), 1, keep=1)
    assert _names(tmp_path) == ["checkpoint_000000000001.pt"]


def test_save_best_records_score(tmp_path):
    path = save_best(str(tmp_path), _state(3), score=12.5)
    assert os.path.basename(path) == "best.pt"
    state = load_checkpoint(path)
    assert state["best_score"] == 12.5 and state["step"] == 3
    assert load_latest_checkpoint(str(tmp_path)) == (None, None)  # best.pt is not a resume point


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(str(tmp_path), _state(1), 1, keep=0)
    with pytest.raises(TypeError, match="must be a dict"):
        save_checkpoint(str(tmp_path), [1, 2], 1, keep=1)


# -- files that could run code ----------------------------------------------------------------

def test_a_checkpoint_that_would_run_code_is_refused_and_the_code_does_not_run(tmp_path):
    marker = tmp_path / "code_ran"
    good = save_checkpoint(str(tmp_path / "ckpt"), _state(1), 1, keep=5)
    forged = str(tmp_path / "ckpt" / "checkpoint_000000000002.pt")
    payload = forge_checkpoint(forged, {**_state(2), "extra": MarkerPayload(marker)})
    # The payload is live: the loader fastrl used before would have run it.
    torch.load(io.BytesIO(payload), weights_only=False)
    assert marker.exists()
    marker.unlink()

    with pytest.raises(RefusedCheckpointError, match=r"checkpoint_000000000002.pt holds more than tensors and "
                                                     r"plain data \(it needs exec\), so loading it could run code"):
        load_checkpoint(forged)
    # A resume does not skip it for the good one before it: someone put it there, and
    # the user is told rather than trained past it.
    with pytest.raises(RefusedCheckpointError, match="checkpoint_000000000002.pt"):
        load_latest_checkpoint(str(tmp_path / "ckpt"))
    assert not marker.exists()
    assert load_checkpoint(good)["step"] == 1


def test_an_intact_payload_that_is_not_a_state_dict_is_refused(tmp_path):
    forge_checkpoint(tmp_path / "list.pt", [torch.zeros(2)])
    with pytest.raises(RefusedCheckpointError, match="list.pt holds a list, not the dict a checkpoint is"):
        load_checkpoint(str(tmp_path / "list.pt"))
    with open(tmp_path / "noise.pt", "wb") as fh:  # checksummed bytes that are no pickle at all
        noise = b"not a pickle" * 10
        fh.write(ckpt._HEADER.pack(ckpt.MAGIC, len(noise), hashlib.sha256(noise).digest()) + noise)
    with pytest.raises(RefusedCheckpointError, match="noise.pt is intact but does not load as tensors and plain data"):
        load_checkpoint(str(tmp_path / "noise.pt"))


def test_numpy_scalars_are_saved_as_python_numbers(tmp_path):
    model = torch.nn.Linear(2, 2).state_dict()
    state = {"model": model, "score": np.float32(0.5), "steps": np.int64(3), "flags": (np.bool_(True), [np.float64(2)])}
    state = load_checkpoint(save_checkpoint(str(tmp_path), state, 1, keep=1))
    assert state["score"] == 0.5 and type(state["score"]) is float
    assert state["steps"] == 3 and type(state["steps"]) is int
    assert state["flags"] == (True, [2.0]) and type(state["flags"][0]) is bool and type(state["flags"][1][0]) is float
    # The model's state_dict comes back as it went in, its version metadata included.
    assert type(state["model"]) is OrderedDict and state["model"]._metadata == model._metadata


def test_a_value_that_is_not_plain_data_is_refused_when_saving(tmp_path):
    with pytest.raises(TypeError, match=r"Checkpoint value state\['meta'\]\['when'\] is a datetime.date"):
        save_checkpoint(str(tmp_path), {**_state(1), "meta": {"when": datetime.date(2026, 1, 1)}},
                        1, keep=1)
    with pytest.raises(TypeError, match="Checkpoint key"):
        save_best(str(tmp_path), {"model": {("a", "tuple"): torch.zeros(1)}}, score=1.0)
    assert os.listdir(tmp_path) == []  # refused before anything was written


@pytest.mark.parametrize("commit, name", [("a8bffe5", "checkpoint_000000000027.pt"), ("191d9f1", "best.pt")])
def test_checkpoints_of_earlier_versions_load(tmp_path, commit, name):
    """Files written by fastrl at `commit` (tests/data/README.md says how): the first
    release's learner checkpoint and the first evaluator's best.pt. They load as plain
    data and still fit the model and optimizer this version builds from their config."""
    path = str(tmp_path / name)
    shutil.copy(os.path.join(DATA, commit, name), path)
    state = load_checkpoint(path)
    assert state["env"] == "CartPole-v1"
    cfg = config_from_saved(state["config"])
    env = gym.make("CartPole-v1")
    model = build_model(cfg, env.observation_space, env.action_space)
    model.load_state_dict(state["model"])
    if "optimizer" in state:
        torch.optim.Adam(model.parameters()).load_state_dict(state["optimizer"])
        with torch.random.fork_rng(devices=[]):  # the other tests keep their generator
            torch.set_rng_state(state["torch_rng"])
    else:
        assert state["best_score"] == state["eval_return"]
