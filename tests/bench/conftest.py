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
def record_value(request):
    """``record_value(label, seconds)``: a figure that is not a benchmark median."""
    medians = request.config.stash[_MEDIANS]

    def record(label: str, seconds: float) -> None:
        medians[label] = seconds
    return record


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


# (numerator, denominator, label, goal text): ratios printed when both ran.
RATIOS = [
    ("session", "litert", "ratio session/litert (median)", f"goal <= {RATIO_GOAL}"),
    ("compile_cold", "session_cache_hit", "ratio cold compile / cache-hit session creation",
     "goal >= 10"),
    ("sim", "litert_reference", "ratio sim / LiteRT BUILTIN_REF (median)", "goal < 1"),
    ("sim", "litert_default", "ratio sim / LiteRT default kernels (median)", "for reference"),
]


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's table
def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    medians = config.stash.get(_MEDIANS, {})
    shown = [r for r in RATIOS if r[0] in medians and r[1] in medians]
    if not shown and not medians:
        return
    terminalreporter.write_sep("-", "coralrt figures")
    for key, value in sorted(medians.items()):
        terminalreporter.write_line(f"median {key}: {value * 1e3:.3f} ms")
    for num, den, label, goal in shown:
        terminalreporter.write_line(f"{label}: {medians[num] / medians[den]:.3f} ({goal})")
