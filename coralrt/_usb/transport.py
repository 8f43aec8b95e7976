"""Timed USB transfers on one device and the translation of pyusb errors.

Every transfer goes through :class:`Transport`, which gives it a timeout
(6 s by default, libedgetpu's ``usb_timeout_millis``) and turns whatever
pyusb or the operating system raises into a :mod:`coralrt.errors` device
error with :func:`translate_error`.
"""

from __future__ import annotations

import array
import errno as _errno
import logging

import usb.core

from coralrt.errors import (
    DeviceBusyError, DeviceError, DeviceLostError, DeviceNotFoundError, DevicePermissionError,
    DeviceTimeoutError,
)
from coralrt._usb import constants as C

__all__ = ["Transport", "translate_error", "PERMISSION_HINT"]

log = logging.getLogger("coralrt.usb")

PERMISSION_HINT = (
    "install the udev rule shipped with coralrt (sudo cp udev/99-coralrt.rules "
    "/etc/udev/rules.d/ && sudo udevadm control --reload-rules && sudo udevadm trigger), "
    "add your user to the plugdev group (sudo usermod -aG plugdev $USER, then log in "
    "again) and replug the stick")

# libusb error codes, for backends that set error_code but no errno.
#: libusb error code -> errno (libusb.h's LIBUSB_ERROR_* values).
LIBUSB_ERRNO = {-1: _errno.EIO, -2: _errno.EINVAL, -3: _errno.EACCES, -4: _errno.ENODEV,
                 -5: _errno.ENOENT, -6: _errno.EBUSY, -7: _errno.ETIMEDOUT,
                 -8: _errno.EOVERFLOW, -9: _errno.EPIPE, -10: _errno.EINTR}


def _errno_of(exc: BaseException) -> int | None:
    if isinstance(exc, usb.core.USBTimeoutError):
        return _errno.ETIMEDOUT
    code = getattr(exc, "errno", None)
    if code:
        return code
    return LIBUSB_ERRNO.get(getattr(exc, "backend_error_code", None))


def translate_error(exc: BaseException, what: str, *, path: str | None = None,
                    timeout: float | None = None) -> DeviceError:
    """The coralrt error for ``exc``, raised while doing ``what`` on device ``path``.

    usb.core.USBTimeoutError and ETIMEDOUT give DeviceTimeoutError; EACCES/EPERM
    DevicePermissionError (naming the udev rule and the plugdev group); EBUSY
    DeviceBusyError; ENODEV/ENXIO/ESHUTDOWN DeviceLostError; EPIPE (a stalled
    endpoint) a DeviceError with errno EPIPE; NoBackendError DeviceNotFoundError
    (no libusb); anything else a DeviceError.  Device errors pass through.
    """
    if isinstance(exc, DeviceError):
        return exc
    where = f"{path}: " if path else ""
    if isinstance(exc, usb.core.NoBackendError):
        return DeviceNotFoundError(
            f"{where}{what}: no libusb backend is available ({exc}); install the "
            f"libusb-package Python package or the system libusb-1.0 library", path=path)
    code = _errno_of(exc)
    detail = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    if code == _errno.ETIMEDOUT:
        limit = f" after {timeout:g} s" if timeout is not None else ""
        return DeviceTimeoutError(
            f"{where}{what} timed out{limit}; the stick stopped answering. Close it and "
            f"open it again; if that fails, unplug and replug it", errno=code, path=path,
            timeout=timeout)
    if code in (_errno.EACCES, _errno.EPERM):
        return DevicePermissionError(
            f"{where}{what}: permission denied by the operating system; {PERMISSION_HINT}",
            errno=code, path=path)
    if code == _errno.EBUSY:
        return DeviceBusyError(
            f"{where}{what}: the stick is in use (another process or a kernel driver has "
            f"claimed it); close the other program and try again", errno=code, path=path)
    if code in (_errno.ENODEV, _errno.ENXIO, _errno.ESHUTDOWN, _errno.ENOENT):
        return DeviceLostError(
            f"{where}{what}: the stick left the bus ({detail}); check the cable, replug it "
            f"and open it again", errno=code, path=path)
    if code == _errno.EPIPE:
        return DeviceError(
            f"{where}{what}: the endpoint stalled (the stick refused the transfer); close "
            f"the device and open it again, which resets it", errno=code, path=path)
    return DeviceError(f"{where}{what} failed: {detail}", errno=code, path=path)


