"""Simulated sticks for tests that exercise the USB driver's DWN1 path.

The simulated Edge TPU refuses edgetpu_compiler programs: it cannot execute
Google's instructions.  Tests of the driver's DWN1 handling (framing, DMA
hints, parameter caching, transcript checks against the hints) opt in with
:func:`dwn1_backend`, which turns on the backend's test-only switch: raw
streams are then recorded and answered with zero bytes, which are NOT the
program's outputs.  Never use it to "run" a compiled model.
"""

from __future__ import annotations

from coralrt.sim.stick import SimulatedBackend

__all__ = ["dwn1_backend", "accept_dwn1"]


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
