"""Simulated sticks for tests: timing-only sticks for throughput benchmarks
(:func:`timing_sticks`), and sticks for tests that exercise the USB driver's DWN1 path.

The simulated Edge TPU refuses edgetpu_compiler programs: it cannot execute
Google's instructions.  Tests of the driver's DWN1 handling (framing, DMA
hints, parameter caching, transcript checks against the hints) opt in with
:func:`dwn1_backend` or :func:`accept_dwn1`, which turn on the backend's
test mode and tell it the DWN1 packages it may see (by default those of every
compiled model in ``shared/models/edgetpu``).  The sticks then answer those
programs request by request, with placeholder output bytes computed from the
inputs (coralrt/_sim/stick/dwn1_requests.py), which are NOT the program's
outputs.  Never use it to "run" a compiled model.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from coralrt.testing import LatencyModel, SimulatedBackend
from coralrt import open_device

__all__ = ["dwn1_backend", "accept_dwn1", "isolated_dirs", "program", "DWN1_MODEL",
           "timing_sticks", "packages_of", "shared_packages"]

#: A compiled model whose DWN1 program the driver tests send to simulated sticks.
DWN1_MODEL = "edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite"
#: Where the shared test models are (as in tests/conftest.py; subprocesses import
#: this module without conftest).
MODELS_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "models"


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

    from coralrt import load_model
    model = load_model(shared_model(DWN1_MODEL))
    return next(op.custom_options for op in model.main.operators
                if op.name == "edgetpu-custom-op")


def packages_of(model) -> list[bytes]:
    """The DWN1 packages (``custom_options``) of every edgetpu-custom-op of ``model``
    (a path or the bytes of a .tflite file)."""
    from coralrt import load_model
    loaded = load_model(model)
    return [bytes(op.custom_options) for g in loaded.subgraphs for op in g.operators
            if op.name == "edgetpu-custom-op"]


@functools.lru_cache(maxsize=1)
def shared_packages() -> tuple[bytes, ...]:
    """The DWN1 packages of every compiled model in ``shared/models/edgetpu`` (none when
    the folder is absent)."""
    folder = MODELS_DIR / "edgetpu"
    if not folder.is_dir():
        return ()
    return tuple(p for path in sorted(folder.glob("*_edgetpu.tflite"))
                 for p in packages_of(path))


def accept_dwn1(backend: SimulatedBackend, programs=None) -> SimulatedBackend:
    """Turn on ``backend``'s test mode for DWN1 programs; return it.

    ``programs``: the DWN1 packages its sticks may see (``custom_options`` bytes, or
    paths of compiled .tflite files, every edgetpu-custom-op of which is taken);
    None: those of every shared compiled model (:func:`shared_packages`).
    """
    if programs is None:
        programs = shared_packages()
    for item in programs:
        for package in (packages_of(item) if isinstance(item, (str, Path)) else [item]):
            backend.know_dwn1(package)
    backend._accept_dwn1_for_tests = True
    return backend


def dwn1_backend(programs=None, **kwargs) -> SimulatedBackend:
    """A :class:`SimulatedBackend` (``firmware_loaded=True`` and, for checks of the
    transcript from its start, ``transcript_limit=None`` unless given) in test mode
    for the DWN1 ``programs`` (see :func:`accept_dwn1`)."""
    kwargs.setdefault("firmware_loaded", True)
    kwargs.setdefault("transcript_limit", None)
    return accept_dwn1(SimulatedBackend(**kwargs), programs)


def timing_sticks(n: int) -> list:
    """``n`` opened timing-only simulated sticks on one bus (a benchmark switch: each
    segment run waits the latency model's estimate and answers zeros)."""
    backend = SimulatedBackend(n_devices=n, firmware_loaded=True, latency=LatencyModel(),
                               timing_only=True, lock_scope="process")
    return [open_device(f"usb:{i}", backend=backend) for i in range(n)]
