"""The start-up timeline (fastrl/plumbing/timeline.py): written only when asked for;
and the launch time every "seconds from launch" counts from."""
import subprocess
import sys
import time

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


def test_a_process_knows_when_it_was_launched_to_within_the_clock_tick():
    # psutil's create_time reads the boot time in whole seconds and was 0.82 s
    # early on the project's machine; every "seconds from launch" counts from this.
    before = time.time()
    out = subprocess.run([sys.executable, "-c", "from fastrl.plumbing.proc import launched_at; print(launched_at())"],
                         capture_output=True, text=True, check=True).stdout
    after = time.time()
    launched = float(out)
    assert before - 0.02 <= launched <= after  # the kernel counts process starts in 10 ms ticks
    assert launched - before < 0.5  # the start itself, not the interpreter's imports
