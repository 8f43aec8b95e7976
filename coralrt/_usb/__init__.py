"""The Coral USB Accelerator driver over pyusb.

``open_device(path=None, backend=None)`` finds a stick (``usb:N`` or a port
path), loads its firmware if needed, brings the chip up and returns an open
:class:`UsbEdgeTpu`; ``list_devices()`` lists sticks in both modes.  This
package is the real driver only: it knows a pyusb backend through pyusb's
interface plus the optional :class:`~coralrt._usb.extension.BackendExtension`,
and nothing of the simulated stick (:mod:`coralrt._sim.stick`) that the tests
run it against.  ``driver.py`` has :class:`UsbEdgeTpu` (open, reset, close,
programs) and ``exchange.py`` what one run sends and reads; ``discovery.py``,
``dfu.py``, ``firmware.py``, ``bringup.py``, ``transport.py``, ``framing.py``,
``handles.py``, ``transforms.py``, ``lock.py``, ``extension.py``, ``udev.py``
and ``constants.py`` the rest.  See docs/usb.md.
"""

from __future__ import annotations

import logging

from coralrt._usb.discovery import DeviceInfo, list_devices
from coralrt._usb.driver import UsbEdgeTpu, open_device

__all__ = ["open_device", "list_devices", "count_attached", "UsbEdgeTpu", "DeviceInfo"]


def count_attached() -> int | None:
    """How many sticks are attached; None when USB cannot be listed here (no
    libusb, no permission to enumerate), which is for opening a stick to report."""
    try:
        return len(list_devices())
    except Exception as e:  # noqa: BLE001 - see the docstring
        logging.getLogger("coralrt.usb").debug("listing USB devices failed: %s", e)
        return None
