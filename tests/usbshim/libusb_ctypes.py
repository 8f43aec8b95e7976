"""libusb-1.0's C API through ctypes, for test children that drive the shim directly
(asynchronous transfers, cancels, handle_events), the way a native program would.

    lib = load()                          # CORALRT_USBSHIM_LIBRARY
    ctx = init(lib)
    handle = open_first(lib, ctx)
    t = Async(lib, handle, 0x81, 1024, timeout_ms=5000, on_done=...)
    t.submit(); lib.libusb_handle_events(ctx)
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, byref, c_char_p, c_int, c_ubyte, c_uint,
                    c_uint8, c_uint16, c_void_p)

__all__ = ["load", "init", "open_first", "Async", "Transfer", "CALLBACK",
           "LIBUSB_TRANSFER_TYPE_BULK", "LIBUSB_TRANSFER_TYPE_INTERRUPT"]

LIBUSB_TRANSFER_TYPE_BULK = 2
LIBUSB_TRANSFER_TYPE_INTERRUPT = 3


class Transfer(Structure):
    pass


CALLBACK = CFUNCTYPE(None, POINTER(Transfer))
Transfer._fields_ = [("dev_handle", c_void_p), ("flags", c_uint8), ("endpoint", c_ubyte),
                     ("type", c_ubyte), ("timeout", c_uint), ("status", c_int),
                     ("length", c_int), ("actual_length", c_int), ("callback", CALLBACK),
                     ("user_data", c_void_p), ("buffer", c_void_p), ("num_iso_packets", c_int)]


def load(path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """The shim (default: CORALRT_USBSHIM_LIBRARY) with the prototypes the tests use."""
    lib = ctypes.CDLL(str(path or os.environ["CORALRT_USBSHIM_LIBRARY"]))
    proto = {
        "libusb_init": (c_int, [POINTER(c_void_p)]),
        "libusb_exit": (None, [c_void_p]),
        "libusb_get_device_list": (ctypes.c_ssize_t, [c_void_p, POINTER(POINTER(c_void_p))]),
        "libusb_free_device_list": (None, [POINTER(c_void_p), c_int]),
        "libusb_open": (c_int, [c_void_p, POINTER(c_void_p)]),
        "libusb_close": (None, [c_void_p]),
        "libusb_claim_interface": (c_int, [c_void_p, c_int]),
        "libusb_reset_device": (c_int, [c_void_p]),
        "libusb_control_transfer": (c_int, [c_void_p, c_uint8, c_uint8, c_uint16, c_uint16,
                                            POINTER(c_ubyte), c_uint16, c_uint]),
        "libusb_bulk_transfer": (c_int, [c_void_p, c_ubyte, POINTER(c_ubyte), c_int,
                                         POINTER(c_int), c_uint]),
        "libusb_alloc_transfer": (POINTER(Transfer), [c_int]),
        "libusb_free_transfer": (None, [POINTER(Transfer)]),
        "libusb_submit_transfer": (c_int, [POINTER(Transfer)]),
        "libusb_cancel_transfer": (c_int, [POINTER(Transfer)]),
        "libusb_handle_events": (c_int, [c_void_p]),
        "libusb_error_name": (c_char_p, [c_int]),
        "libusb_get_bus_number": (c_uint8, [c_void_p]),
        "libusb_get_port_number": (c_uint8, [c_void_p]),
    }
    for name, (restype, argtypes) in proto.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def init(lib) -> c_void_p:
    ctx = c_void_p()
    rc = lib.libusb_init(byref(ctx))
    if rc != 0:
        raise OSError(f"libusb_init: {lib.libusb_error_name(rc).decode()}")
    return ctx


def open_first(lib, ctx) -> c_void_p:
    """A handle on the first device listed, with interface 0 claimed."""
    devs = POINTER(c_void_p)()
    n = lib.libusb_get_device_list(ctx, byref(devs))
    if n < 1:
        raise OSError(f"libusb_get_device_list: {n}")
    handle = c_void_p()
    rc = lib.libusb_open(devs[0], byref(handle))
    lib.libusb_free_device_list(devs, 1)
    if rc != 0:
        raise OSError(f"libusb_open: {lib.libusb_error_name(rc).decode()}")
    rc = lib.libusb_claim_interface(handle, 0)
    if rc != 0:
        raise OSError(f"libusb_claim_interface: {lib.libusb_error_name(rc).decode()}")
    return handle


class Async:
    """One asynchronous transfer: ``on_done(self)`` runs in libusb_handle_events."""

    def __init__(self, lib, handle, endpoint: int, length: int, *, timeout_ms: int = 0,
                 data: bytes = b"", kind: int = LIBUSB_TRANSFER_TYPE_BULK, on_done=None):
        self.lib, self.on_done = lib, on_done
        self.buffer = (c_ubyte * max(length, 1))(*data[:length])
        self.callback = CALLBACK(self._done)         # kept alive with this object
        self.t = lib.libusb_alloc_transfer(0)
        t = self.t.contents
        t.dev_handle, t.endpoint, t.type, t.timeout = handle, endpoint, kind, timeout_ms
        t.length, t.buffer = length, ctypes.cast(self.buffer, c_void_p)
        t.callback = self.callback
        self.status: int | None = None
        self.actual = 0
        self.data = b""

    def submit(self) -> int:
        return self.lib.libusb_submit_transfer(self.t)

    def cancel(self) -> int:
        return self.lib.libusb_cancel_transfer(self.t)

    def free(self) -> None:
        self.lib.libusb_free_transfer(self.t)

    def _done(self, tp) -> None:
        t = tp.contents
        self.status, self.actual = t.status, t.actual_length
        self.data = bytes(self.buffer[:t.actual_length])
        if self.on_done is not None:
            self.on_done(self)
