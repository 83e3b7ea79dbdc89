"""write_json: a file is replaced whole or not at all."""
import json

import pytest

from fastrl.plumbing.files import write_json


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    path = tmp_path / "summary.json"
    write_json(str(path), {"fps": 1.0}, indent=2)
    assert json.loads(path.read_text()) == {"fps": 1.0}
    with pytest.raises(TypeError):
        write_json(str(path), {"fps": object()})  # fails halfway through the dump
    assert json.loads(path.read_text()) == {"fps": 1.0}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]
