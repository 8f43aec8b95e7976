"""Simulated sticks for tests: timing-only sticks for throughput benchmarks
(:func:`timing_sticks`), and sticks for tests that exercise the USB driver's DWN1 path.

The simulated Edge TPU refuses edgetpu_compiler programs: it cannot execute
Google's instructions.  Tests of the driver's DWN1 handling (framing, DMA
hints, parameter caching, transcript checks against the hints) opt in with
:func:`dwn1_backend`, which turns on the backend's test-only switch: raw
streams are then recorded and answered with zero bytes, which are NOT the
program's outputs.  Never use it to "run" a compiled model.
"""

from __future__ import annotations

import pytest

from coralrt.sim.latency import LatencyModel
from coralrt.sim.stick import SimulatedBackend
from coralrt.usb import open_device

__all__ = ["dwn1_backend", "accept_dwn1", "isolated_dirs", "program", "DWN1_MODEL",
           "timing_sticks"]

#: A compiled model whose DWN1 program the driver tests send to simulated sticks.
DWN1_MODEL = "edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite"


@pytest.fixture(autouse=True)
def isolated_dirs(tmp_path, monkeypatch):
    """Runtime files (locks, claims) and installed firmware in the test's own folders.
    Autouse in every module that imports it."""
    monkeypatch.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


@pytest.fixture(scope="module")
def program():
    """The DWN1 program (the edgetpu-custom-op's options) of :data:`DWN1_MODEL`."""
    from conftest import shared_model      # here: subprocesses import this module too

    from coralrt.model import load_model
    model = load_model(shared_model(DWN1_MODEL))
    return next(op.custom_options for op in model.main.operators
                if op.name == "edgetpu-custom-op")


def accept_dwn1(backend: SimulatedBackend) -> SimulatedBackend:
    """Turn on ``backend``'s test-only switch that lets DWN1 streams through; return it."""
    backend._accept_dwn1_for_tests = True
    return backend


def dwn1_backend(**kwargs) -> SimulatedBackend:
    """A :class:`SimulatedBackend` (``firmware_loaded=True`` and, for checks of the
    transcript from its start, ``transcript_limit=None`` unless given) that accepts
    DWN1 programs for driver tests."""
    kwargs.setdefault("firmware_loaded", True)
    kwargs.setdefault("transcript_limit", None)
    return accept_dwn1(SimulatedBackend(**kwargs))


def timing_sticks(n: int) -> list:
    """``n`` opened timing-only simulated sticks on one bus (a benchmark switch: each
    segment run waits the latency model's estimate and answers zeros)."""
    backend = SimulatedBackend(n_devices=n, firmware_loaded=True, latency=LatencyModel(),
                               timing_only=True, lock_scope="process")
    return [open_device(f"usb:{i}", backend=backend) for i in range(n)]
