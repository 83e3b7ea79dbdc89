"""DriftWatch: each warning fires once when its condition starts, again only after it cleared."""
import math

import pytest

from fastrl.learning.drift import EV_NEGATIVE_REPORTS, KL_TOO_LARGE_REPORTS, DriftWatch, gaussian_std


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
