"""benchmarks/vs_sample_factory.py: the steady-state window, and a run named as still
starting when its window holds its start-up."""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import vs_sample_factory as vs  # noqa: E402  (benchmarks/ is not a package)


def test_a_steady_run_has_equal_halves_and_is_not_named():
    # 10,000 frames/s from 20 s on, a report every 5 s.
    points = [(t, 10_000 * (t - 10), 8_000 * (t - 10)) for t in range(20, 55, 5)]
    r = vs.rates({"points": points}, skip=20)
    assert r["window"] == (20, 50)
    assert r["stepped_window_fps"] == 10_000
    assert r["window_halves_fps"] == (10_000, 10_000)
    assert not vs.still_starting(r["window_halves_fps"])


def test_a_run_whose_frames_start_late_in_its_window_is_named():
    # The H200's Sample Factory run: reports from 31.7 s, frames only from 44.3 s.
    points = [(31.7, 0, 0), (34.3, 0, 0), (39.3, 0, 0), (44.3, 21_344, 0), (49.3, 65_440, 208_896)]
    r = vs.rates({"points": points}, skip=20)
    first, second = r["window_halves_fps"]
    assert first == 0  # split at 39.3 s, the report nearest the window's middle (40.5 s)
    assert abs(second - 65_440 / 10) < 1e-6
    assert vs.still_starting(r["window_halves_fps"])


def test_halves_need_a_report_inside_the_window():
    assert vs.window_halves([(20, 0, 0), (30, 100, 0)]) is None
    # Sample Factory prints its first reports in one instant: no half may be empty.
    assert vs.window_halves([(31.7, 0, 0), (31.7, 0, 0), (49.3, 65_440, 0)]) is None
    assert not vs.still_starting(None)
    # A 1.4x second half is within the margin, 1.6x is not.
    assert not vs.still_starting((10.0, 14.0))
    assert vs.still_starting((10.0, 16.0))
