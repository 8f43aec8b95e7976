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
the USB 2 value on a USB 2 link), and every plain read of the trace (not the
repeated reads of a poll) must have read the recorded value.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from coralrt.usb import constants as C
from coralrt.usb.extension import BackendExtension

__all__ = ["RecordingBackend", "Transfer", "compare_with_trace", "plain_reads"]

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

    It answers the driver's :class:`~coralrt.usb.extension.BackendExtension`
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


def _groups(steps) -> list[tuple[int, object]]:
    """(writes before it, step) for every read step of a trace."""
    out, writes = [], 0
    for s in steps:
        if s.op == "write":
            writes += 1
        else:
            out.append((writes, s))
    return out


def plain_reads(trace) -> list[tuple[int, object]]:
    """The trace's plain reads as (writes before it, step): a register read more than
    once between two writes is a poll (its answers change while the chip gets
    ready), not a value to compare."""
    reads = _groups(trace)
    seen: dict[tuple[int, int], int] = {}
    for group, s in reads:
        seen[(group, s.register)] = seen.get((group, s.register), 0) + 1
    return [(g, s) for g, s in reads if seen[(g, s.register)] == 1]


def compare_with_trace(transfers: list[Transfer], trace) -> dict:
    """How the vendor requests of one open compare with ``trace`` (TraceStep rows).

    Returns ``writes_as_in_trace`` (bool), ``write_differences`` (list of
    strings), ``registers`` (one dict per plain read: step, register, expected,
    read, equal) and ``mismatches`` (the unequal ones).
    """
    writes = [t for t in transfers if t.request_type == _VENDOR_OUT]
    want = [s for s in trace if s.op == "write"]
    diffs = []
    for i, (s, t) in enumerate(zip(want, writes)):
        if s.register != t.register:
            diffs.append(f"write {i + 1}: register {t.register:#x}, trace step {s.step} "
                         f"writes {s.register:#x}")
        elif s.value != t.number and s.register != C.OUTFEED_CHUNK_LENGTH_REG:
            diffs.append(f"write {i + 1} to {s.register:#x}: {t.number:#x}, trace step "
                         f"{s.step} writes {s.value:#x}")
    if len(writes) != len(want):
        diffs.append(f"{len(writes)} register writes, the trace has {len(want)}")
    # Reads by the number of writes before them, as in the trace.
    by_group: dict[tuple[int, int], Transfer] = {}
    n = 0
    for t in transfers:
        if t.request_type == _VENDOR_OUT:
            n += 1
        elif t.request_type == _VENDOR_IN:
            by_group[(n, t.register)] = t       # the last read of it in that group
    rows = []
    for group, s in plain_reads(trace):
        t = by_group.get((group, s.register))
        got = None if t is None else t.number
        rows.append({"step": s.step, "register": f"{s.register:#x}",
                     "expected": f"{s.value:#x}",
                     "read": None if got is None else f"{got:#x}",
                     "equal": got == s.value})
    return {"writes_as_in_trace": not diffs, "write_differences": diffs,
            "registers": rows, "mismatches": [r for r in rows if not r["equal"]]}
