"""DriftWatch: each warning fires once when its condition starts, again only after it cleared."""
from fastrl.learning.drift import EV_NEGATIVE_REPORTS, KL_TOO_LARGE_REPORTS, DriftWatch


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
