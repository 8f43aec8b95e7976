"""The ``sim`` device kind: a simulated stick driven by the real USB driver.

``target="sim"`` and ``coralrt bench --target sim`` both get their device
from :func:`simulated_stick`, so what is measured is what users run.
"""

from __future__ import annotations

from coralrt.sim.latency import LatencyModel
from coralrt.sim.stick.backend import SimulatedBackend
from coralrt.usb.driver import UsbEdgeTpu

__all__ = ["simulated_stick"]


def simulated_stick(kernels: dict | None = None, *, usb: str = "usb3") -> UsbEdgeTpu:
    """An unopened simulated Coral USB Accelerator behind :class:`UsbEdgeTpu`.

    pyusb calls reach :class:`SimulatedBackend`, which executes coralrt
    segments with the simulated Edge TPU's kernels (plus ``kernels``, the
    integer kernel factories plugins add) and reports the latency model's
    estimate for a stick on ``usb`` ("usb3" or "usb2") without waiting for
    it.  Each call makes a new stick, so state (LSTM) starts fresh as in a new
    interpreter; the stick is private to the process and takes no
    cross-process lock.
    """
    backend = SimulatedBackend(firmware_loaded=True, latency=LatencyModel(usb=usb),
                               time_scale=0.0, transcript_limit=256, lock_scope="process",
                               kernels=kernels)
    return UsbEdgeTpu(None, backend)
