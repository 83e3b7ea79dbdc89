"""DriftWatch: each warning fires once when its condition starts, again only after it
cleared; a real run says it on its console."""
import math
import re
import signal

import pytest
from helpers import TEST_ENVS_ON_PATH, TrainRun

from fastrl.learning.drift import (
    EV_NEGATIVE_REPORTS,
    KL_TOO_LARGE_REPORTS,
    RETURN_FALL_REPORTS,
    DriftWatch,
    gaussian_std,
)


def test_entropy_collapse_warns_once_then_again_after_recovering():
    watch = DriftWatch()
    assert watch.check({"entropy": 1.0}) == []
    assert watch.check({"entropy": 0.5}) == []
    first = watch.check({"entropy": 0.05})
    assert len(first) == 1 and "entropy fell to 0.05" in first[0] and "peak 1" in first[0]
    assert watch.check({"entropy": 0.04}) == []  # still collapsed: no repeat
    assert watch.check({"entropy": 0.5}) == []  # recovered
    assert len(watch.check({"entropy": 0.01})) == 1


def _kl_warning(watch) -> str:
    """The warning a KL that stays large brings, after the reports it must stay for."""
    for _ in range(KL_TOO_LARGE_REPORTS - 1):
        assert watch.check({"approx_kl": 0.5}) == []
    (warning,) = watch.check({"approx_kl": 0.5})
    return warning


def test_a_kl_spike_is_not_a_drift_but_a_kl_that_stays_large_is():
    watch = DriftWatch()
    for _ in range(5):  # a learning run's single spikes, one report each
        assert watch.check({"approx_kl": 0.2}) == [] and watch.check({"approx_kl": 0.02}) == []
    assert "--lr" in _kl_warning(watch)
    assert watch.check({"approx_kl": 0.5}) == []  # still large: no repeat


def test_large_kl_and_a_useless_value_function():
    watch = DriftWatch()
    assert "--lr" in _kl_warning(watch)
    for _ in range(EV_NEGATIVE_REPORTS - 1):
        assert watch.check({"explained_variance": -0.3}) == []
    assert "explained variance" in watch.check({"explained_variance": -0.3})[0]
    assert watch.check({"explained_variance": float("nan")}) == []


def test_quiet_when_metrics_are_missing_or_healthy():
    watch = DriftWatch()
    assert watch.check({}) == []
    assert watch.check({"entropy": 1.0, "approx_kl": 0.01, "explained_variance": 0.7}) == []


def test_no_entropy_warning_under_the_kl_to_uniform_term():
    # Its pull does not fade with the entropy, so a low entropy is its balance
    # with the return (doom_basic solved), not a collapse; the other checks stay.
    watch = DriftWatch("symmetric_kl")
    assert watch.check({"entropy": 1.8}) == []
    assert watch.check({"entropy": 0.05}) == []
    assert watch.check({"entropy": 0.05}) == []
    assert "--lr" in _kl_warning(watch)


def test_a_gaussians_collapse_is_judged_on_its_std_not_on_a_fraction_of_its_entropy():
    dims = 3  # Hopper's
    entropy_at = {std: dims * (0.5 * math.log(2 * math.pi * math.e) + math.log(std)) for std in (1.0, 0.25, 0.05)}
    assert gaussian_std(entropy_at[0.25], dims) == pytest.approx(0.25)
    # A std of 0.25 is a healthy policy's, but its entropy is under 10% of the entropy
    # at std 1, which the discrete rule calls a collapse.
    discrete_rule = DriftWatch()
    discrete_rule.check({"entropy": entropy_at[1.0]})
    assert len(discrete_rule.check({"entropy": entropy_at[0.25]})) == 1
    watch = DriftWatch(gaussian_dims=dims)
    assert watch.check({"entropy": entropy_at[1.0]}) == []
    assert watch.check({"entropy": entropy_at[0.25]}) == []
    (warning,) = watch.check({"entropy": entropy_at[0.05]})  # negative entropy: the std still reads right
    assert "noise fell to a std of 0.05, under 10% of its peak 1:" in warning
    assert "--entropy_coef" in warning and "symmetric_kl" not in warning  # which continuous actions refuse


def window(mean: float, spread: float = 10.0) -> list:
    """100 episodes' returns with this mean and standard deviation."""
    return [mean - spread, mean + spread] * 50


