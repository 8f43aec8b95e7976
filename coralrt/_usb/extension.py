"""What a pyusb backend may tell the USB driver beyond pyusb's own interface.

The driver (:class:`coralrt._usb.driver.UsbEdgeTpu`) talks to every backend
through pyusb calls only.  A few things cannot be learned that way: whether a
stick can be shared with other processes, how long the device itself worked
on the last run, and which kinds of program the device can execute.  A
backend that knows better subclasses :class:`BackendExtension` (next to
``usb.backend.IBackend``) and overrides what differs; the driver reads the
extension once, when it opens a stick::

    ext = backend if isinstance(backend, BackendExtension) else BackendExtension()

A backend that is not a ``BackendExtension`` (libusb, that is, real sticks)
gets the defaults of this class, which describe a real Coral USB Accelerator.

Program kinds, as :meth:`UsbEdgeTpu.load` tells them apart:

* ``"segment"``: a coralrt native segment (magic ``CRTSEG``), the output of
  coralrt's native compiler, run with coralrt's own wire protocol; only the
  simulated Edge TPU executes these;
* ``"dwn1"``: an edgetpu_compiler executable package (the ``custom_options``
  of an ``edgetpu-custom-op``), Google's closed instruction set; only a real
  Edge TPU executes these.
"""

from __future__ import annotations

__all__ = ["BackendExtension", "PROGRAM_KINDS", "LOCK_SCOPES", "REAL_STICK_REFUSES_SEGMENTS"]

#: The program kinds the driver asks about (see the module docstring).
PROGRAM_KINDS = ("segment", "dwn1")
#: The values of :attr:`BackendExtension.lock_scope`.
LOCK_SCOPES = ("machine", "process")

REAL_STICK_REFUSES_SEGMENTS = (
    "a real Edge TPU cannot execute coralrt's native segments (they are programs for the "
    "simulated Edge TPU, built by coralrt's native compiler); run them with target='sim', or "
    "for the Coral USB Accelerator use target='coral' with the plain .tflite (coralrt "
    "compiles it with the edgetpu_compiler plugin) or a model compiled by edgetpu_compiler")


class BackendExtension:
    """Optional answers of a pyusb backend to the driver; the defaults describe a real stick.

    A backend subclasses this (as well as ``usb.backend.IBackend``) and
    overrides what differs.  All members must be cheap and must not perform
    USB transfers.  ``address`` is the USB address of the stick the driver
    opened (pyusb's ``Device.address``).
    """

    #: Who may use a stick at the same time.  ``"machine"``: the sticks are
    #: shared by every process of the machine, so the driver takes its
    #: cross-process per-stick lock (a file lock named after the port path)
    #: while a stick is open, as for real sticks.  ``"process"``: the sticks
    #: exist only inside this process (a simulated stick private to a
    #: session); the driver takes no lock.
    lock_scope: str = "machine"

    def device_seconds(self, address: int) -> float:
        """Device-side time of the last run on the stick at ``address``, in seconds.

        Includes a parameter upload the run performed.  0.0 when it is not
        known: a real stick's time is not measured.
        """
        return 0.0

    def refusal(self, address: int, kind: str) -> str | None:
        """Why the stick at ``address`` cannot execute programs of ``kind``, or None if it can.

        ``kind`` is one of :data:`PROGRAM_KINDS`.  The answer is the reason
        and what to do instead, as one sentence; the driver raises
        :class:`~coralrt.errors.ProgramRefusedError` with it when a program of
        that kind is loaded.  The default (a real Edge TPU) refuses
        coralrt's native segments.
        """
        if kind == "segment":
            return REAL_STICK_REFUSES_SEGMENTS
        return None
