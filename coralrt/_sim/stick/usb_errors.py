"""The exceptions a simulated stick raises: those of pyusb's libusb1 backend.

:func:`usb_error` builds the ``usb.core.USBError`` (``USBTimeoutError`` for
ETIMEDOUT) that libusb would give for an errno value, with libusb's error code
and message, so the driver's error translation sees what it sees with real
sticks.
"""

from __future__ import annotations

import errno

import usb.core

from coralrt._usb.transport import LIBUSB_ERRNO

__all__ = ["usb_error"]

_LIBUSB_CODE = {e: code for code, e in LIBUSB_ERRNO.items()}   # errno -> libusb code
_LIBUSB_TEXT = {  # errno -> the message libusb gives
    errno.ETIMEDOUT: "Operation timed out",
    errno.EPIPE: "Pipe error",
    errno.ENODEV: "No such device (it may have been disconnected)",
    errno.EBUSY: "Resource busy",
    errno.ENOENT: "Entity not found",
    errno.EOVERFLOW: "Overflow",
    errno.EINVAL: "Invalid parameter",
    errno.EIO: "Input/Output Error",
}


def usb_error(code: int, detail: str = "") -> usb.core.USBError:
    """The exception pyusb's libusb1 backend raises for ``code`` (an errno value)."""
    lib, text = _LIBUSB_CODE[code], _LIBUSB_TEXT[code]
    cls = usb.core.USBTimeoutError if code == errno.ETIMEDOUT else usb.core.USBError
    return cls(f"{text} [simulated: {detail}]" if detail else text, lib, code)
