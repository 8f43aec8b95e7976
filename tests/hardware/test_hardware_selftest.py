"""The self-test's checks on a real Coral USB Accelerator, as pytest assertions.

Skipped unless ``CORALRT_HARDWARE=1`` (see conftest.py).  No test here has
been run on a real stick by this project.
"""

from __future__ import annotations

import pytest

TRANSPORT = ("enumeration", "re-enumeration", "bring-up", "register-readback", "usb-speed")
# Sane bounds, far from what a healthy stick shows (MobileNet v1: a few ms warm).
FIRST_RUN_MAX_MS = 10_000.0
WARM_MAX_MS = 1_000.0


def _check(report, name):
    found = [c for c in report.checks if c.name == name]
    assert found, f"no check {name!r} in {[c.name for c in report.checks]}"
    return found[0]


def _describe(c) -> str:
    return f"{c.name}: {c.status}: {c.summary}"


def test_it_is_a_real_stick(selftest_report):
    assert not selftest_report.simulated


@pytest.mark.parametrize("name", TRANSPORT)
def test_transport_check_ok(selftest_report, name):
    c = _check(selftest_report, name)
    assert c.status == "ok", _describe(c)


def test_firmware_download_ok_or_already_running(selftest_report):
    c = _check(selftest_report, "firmware-download")
    assert c.status in ("ok", "skipped"), _describe(c)
    if c.status == "ok":
        assert c.measurements["google_image"], "the downloaded image is not Google's"


def test_register_readback_matches_the_trace(selftest_report):
    c = _check(selftest_report, "register-readback")
    assert c.measurements["registers"], "no register was compared"
    assert all(r["equal"] for r in c.measurements["registers"]), c.measurements["registers"]


def test_usb_speed_is_usb2_or_usb3(selftest_report):
    c = _check(selftest_report, "usb-speed")
    assert c.measurements["speed"] in ("usb2", "usb3"), _describe(c)


def test_parameter_caching(selftest_report):
    c = _check(selftest_report, "parameter-caching")
    assert c.status == "ok", _describe(c)
    assert c.measurements["first_run_upload_ms"] > 0
    assert c.measurements["warm_run_upload_ms"] == 0


def test_models_run_with_sane_latency(selftest_report):
    models = [c for c in selftest_report.checks if c.name.startswith("model:")]
    assert models
    for c in models:
        assert c.status == "ok", _describe(c)
        m = c.measurements
        assert 0 < m["first_run_ms"] < FIRST_RUN_MAX_MS, m
        assert 0 < m["warm_median_ms"] < WARM_MAX_MS, m
        assert m["warm_median_ms"] <= m["first_run_ms"], m
        assert m["repeat"] == 10


def test_outputs_equal_libedgetpu_when_installed(selftest_report):
    probe = _check(selftest_report, "libedgetpu")
    if probe.status != "ok":
        pytest.skip(f"libedgetpu comparison not possible: {probe.summary}")
    compared = [c for c in selftest_report.checks if c.name.startswith("libedgetpu:")]
    if not compared:
        c = _check(selftest_report, "libedgetpu-comparison")
        pytest.skip(f"libedgetpu comparison not possible: {c.summary}")
    for c in compared:
        assert c.status == "ok", _describe(c)
        assert c.measurements["bit_exact"]


def test_no_check_failed(selftest_report):
    failed = [_describe(c) for c in selftest_report.checks if c.status == "fail"]
    assert not failed, "\n".join(failed)