class Transport:
    """Control, register and bulk transfers on an opened pyusb device, all timed."""

    def __init__(self, dev, *, timeout: float = C.DEFAULT_TIMEOUT, path: str | None = None):
        self.dev = dev
        self.path = path
        self.timeout = float(timeout)
        self.timeout_ms = max(1, int(round(self.timeout * 1000)))

    def _fail(self, exc: BaseException, what: str, timeout: float | None = None) -> DeviceError:
        return translate_error(exc, what, path=self.path,
                               timeout=self.timeout if timeout is None else timeout)

    # -- control ------------------------------------------------------------------------
    def ctrl_in(self, request_type: int, request: int, value: int, index: int, length: int,
                what: str) -> bytes:
        try:
            data = self.dev.ctrl_transfer(request_type, request, value, index, length,
                                          self.timeout_ms)
        except (usb.core.USBError, OSError, usb.core.NoBackendError) as e:
            raise self._fail(e, what) from e
        return bytes(data)

    def ctrl_out(self, request_type: int, request: int, value: int, index: int, data,
                 what: str) -> int:
        try:
            return self.dev.ctrl_transfer(request_type, request, value, index, data,
                                          self.timeout_ms)
        except (usb.core.USBError, OSError, usb.core.NoBackendError) as e:
            raise self._fail(e, what) from e

    def read_register(self, offset: int) -> int:
        width = C.register_width(offset)
        req = C.REQ_REG32 if width == 4 else C.REQ_REG64
        data = self.ctrl_in(C.REQ_TYPE_READ, req, offset & 0xFFFF, offset >> 16, width,
                            f"reading register {offset:#x}")
        if len(data) != width:
            raise DeviceError(f"{self.path or 'device'}: register {offset:#x} read returned "
                              f"{len(data)} bytes, not {width}", path=self.path)
        return int.from_bytes(data, "little")

    def write_register(self, offset: int, value: int) -> None:
        width = C.register_width(offset)
        req = C.REQ_REG32 if width == 4 else C.REQ_REG64
        self.ctrl_out(C.REQ_TYPE_WRITE, req, offset & 0xFFFF, offset >> 16,
                      int(value).to_bytes(width, "little"),
                      f"writing {value:#x} to register {offset:#x}")

    # -- bulk ---------------------------------------------------------------------------
    def bulk_write(self, endpoint: int, data: array.array, what: str) -> None:
        """Write ``data`` (an ``array.array('B')``, so pyusb does not copy it) in one transfer."""
        try:
            n = self.dev.write(endpoint, data, self.timeout_ms)
        except (usb.core.USBError, OSError) as e:
            raise self._fail(e, what) from e
        if n != len(data):
            raise DeviceError(f"{self.path or 'device'}: {what}: the stick took {n} of "
                              f"{len(data)} bytes", path=self.path)

    def bulk_read(self, endpoint: int, size: int, what: str,
                  timeout: float | None = None) -> array.array:
        ms = self.timeout_ms if timeout is None else max(1, int(round(timeout * 1000)))
        try:
            return self.dev.read(endpoint, size, ms)
        except (usb.core.USBError, OSError) as e:
            raise self._fail(e, what, timeout) from e

    def bulk_read_into(self, endpoint: int, buffer: array.array, what: str) -> int:
        """Read into ``buffer`` (an ``array.array('B')``); the number of bytes received."""
        try:
            return self.dev.read(endpoint, buffer, self.timeout_ms)
        except (usb.core.USBError, OSError) as e:
            raise self._fail(e, what) from e
