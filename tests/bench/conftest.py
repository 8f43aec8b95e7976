"""Benchmark plumbing: each benchmark records its median, and the terminal
summary prints the session/LiteRT ratio that docs and reviews quote."""

from __future__ import annotations

import pytest

_MEDIANS = pytest.StashKey[dict]()

#: The ratio is reported against this goal, not asserted: wall-clock numbers
#: depend on the machine and its load.
RATIO_GOAL = 1.05


def pytest_configure(config) -> None:
    config.stash[_MEDIANS] = {}


@pytest.fixture
def record_median(request):
    """``record_median(key, benchmark)`` after the benchmark has run."""
    medians = request.config.stash[_MEDIANS]

    def record(key: str, benchmark) -> None:
        # Without --benchmark-only/--benchmark-enable (e.g. --benchmark-disable)
        # the function runs once untimed and there are no stats.
        stats = getattr(benchmark, "stats", None)
        if stats is not None:
            medians[key] = stats.stats.median
    return record


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's table
def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    medians = config.stash.get(_MEDIANS, {})
    if "litert" in medians and "session" in medians:
        ratio = medians["session"] / medians["litert"]
        terminalreporter.write_sep("-", "coralrt overhead")
        terminalreporter.write_line(
            f"median litert {medians['litert'] * 1e3:.3f} ms, session "
            f"{medians['session'] * 1e3:.3f} ms")
        terminalreporter.write_line(
            f"ratio session/litert (median): {ratio:.3f} (goal <= {RATIO_GOAL})")
