"""The Edge TPU device interface every device implements.

The simulated Edge TPU implements it with numpy kernels; the USB driver
implements it over pyusb.  The executor only talks to this interface, so a
device swaps in without changing how programs run.

    with device:                          # open() ... close()
        handle = device.load(program)     # program bytes; parameters cached
        outputs = device.run(handle, inputs)

``load`` uploads a program's parameters once: loading the same program again
returns the cached handle, as the real stick keeps cached parameters while the
program stays loaded.

Whatever exception escapes ``run`` (a device error, Ctrl-C, a timeout raised
in the calling thread, ...), the device must never answer a later ``run``
with outputs of an earlier one.  A device that cannot tell where an
interrupted request left it marks itself out of step and resynchronises
(``reset``) at the start of its next ``run``, raising a device error only
if that fails.  ``reset`` does the same on request: afterwards the device is
in step, handles from ``load`` stay valid, and what it held (parameters)
is uploaded again when needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EdgeTpuDevice", "RunStats"]


@dataclass
class RunStats:
    """What the last ``run`` of a device cost.

    ``device_seconds`` is the device's own time as it reports it (the
    simulated stick's latency estimate), 0.0 when not known (a real stick's
    time is not measured).
    """

    host_seconds: float = 0.0
    device_seconds: float = 0.0
    parameter_upload_seconds: float = 0.0  # nonzero on the first run after a load


class EdgeTpuDevice:
    """Base class: ``open``, ``load``, ``run``, ``reset``, ``close``."""

    kind = ""       # the device registry's kind: "coral", "sim", or a plugin's
    path = ""       # a stable name for the device ("sim:0", "usb:0" ...)

    @property
    def label(self) -> str:
        """How step names and reports call the device: its path, and for a device
        that is not a real stick, what it is (``simulated usb:0``)."""
        return self.path

    def open(self) -> None:
        raise NotImplementedError

    def load(self, program: bytes):
        """Upload ``program`` (a coralrt segment or an Edge TPU executable); return a handle."""
        raise NotImplementedError

    def load_as(self, program: bytes, format_id: str, *, output_dtypes=None):
        """Upload ``program`` of the program format ``format_id`` (``"segment"``,
        ``"dwn1"``: :data:`coralrt._formats.opnames.FORMATS`); return a handle.

        The executor calls this, knowing the format from the operator's name.
        ``output_dtypes``: the operator's output dtypes, for formats whose
        outputs need them to be decoded (``outputs_need_dtypes``).  This default
        leaves both to :meth:`load`, for devices that tell formats apart by
        themselves."""
        return self.load(program)

    def run(self, handle, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Send inputs, execute, read outputs (in the program's output order)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Bring the device back in step with the host (see the module docstring).
        This default closes and opens it again."""
        self.close()
        self.open()

    @property
    def last_stats(self) -> RunStats:
        raise NotImplementedError

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
