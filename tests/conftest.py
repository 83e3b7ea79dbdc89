"""What every test runs inside."""
import pytest


@pytest.fixture(autouse=True, scope="session")
def own_cache(tmp_path_factory):
    """The suite's own ~/.cache (XDG_CACHE_HOME) and benchmark records folder, for it
    and every run it starts.

    A run keeps what it measured of the machine there (the planner's profile, the
    precision choice, the compiled step's timings) for the next run of the same
    setup. Timed inside the suite, beside its other work and on tests' short budgets,
    those steered a user's later runs: a benchmark run against Sample Factory planned
    from a doom_battle profile a test had written, its env step timed at 1,313 us
    (500-750 us alone). A clean machine (CI) starts with an empty cache anyway.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        # And its own folder for benchmark records (benchmarks/records.py): a benchmark a
        # test runs end to end must not add a line to the repository's results.
        patch.setenv("FASTRL_BENCHMARK_RESULTS", str(tmp_path_factory.mktemp("benchmark_results")))
        yield
