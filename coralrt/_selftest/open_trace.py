"""The recorded libedgetpu open trace, kept as an expectation, never as answers.

``OPEN_TRACE`` is the 52-step control-transfer trace of libedgetpu opening a
Coral USB Accelerator that already runs its firmware, captured with a libusb
trace and published in geohot/edgetpuxray (``connect.py``); the Edge TPU stack
reference keeps it as ``libedgetpu-open-trace.tsv`` and decodes it in §1.6.
It is re-encoded below as data, so the package does not read any file at run
time.  Each step: (op, bmRequestType, bRequest, register, wLength, value),
where value is the little-endian data written, or what the trace shows read.

Its writes are what libedgetpu's std (throttled) build writes: scu_ctrl_3
0x5085025C carries the clock bits of ``PerformanceExpectation_High``.  Its read
values are not what the stick answered: several are the data of the transfer
before (0x1a314 "reads" 0x000F0059, the value just written to 0x1a30c;
0x1a33c "reads" 0x0070007F, the reset value of rambist_ctrl_1, read just
before), and 0x44018 "reads" 1 where libedgetpu polls until it reads 0.  So
the simulated stick's registers are a model (:mod:`coralrt._sim.stick.chip`),
and the trace checks writes only (docs/usb.md, "Bring-up").
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TraceStep", "OPEN_TRACE", "parse_trace"]


@dataclass(frozen=True)
class TraceStep:
    step: int
    op: str              # "read" | "write"
    request_type: int    # 0xc0 read, 0x40 write
    request: int         # 0 = 64-bit register, 1 = 32-bit register
    register: int
    length: int          # wLength: 8 or 4
    value: int


_R, _W = "read", "write"
_RAW = (  # (op, bRequest, register, value); bmRequestType and wLength follow from them
    (_R, 1, 0x1a30c, 0xb76a0001), (_W, 1, 0x1a30c, 0x000f0059),
    (_R, 1, 0x1a314, 0x000f0059), (_R, 1, 0x1a318, 0x00000000),
    (_R, 1, 0x1a318, 0x00000001), (_W, 1, 0x1a318, 0x5085025c),
    (_R, 1, 0x1a318, 0x50c5025c), (_R, 0, 0x44018, 0x1),
    (_W, 0, 0x4a000, 0x1), (_W, 0, 0x48788, 0x7f),
    (_R, 0, 0x48788, 0x0), (_W, 0, 0x40020, 0x1e02),
    (_R, 1, 0x1a314, 0x00000000), (_W, 1, 0x1a314, 0x00150000),
    (_R, 1, 0x1a000, 0x00000001), (_W, 0, 0x4c148, 0xf0),
    (_W, 0, 0x4c160, 0x0), (_W, 0, 0x4c058, 0x80),
    (_W, 0, 0x44018, 0x1), (_W, 0, 0x44158, 0x1),
    (_W, 0, 0x44198, 0x1), (_W, 0, 0x441d8, 0x1),
    (_W, 0, 0x44218, 0x1), (_W, 0, 0x48788, 0x7f),
    (_R, 0, 0x48788, 0x8), (_W, 0, 0x400c0, 0x1),
    (_W, 0, 0x40150, 0x1), (_W, 0, 0x40110, 0x1),
    (_W, 0, 0x40250, 0x1), (_W, 0, 0x40298, 0x1),
    (_W, 0, 0x402e0, 0x1), (_W, 0, 0x40328, 0x1),
    (_W, 0, 0x40190, 0x1), (_W, 0, 0x401d0, 0x1),
    (_W, 0, 0x40210, 0x1), (_W, 0, 0x4c060, 0x1),
    (_W, 0, 0x4c070, 0x1), (_W, 0, 0x4c080, 0x1),
    (_W, 0, 0x4c090, 0x1), (_W, 0, 0x4c0a0, 0x1),
    (_R, 1, 0x1a0d4, 0x00000000), (_W, 1, 0x1a0d4, 0x80000001),
    (_R, 1, 0x1a704, 0x00000000), (_W, 1, 0x1a704, 0x0000007f),
    (_R, 1, 0x1a33c, 0x0070007f), (_W, 1, 0x1a33c, 0x0000003f),
    (_W, 1, 0x1a500, 0x00000001), (_W, 1, 0x1a600, 0x00000001),
    (_W, 1, 0x1a558, 0x00000003), (_W, 1, 0x1a658, 0x00000003),
    (_R, 1, 0x1a0d8, 0x00000001), (_W, 1, 0x1a0d8, 0x80000000),
)

OPEN_TRACE: tuple[TraceStep, ...] = tuple(
    TraceStep(i, op, 0xC0 if op == _R else 0x40, req, reg, 4 if req else 8, value)
    for i, (op, req, reg, value) in enumerate(_RAW, start=1))


def parse_trace(text: str) -> tuple[TraceStep, ...]:
    """Steps of a trace in the TSV layout of libedgetpu-open-trace.tsv.

    Lines starting with ``#`` and the column-name line are skipped; numbers
    may be decimal or 0x-prefixed.  Raises ValueError for a malformed line.
    """
    steps = []
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#") or line.startswith("step"):
            continue
        cols = line.split("\t")
        if len(cols) != 7 or cols[1] not in (_R, _W):
            raise ValueError(f"trace line {n}: expected 7 tab-separated columns "
                             f"(step, read|write, bmRequestType, bRequest, register, wLength, "
                             f"value), got {line!r}")
        try:
            s, rt, req, reg, length, value = (int(c, 0) for c in cols[:1] + cols[2:])
        except ValueError as e:
            raise ValueError(f"trace line {n}: {e}") from None
        steps.append(TraceStep(s, cols[1], rt, req, reg, length, value))
    return tuple(steps)
