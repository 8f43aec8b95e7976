"""The Coral USB Accelerator driver over pyusb.

``open_device(path=None, backend=None)`` finds a stick (``usb:N`` or a port
path), loads its firmware if needed, brings the chip up and returns an open
:class:`UsbEdgeTpu`; ``list_devices()`` lists sticks in both modes.  The
package also holds DWN1 executable parsing (:mod:`coralrt.usb.dwn1`) and a
simulated stick behind pyusb's backend interface (:mod:`coralrt.usb.sim`)
that the tests run the same driver code against.  See docs/usb.md.
"""

from __future__ import annotations

from coralrt.usb.discovery import DeviceInfo, list_devices
from coralrt.usb.driver import UsbEdgeTpu, open_device

__all__ = ["open_device", "list_devices", "UsbEdgeTpu", "DeviceInfo"]
