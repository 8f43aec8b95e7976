"""A simulated Coral USB Accelerator behind pyusb's backend interface.

``backend.py`` (:class:`SimulatedBackend`, faults), ``stick.py`` (modes,
resets, endpoints), ``control.py`` (control requests), ``usb_errors.py`` (the
errors libusb raises), ``dfu.py``, ``registers.py``, ``descriptors.py`` and
``bulk.py`` (framing, segments, DWN1 streams).  The driver in
:mod:`coralrt._usb` talks to it with ordinary pyusb calls and learns what it
needs beyond pyusb through :class:`coralrt._usb.extension.BackendExtension`.
"""

from __future__ import annotations

from coralrt._sim.stick.backend import FAULT_KINDS, Fault, FaultPlan, SimulatedBackend
from coralrt._sim.stick.device import open_simulated_sticks

__all__ = ["SimulatedBackend", "FaultPlan", "Fault", "FAULT_KINDS", "open_simulated_sticks"]
