"""What the driver's own open sent and read, seen from below pyusb.

:class:`RecordingBackend` wraps a pyusb backend (libusb, or the simulated
stick's) and passes every call through unchanged, noting each control
transfer (request type, request, value, index, the bytes written or read).
The self-test opens the stick with the driver through it, so the register
values it compares with the reference trace are the ones the driver's read
path returned during its own open sequence: the self-test writes nothing
that the driver's open (which follows libedgetpu's) does not write, and reads
nothing more.

:func:`compare_with_trace` lines the recorded vendor requests up with
libedgetpu's open trace: the writes must be the trace's writes (same
registers, same values, in the same order; the outfeed chunk length may be
the USB 2 value on a USB 2 link), plus only the writes of libedgetpu's
EnableReset, which the recorded open skipped.  The trace's read values are not
answers (see :mod:`coralrt._selftest.open_trace`) and are not compared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from coralrt._usb import constants as C
from coralrt._usb.extension import BackendExtension

__all__ = ["RecordingBackend", "Transfer", "compare_with_trace"]

_VENDOR_OUT, _VENDOR_IN = 0x40, 0xC0


@dataclass(frozen=True)
class Transfer:
    seconds: float          # time.perf_counter() when it finished
    request_type: int
    request: int
    value: int
    index: int
    data: bytes             # written (OUT) or read (IN)

    @property
    def register(self) -> int:
        return (self.index << 16) | self.value

    @property
    def number(self) -> int:
        return int.from_bytes(self.data, "little")


class RecordingBackend(BackendExtension):
    """A pyusb backend that passes every call to ``inner`` and records control transfers.

    It answers the driver's :class:`~coralrt._usb.extension.BackendExtension`
    questions as ``inner`` does (a backend that is not one, libusb, gets the
    defaults, which describe a real stick, as it would without the wrapper).
    """

    def __init__(self, inner):
        self.inner = inner
        self.transfers: list[Transfer] = []
        ext = inner if isinstance(inner, BackendExtension) else BackendExtension()
        self._ext = ext
        self.lock_scope = ext.lock_scope

    def __getattr__(self, name):
        # Only reached for what this class does not define: pyusb's backend interface.
        return getattr(self.inner, name)

    def device_seconds(self, address: int) -> float:
        return self._ext.device_seconds(address)

    def refusal(self, address: int, kind: str) -> str | None:
        return self._ext.refusal(address, kind)

    def ctrl_transfer(self, dev_handle, bmRequestType, bRequest, wValue, wIndex, data,
                      timeout):
        result = self.inner.ctrl_transfer(dev_handle, bmRequestType, bRequest, wValue,
                                          wIndex, data, timeout)
        if bmRequestType & 0x80:        # IN: ``result`` bytes were read into ``data``
            got = bytes(data[:result]) if isinstance(result, int) else b""
        else:
            got = bytes(data) if data is not None else b""
        self.transfers.append(Transfer(time.perf_counter(), bmRequestType, bRequest, wValue,
                                       wIndex, got))
        return result

    def mark(self) -> int:
        return len(self.transfers)

    def vendor(self, start: int = 0, stop: int | None = None) -> list[Transfer]:
        """The register reads and writes among the transfers ``start:stop``."""
        return [t for t in self.transfers[start:stop]
                if t.request_type in (_VENDOR_OUT, _VENDOR_IN)]

    def count(self, request_type: int, request: int, start: int = 0,
              stop: int | None = None) -> int:
        return sum(1 for t in self.transfers[start:stop]
                   if t.request_type == request_type and t.request == request)


def _enable_reset_write(register: int, value: int) -> bool:
    """A write of libedgetpu's EnableReset: rg_force_sleep 0b11, or the gcbb_credit0
    pulse.  The recorded open has none: the stick it opened was asleep already, and
    EnableReset returns at once when rg_force_sleep reads 0b11."""
    return register == C.GCBB_CREDIT0 or (
        register == C.SCU_CTRL_3 and C.field(value, C.SCU3_FORCE_SLEEP) == C.FORCE_SLEEP_ON)


def compare_with_trace(transfers: list[Transfer], trace) -> dict:
    """How the vendor requests of one open compare with ``trace`` (TraceStep rows).

    The trace's writes must all be there, in order, with the same values (the
    outfeed chunk length may be the USB 2 value on a USB 2 link); the only other
    writes allowed are those of libedgetpu's EnableReset (``explained_writes``).
    Returns ``writes_as_in_trace`` (bool), ``write_differences`` (list of strings),
    ``explained_writes`` (how many EnableReset writes the trace does not have).  The
    trace's read values are
    not compared: they are not what its stick answered (coralrt._selftest.open_trace).
    """
    writes = [t for t in transfers if t.request_type == _VENDOR_OUT]
    want = [s for s in trace if s.op == "write"]
    diffs, extra, i = [], 0, 0
    for n, t in enumerate(writes, start=1):
        s = want[i] if i < len(want) else None
        same = s is not None and s.register == t.register
        if same and s.value != t.number and _enable_reset_write(t.register, t.number):
            extra += 1
        elif same:
            if s.value != t.number and s.register != C.OUTFEED_CHUNK_LENGTH_REG:
                diffs.append(f"write {n} to {s.register:#x}: {t.number:#x}, trace step "
                             f"{s.step} writes {s.value:#x}")
            i += 1
        elif _enable_reset_write(t.register, t.number):
            extra += 1
        else:
            where = f"trace step {s.step} writes {s.register:#x}" if s else "the trace has ended"
            diffs.append(f"write {n}: register {t.register:#x} = {t.number:#x}, {where}")
    if i < len(want):
        diffs.append(f"{len(want) - i} of the trace's writes were not made (from step "
                     f"{want[i].step}, {want[i].register:#x})")
    return {"writes_as_in_trace": not diffs, "write_differences": diffs,
            "explained_writes": extra}