def _fall_warnings(watch, means, spread: float = 10.0) -> list:
    """Every warning the watch gave while the 100-episode mean went through `means`."""
    return [w for m in means for w in watch.check({}, window(m, spread))]


def test_a_return_that_gives_back_its_rise_for_several_reports_is_unlearning():
    watch = DriftWatch(gaussian_dims=3)
    rise = [100.0, 1_000.0, 2_875.0]
    # 20% of the rise given back for many reports, and 60% for one report fewer than needed, are noise.
    assert _fall_warnings(watch, rise + [2_320.0] * 20 + [1_362.0] * (RETURN_FALL_REPORTS - 1) + [2_800.0]) == []
    (warning,) = _fall_warnings(watch, [1_362.0] * (RETURN_FALL_REPORTS + 3))  # said once
    assert warning.startswith("the 100-episode mean return fell to 1,362, giving back 55% of its rise to its best "
                              "2,875: the policy is unlearning;"), warning
    # A constant rate, no KL brake: the advice names the schedule that kept Hopper-v5 within 12% of its best
    # over a 10-minute budget.
    assert "--lr_schedule linear with a --train_for_env_frames or --train_for_seconds budget" in warning
    assert "--target_kl 0.01" in warning
    # Swinging about the fallen level is the same fall; a fall from a new best is a new one.
    assert _fall_warnings(watch, [2_700.0] + [0.0] * RETURN_FALL_REPORTS + [2_700.0] + [1_000.0] * 10) == []
    assert len(_fall_warnings(watch, [3_000.0] + [1_000.0] * RETURN_FALL_REPORTS)) == 1


def test_the_fall_advice_follows_the_runs_schedule_and_kl_brake():
    watch = DriftWatch(lr_schedule="linear", target_kl=0.01)
    (warning,) = _fall_warnings(watch, [-1_000.0, -200.0] + [-800.0] * RETURN_FALL_REPORTS)
    assert "fell to -800, giving back 75% of its rise to its best -200" in warning
    # A run that has a KL brake is not sent to tighten it: on Hopper-v5 that did not stop the falls.
    assert warning.endswith("try a smaller --lr; --eval_every_frames keeps the best policy it sees in "
                            "checkpoints/best.pt"), warning
    # A run with an evaluator has its best policy kept already, and is told where.
    evaluated = DriftWatch(lr_schedule="linear", target_kl=0.01, evaluating=True)
    (warning,) = _fall_warnings(evaluated, [-1_000.0, -200.0] + [-800.0] * RETURN_FALL_REPORTS)
    assert warning.endswith("try a smaller --lr; the best evaluated policy stays in checkpoints/best.pt"), warning


def test_a_fall_within_the_windows_noise_is_not_one():
    # A resumed run on its plateau: its rise from the first full window is small beside
    # its episodes' spread (300: a mean's standard error of 30), so a dip of 40 is noise.
    watch = DriftWatch()
    assert _fall_warnings(watch, [2_800.0, 2_900.0] + [2_860.0] * 20, spread=300.0) == []
    assert len(_fall_warnings(watch, [2_700.0] * RETURN_FALL_REPORTS, spread=300.0)) == 1


def test_no_fall_is_judged_before_a_full_window_or_without_a_rise():
    watch = DriftWatch()
    assert watch.check({}, None) == [] and watch.check({}, [float("nan")] * 100) == []
    assert _fall_warnings(watch, [50.0, 40.0, 30.0] + [20.0] * 10) == []  # never rose above its first window


def test_a_run_whose_return_falls_back_says_so_with_its_advice(tmp_path):
    # fading_env's return climbs to 1 over seconds and then pays nothing, whatever the policy does.
    run = TrainRun(["--env", "fading_env:Fading-v0", "--train_dir", str(tmp_path), "--status_every_seconds", "0.5",
                    "--num_workers", "1", "--num_envs_per_worker", "8", "--train_for_seconds", "120"],
                   env=TEST_ENVS_ON_PATH)
    try:
        line = run.wait_for_line(lambda text: "warning: the 100-episode mean return fell" in text, timeout=90)
        run.signal_group(signal.SIGINT)
        assert run.wait(timeout=30) == 128 + signal.SIGINT, run.output()
    finally:
        run.kill_all()
    # Its first full window had already climbed a little, so 0 gives back over 100% of the rise.
    assert re.search(r"fell to 0, giving back 1\d\d% of its rise to its best 1: the policy is unlearning; "
                     r"try --lr_schedule linear", line), line
    assert run.lines.count(line) == 1
