"""The child's side: pyusb's libusb1 backend loaded from the shim.

coralrt's driver takes a backend that is not a ``BackendExtension`` (libusb)
for real sticks, which refuse coralrt's native segments.  The stick behind the
shim is a simulated one, private to the test, so :class:`ShimBackend` says so:
lock scope "process", native segments accepted, edgetpu_compiler programs
refused as the simulated stick refuses them.
"""

from __future__ import annotations

import os

import usb.backend
import usb.backend.libusb1

from coralrt._usb.extension import BackendExtension

__all__ = ["ShimBackend", "shim_backend"]


class ShimBackend(usb.backend.IBackend, BackendExtension):
    """pyusb's libusb1 backend over the shim (``inner``), with the answers of a
    simulated stick private to this process."""

    lock_scope = "process"

    def __init__(self, inner):
        self.inner = inner

    def refusal(self, address: int, kind: str) -> str | None:
        if kind == "segment":
            return None
        return "the simulated Edge TPU behind the libusb shim runs coralrt native segments only"


for _name in [n for n in vars(usb.backend.IBackend) if not n.startswith("_")]:
    setattr(ShimBackend, _name,
            lambda self, *args, _name=_name: getattr(self.inner, _name)(*args))


def shim_backend(library: str | os.PathLike | None = None) -> ShimBackend:
    """pyusb's libusb1 backend loaded from ``library`` (default: the shim that
    ``StickServer.env()`` names in CORALRT_USBSHIM_LIBRARY), as a :class:`ShimBackend`."""
    path = str(library or os.environ["CORALRT_USBSHIM_LIBRARY"])
    inner = usb.backend.libusb1.get_backend(find_library=lambda _name: path)
    if inner is None:
        raise RuntimeError(f"pyusb could not load the libusb shim {path} (is the server "
                           f"running and CORALRT_USBSHIM_SOCKET set?)")
    return ShimBackend(inner)
