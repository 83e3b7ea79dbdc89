"""The start-up timeline (fastrl/plumbing/timeline.py): written only when asked for."""
from fastrl.plumbing import timeline


def test_marks_are_written_in_order_only_when_asked_for(tmp_path, monkeypatch):
    path = tmp_path / "timeline.tsv"
    monkeypatch.delenv(timeline.ENV_VAR, raising=False)
    timeline.mark("unasked")
    assert not path.exists()
    monkeypatch.setenv(timeline.ENV_VAR, str(path))
    timeline.mark("first")
    timeline.mark("second: with a colon and\ttab")
    marks = timeline.read(str(path))
    assert [event for _, _, event in marks] == ["first", "second: with a colon and\ttab"]
    assert marks[0][0] <= marks[1][0] and marks[0][1] > 0


def test_an_unwritable_timeline_does_not_stop_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv(timeline.ENV_VAR, str(tmp_path / "missing" / "timeline.tsv"))
    timeline.mark("nowhere")  # no error
