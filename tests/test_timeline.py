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


def test_the_process_server_starts_before_torch_is_imported():
    # fastrl.train starts the process server right after the config checks so that
    # the server's import of torch (~1.3 s) runs on the other core while the runner
    # imports its own. One module on that path importing torch at its top (ranks.py
    # did) made the two imports run one after the other: CartPole's first batch
    # came ~0.7 s later, doom_battle's children ~0.8 s later.
    code = ("import sys\n"
            "from fastrl.config import check_env_and_options, parse_args\n"
            "from fastrl.plumbing.ranks import claim_cores, detect_rank\n"
            "from fastrl.plumbing.proc import start_process_server\n"
            "cfg, _ = parse_args(['--env', 'CartPole-v1'])\n"
            "check_env_and_options(cfg, writes=False)\n"
            "claim_cores(detect_rank())\n"
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
