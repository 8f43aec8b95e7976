"""Tests that need a real Coral USB Accelerator: skipped unless ``CORALRT_HARDWARE=1``.

With a stick plugged in (and the udev rule and firmware installed, see
docs/hardware-validation.md)::

    CORALRT_HARDWARE=1 make test

The test models come from ``CORALRT_HARDWARE_MODELS`` (a folder) when it is
set, otherwise they are downloaded (pinned SHA-256) into the user cache
folder.  ``CORALRT_HARDWARE_REPORT=FILE`` also writes the self-test's JSON
report there, to attach to an issue.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENABLED = os.environ.get("CORALRT_HARDWARE", "").strip() == "1"
SKIP_REASON = ("needs a Coral USB Accelerator: set CORALRT_HARDWARE=1 to run the hardware "
               "tests (docs/hardware-validation.md)")
HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    # This hook sees every collected test: touch only the ones in this folder.
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.hardware)
            if not ENABLED:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def selftest_report():
    """The self-test, run once on the first stick found."""
    from coralrt.errors import DeviceNotFoundError
    from coralrt._selftest import run_selftest

    models = os.environ.get("CORALRT_HARDWARE_MODELS")
    try:
        report = run_selftest(models_dir=Path(models) if models else None,
                              download=not models, repeat=10)
    except DeviceNotFoundError as e:
        pytest.fail(f"CORALRT_HARDWARE=1 but {e}")
    out = os.environ.get("CORALRT_HARDWARE_REPORT")
    if out:
        import json
        Path(out).write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    return report
