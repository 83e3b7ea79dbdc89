"""Checkpoint atomicity, verification, fallback and pruning."""

import os

import pytest
import torch

from fastrl.learning import checkpoint as ckpt
from fastrl.learning.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_latest_checkpoint,
    save_best,
    save_checkpoint,
)


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
