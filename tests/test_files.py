"""write_json: a file is replaced whole or not at all. cannot_write: whether a path
can be written, found out without leaving anything behind."""
import json
import os

import pytest

from fastrl.plumbing.files import cannot_write, write_json


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "summary.json"
    write_json(str(path), {"fps": 1.0}, indent=2)
    assert json.loads(path.read_text()) == {"fps": 1.0}
    with pytest.raises(TypeError):
        write_json(str(path), {"fps": object()})  # fails halfway through the dump
    assert json.loads(path.read_text()) == {"fps": 1.0}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_cannot_write_tries_for_real_and_leaves_nothing(tmp_path):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "a_folder").mkdir()
    before = sorted(os.listdir(tmp_path))
    # Writable: folders to be made, a file in a folder to be made, a file to replace.
    assert cannot_write(str(tmp_path / "new" / "deeper"), folder=True) is None
    assert cannot_write(str(tmp_path / "new" / "out.png")) is None
    assert cannot_write(str(tmp_path / "a_file")) is None
    # Not: a file in the way of a folder, at any depth, and a folder where a file goes.
    assert cannot_write(str(tmp_path / "a_file"), folder=True) == f"{tmp_path / 'a_file'} is not a folder"
    assert cannot_write(str(tmp_path / "a_file" / "x" / "y.json")) == f"{tmp_path / 'a_file'} is not a folder"
    assert cannot_write(str(tmp_path / "a_folder")) == f"{tmp_path / 'a_folder'} is a folder"
    assert sorted(os.listdir(tmp_path)) == before  # the probes made nothing that stayed
    assert (tmp_path / "a_file").read_text() == "x"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_cannot_write_in_proc_even_as_root():
    # os.access says root may write /proc; creating anything there fails all the same.
    assert cannot_write("/proc/fastrl-probe", folder=True) is not None
    assert cannot_write("/proc/curves.png") is not None
