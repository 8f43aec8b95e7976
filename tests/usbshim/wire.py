"""The usbshim wire format, and how backend errors become libusb codes and
transfer statuses (README.md: "Wire format", "How calls are served")."""

from __future__ import annotations

import errno
import struct

import usb.core

REQUEST = struct.Struct("<IQ8q")        # after the u32 length: op, id, args[8]
REPLY = struct.Struct("<IIQiiii")       # length, kind, id, result, actual, error, spare
KIND_REPLY, KIND_COMPLETION = 1, 2

(OP_HELLO, OP_DEVICE_LIST, OP_OPEN, OP_CLOSE, OP_SET_CONFIGURATION, OP_GET_CONFIGURATION,
 OP_CLAIM, OP_RELEASE, OP_SET_ALT, OP_CLEAR_HALT, OP_RESET, OP_KERNEL_DRIVER_ACTIVE,
 OP_DETACH_KERNEL_DRIVER, OP_ATTACH_KERNEL_DRIVER, OP_CONTROL, OP_SUBMIT,
 OP_CANCEL) = range(1, 18)

#: The libusb function each request serves (the "call" of the server's log lines).
CALLS = {
    OP_HELLO: "libusb_init", OP_DEVICE_LIST: "libusb_get_device_list",
    OP_OPEN: "libusb_open", OP_CLOSE: "libusb_close",
    OP_SET_CONFIGURATION: "libusb_set_configuration",
    OP_GET_CONFIGURATION: "libusb_get_configuration",
    OP_CLAIM: "libusb_claim_interface", OP_RELEASE: "libusb_release_interface",
    OP_SET_ALT: "libusb_set_interface_alt_setting", OP_CLEAR_HALT: "libusb_clear_halt",
    OP_RESET: "libusb_reset_device", OP_KERNEL_DRIVER_ACTIVE: "libusb_kernel_driver_active",
    OP_DETACH_KERNEL_DRIVER: "libusb_detach_kernel_driver",
    OP_ATTACH_KERNEL_DRIVER: "libusb_attach_kernel_driver",
    OP_CONTROL: "libusb_control_transfer", OP_SUBMIT: "libusb_submit_transfer",
    OP_CANCEL: "libusb_cancel_transfer",
}

# -- libusb codes ------------------------------------------------------------------------------

ERROR_NAMES = {0: "LIBUSB_SUCCESS", -1: "LIBUSB_ERROR_IO", -2: "LIBUSB_ERROR_INVALID_PARAM",
               -3: "LIBUSB_ERROR_ACCESS", -4: "LIBUSB_ERROR_NO_DEVICE",
               -5: "LIBUSB_ERROR_NOT_FOUND", -6: "LIBUSB_ERROR_BUSY",
               -7: "LIBUSB_ERROR_TIMEOUT", -8: "LIBUSB_ERROR_OVERFLOW",
               -9: "LIBUSB_ERROR_PIPE", -10: "LIBUSB_ERROR_INTERRUPTED",
               -11: "LIBUSB_ERROR_NO_MEM", -12: "LIBUSB_ERROR_NOT_SUPPORTED",
               -99: "LIBUSB_ERROR_OTHER"}
COMPLETED, ERROR, TIMED_OUT, CANCELLED, STALL, NO_DEVICE, OVERFLOW = range(7)
STATUS_NAMES = {COMPLETED: "LIBUSB_TRANSFER_COMPLETED", ERROR: "LIBUSB_TRANSFER_ERROR",
                TIMED_OUT: "LIBUSB_TRANSFER_TIMED_OUT", CANCELLED: "LIBUSB_TRANSFER_CANCELLED",
                STALL: "LIBUSB_TRANSFER_STALL", NO_DEVICE: "LIBUSB_TRANSFER_NO_DEVICE",
                OVERFLOW: "LIBUSB_TRANSFER_OVERFLOW"}
CONTROL, ISOCHRONOUS, BULK, INTERRUPT = range(4)     # libusb_transfer.type

#: errno value -> libusb error code (what libusb's Linux backend gives for it).
ERRNO_TO_LIBUSB = {errno.EIO: -1, errno.EINVAL: -2, errno.EACCES: -3, errno.EPERM: -3,
                   errno.ENODEV: -4, errno.ENXIO: -4, errno.ESHUTDOWN: -4, errno.ENOENT: -5,
                   errno.EBUSY: -6, errno.ETIMEDOUT: -7, errno.EOVERFLOW: -8,
                   errno.EPIPE: -9, errno.EINTR: -10, errno.ENOMEM: -11, errno.ENOSYS: -12}
#: libusb error code -> the status of a transfer that failed with it.
STATUS_OF_ERROR = {-7: TIMED_OUT, -9: STALL, -4: NO_DEVICE, -8: OVERFLOW}


def libusb_error(exc: BaseException) -> int:
    """The libusb error code for an exception a pyusb backend raised."""
    if isinstance(exc, usb.core.USBTimeoutError):
        return -7
    if isinstance(exc, NotImplementedError):
        return -12
    if isinstance(exc, IndexError):       # a descriptor that does not exist
        return -5
    if isinstance(exc, OSError):
        code = ERRNO_TO_LIBUSB.get(exc.errno)
        if code is None:
            lib = getattr(exc, "backend_error_code", None)
            code = lib if isinstance(lib, int) and lib in ERROR_NAMES else None
        return code if code is not None else -99
    return -99


def expected(exc: BaseException) -> bool:
    """Whether ``exc`` is one a USB backend raises on purpose (not a bug in it)."""
    return isinstance(exc, (OSError, NotImplementedError, IndexError))
