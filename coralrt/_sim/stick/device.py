"""The ``sim`` device kind: a simulated stick driven by the real USB driver.

``target="sim"`` and ``coralrt bench --target sim`` both get their device
from :func:`simulated_stick`, so what is measured is what users run.
"""

from __future__ import annotations

from coralrt._sim.latency import LatencyModel
from coralrt._sim.stick.backend import SimulatedBackend
from coralrt._usb.driver import UsbEdgeTpu

__all__ = ["SimulatedStick", "simulated_stick", "open_simulated_sticks"]


class SimulatedStick(UsbEdgeTpu):
    """The real driver over a :class:`SimulatedBackend`: a device of kind ``sim``."""

    kind = "sim"

    @property
    def label(self) -> str:
        return f"simulated {self.path}"


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
    return SimulatedStick(None, backend)


def open_simulated_sticks(n: int = 1, *, usb: str = "usb3") -> list[UsbEdgeTpu]:
    """``n`` opened simulated sticks on one simulated USB bus (``usb:0`` ...), to pass
    as ``device=`` (one, or the list) with ``target="sim"``: the way to run code
    written for several real sticks, or for one stick shared by several
    sessions, without hardware.

    Their firmware is loaded, and each Edge TPU run waits the latency model's
    estimate for a stick on ``usb``, as a real one would take.  The sticks are
    private to this process.  Close them when done: sessions leave open devices
    they were given open.
    """
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive number of sticks, not {n!r}")
    bus = SimulatedBackend(n_devices=n, firmware_loaded=True, latency=LatencyModel(usb=usb),
                           lock_scope="process")
    sticks: list[UsbEdgeTpu] = []
    try:
        for i in range(n):
            stick = SimulatedStick(f"usb:{i}", bus)
            stick.open()
            sticks.append(stick)
    except BaseException:
        for stick in sticks:
            stick.close()
        raise
    return sticks
