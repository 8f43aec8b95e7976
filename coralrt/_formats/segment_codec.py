"""The coralrt segment's byte format: ``encode`` and ``decode``.

Layout, section by section, in docs/segment-format.md.  ``decode`` accepts
exactly what ``encode`` writes and raises
:class:`~coralrt.errors.SegmentFormatError` for anything else.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from coralrt._formats.memplan import ACTIVATION_ALIGNMENT, ActivationSlot, MemoryPlan, align_up
from coralrt._formats.segment import (
    KINDS, Segment, SegmentOp, SegmentTensor, attach_parameter_views, check_segment,
)
from coralrt.errors import SegmentFormatError
from coralrt._formats.opnames import SEGMENT

__all__ = ["MAGIC", "FORMAT_VERSION", "HEADER_SIZE", "encode", "decode"]

# -- byte format (docs/segment-format.md) -------------------------------------------------

MAGIC = SEGMENT.magic   # b"CRTSEG\0\0", from the table of program formats
FORMAT_VERSION = 1
HEADER_SIZE = 160
SECTION_NAMES = ("info", "io", "operators", "tensors", "offset table", "memory plan",
                 "parameters")
_PARAMS = 6
_HEADER = struct.Struct("<8sHHIQI5I")            # 48 bytes, then the section table
_SECTIONS = struct.Struct(f"<{2 * len(SECTION_NAMES)}Q")
_OP = struct.Struct("<6I")
_TENSOR = struct.Struct("<IBBHIiIIQQ")
_PLAN = struct.Struct("<5QII")
_SLOT = struct.Struct("<4IQQ")
_TAG_BOOL, _TAG_INT, _TAG_FLOAT, _TAG_STR, _TAG_INTS, _TAG_FLOATS, _TAG_BYTES = range(1, 8)
_SCALARS = {_TAG_BOOL: struct.Struct("<B"), _TAG_INT: struct.Struct("<q"),
            _TAG_FLOAT: struct.Struct("<d")}
_U8, _U16, _U32 = struct.Struct("<B"), struct.Struct("<H"), struct.Struct("<I")


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode("utf-8")
    except (UnicodeEncodeError, AttributeError) as e:
        raise SegmentFormatError(f"{what} {text!r} is not encodable as UTF-8 text") from e


def _blob(raw: bytes) -> bytes:
    return _U32.pack(len(raw)) + raw


def _value(key: str, value) -> bytes:
    if isinstance(value, (bool, np.bool_)):
        return _U8.pack(_TAG_BOOL) + _U8.pack(int(value))
    if isinstance(value, (int, np.integer)):
        return _U8.pack(_TAG_INT) + _SCALARS[_TAG_INT].pack(int(value))
    if isinstance(value, (float, np.floating)):
        return _U8.pack(_TAG_FLOAT) + _SCALARS[_TAG_FLOAT].pack(float(value))
    if isinstance(value, str):
        return _U8.pack(_TAG_STR) + _blob(_utf8(value, f"option {key!r}"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _U8.pack(_TAG_BYTES) + _blob(bytes(value))
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
               for v in value):
            return _U8.pack(_TAG_INTS) + _U32.pack(len(value)) + np.asarray(
                value, "<i8").tobytes()
        if all(isinstance(v, (float, np.floating)) for v in value):
            return _U8.pack(_TAG_FLOATS) + _U32.pack(len(value)) + np.asarray(
                value, "<f8").tobytes()
    raise SegmentFormatError(f"option {key!r} has value {value!r}; the format holds bools, "
                             f"ints, floats, strings, bytes and lists of ints or floats")


def _op_record(op: SegmentOp) -> bytes:
    out = bytearray(_OP.pack(op.opcode, op.version, len(op.inputs), len(op.outputs),
                             len(op.intermediates), len(op.params)))
    out += np.asarray(op.inputs, "<i4").tobytes() + np.asarray(op.outputs, "<u4").tobytes()
    out += np.asarray(op.intermediates, "<u4").tobytes()
    out += _blob(_utf8(op.custom_code, "custom code")) + _blob(bytes(op.custom_options))
    for key, value in op.params.items():
        k = _utf8(key, "option name")
        if len(k) > 0xFFFF:
            raise SegmentFormatError(f"option name {key[:40]!r}... is longer than 65535 bytes")
        out += _U16.pack(len(k)) + k + _value(key, value)
    return bytes(out + bytes(-len(out) % 8))


def _tensor_record(t: SegmentTensor) -> bytes:
    name = _utf8(t.name, "tensor name")
    out = (_TENSOR.pack(t.id, KINDS.index(t.kind), t.dtype, int(t.variable), len(t.shape),
                        t.quantized_dimension, t.scales.size, len(name), t.offset, t.nbytes)
           + np.asarray(t.shape, "<u4").tobytes() + np.asarray(t.scales, "<f4").tobytes()
           + np.asarray(t.zero_points, "<i8").tobytes() + name)
    return out + bytes(-len(out) % 8)


def encode(segment: Segment) -> bytes:
    """The segment's bytes (layout in docs/segment-format.md); validates it first."""
    check_segment(segment)
    try:
        return _encode(segment)
    except (struct.error, OverflowError) as e:
        raise SegmentFormatError(f"a field is out of the range its encoding holds: {e}") from e


def _encode(seg: Segment) -> bytes:
    out = bytearray(HEADER_SIZE)
    table: list[int] = []

    def section(body, alignment: int = 8) -> int:
        start = align_up(len(out), alignment)
        out.extend(bytes(start - len(out)))
        out.extend(body)
        table.extend((start, len(body)))
        return start

    section(b"".join(_blob(_utf8(s, "segment string"))
                     for s in (seg.name, seg.compiler_id, seg.compiler_version)))
    section(np.asarray((*seg.inputs, *seg.outputs), "<u4").tobytes())
    starts = []
    for records in ([_op_record(op) for op in seg.ops],
                    [_tensor_record(t) for t in seg.tensors]):
        base = align_up(len(out), 8)
        for r in records:
            starts.append(base)
            base += len(r)
        section(b"".join(records))
    section(np.asarray(starts, "<u8").tobytes())
    plan = seg.memory
    section(_PLAN.pack(plan.on_chip_bytes, plan.activation_bytes, plan.parameter_bytes,
                       plan.on_chip_parameter_bytes, plan.off_chip_parameter_bytes,
                       ACTIVATION_ALIGNMENT, len(plan.slots))
            + b"".join(_SLOT.pack(s.tensor, s.first_op, s.last_op, 0, s.offset, s.nbytes)
                       for s in plan.slots))
    section(seg.parameters.tobytes(), 64)
    _HEADER.pack_into(out, 0, MAGIC, FORMAT_VERSION, 0, HEADER_SIZE, len(out),
                      zlib.crc32(memoryview(out)[HEADER_SIZE:]), len(seg.ops),
                      len(seg.tensors), len(seg.inputs), len(seg.outputs), 0)
    _SECTIONS.pack_into(out, _HEADER.size, *table)
    return bytes(out)


class _Reader:
    """Bounds-checked little-endian reads inside one section."""

    def __init__(self, buf: memoryview, start: int, size: int, where: str):
        self.buf, self.pos, self.end, self.where = buf, start, start + size, where

    def fail(self, message: str):
        raise SegmentFormatError(message, where=f"{self.where}, byte {self.pos}")

    def take(self, n: int) -> int:
        if n > self.end - self.pos:
            self.fail(f"needs {n} more bytes but the section ends at byte {self.end}")
        self.pos += n
        return self.pos - n

    def unpack(self, s: struct.Struct) -> tuple:
        return s.unpack_from(self.buf, self.take(s.size))

    def array(self, dtype: str, count: int) -> np.ndarray:
        dt = np.dtype(dtype)
        return np.frombuffer(self.buf, dt, count, self.take(count * dt.itemsize)).copy()

    def raw(self, n: int) -> bytes:
        return bytes(self.buf[self.take(n):self.pos])

    def text(self, n: int | None = None) -> str:
        pos = self.pos
        raw = self.raw(self.unpack(_U32)[0] if n is None else n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SegmentFormatError(f"text is not valid UTF-8 ({e.reason})",
                                     where=f"{self.where}, byte {pos}") from None

    def value(self, tag: int):
        if tag in _SCALARS:
            v = self.unpack(_SCALARS[tag])[0]
            if tag == _TAG_BOOL and v > 1:
                self.fail(f"bool option value {v} is neither 0 nor 1")
            return bool(v) if tag == _TAG_BOOL else v
        if tag == _TAG_STR:
            return self.text()
        if tag == _TAG_BYTES:
            return self.raw(self.unpack(_U32)[0])
        if tag in (_TAG_INTS, _TAG_FLOATS):
            n = self.unpack(_U32)[0]
            if tag == _TAG_FLOATS and n == 0:
                self.fail("an empty list is stored as an int list (tag 5), not tag 6")
            return self.array("<i8" if tag == _TAG_INTS else "<f8", n).tolist()
        self.fail(f"unknown option value tag {tag}")

    def pad(self, alignment: int = 8) -> None:
        n = -self.pos % alignment
        if any(self.buf[self.take(n):self.pos]):
            self.fail("padding bytes are not zero")

    def finish(self) -> None:
        if self.pos != self.end:
            self.fail(f"{self.end - self.pos} bytes left over at the end of the section")


def decode(data) -> Segment:
    """Parse and validate segment bytes; parameters are zero-copy views of ``data``.

    Raises SegmentFormatError, and nothing else, for any input that is not a
    valid segment.
    """
    try:
        buf = memoryview(data).cast("B")
    except TypeError as e:
        raise SegmentFormatError(f"expected contiguous bytes, got {type(data).__name__}") from e
    n = len(buf)
    if bytes(buf[:8]) != MAGIC:
        raise SegmentFormatError(f"not a coralrt segment: it starts with {bytes(buf[:8])!r}, "
                                 f"not {MAGIC!r}")
    if n < HEADER_SIZE:
        raise SegmentFormatError(f"truncated: {n} bytes, the header alone is {HEADER_SIZE}")
    (_, version, flags, header_size, total, crc, n_ops, n_tensors, n_in, n_out,
     reserved) = _HEADER.unpack_from(buf)
    if version != FORMAT_VERSION:
        raise SegmentFormatError(f"format version {version} is not supported (this coralrt "
                                 f"reads version {FORMAT_VERSION}); rebuild the segment")
    if flags or reserved or header_size != HEADER_SIZE:
        raise SegmentFormatError(f"header flags {flags:#x} / reserved {reserved:#x} must be 0 "
                                 f"and header size {header_size} must be {HEADER_SIZE}")
    if total != n:
        raise SegmentFormatError(f"the header gives a total size of {total} bytes but there "
                                 f"are {n}" + ("; the segment is truncated" if n < total else ""))
    actual = zlib.crc32(buf[HEADER_SIZE:])
    if actual != crc:
        raise SegmentFormatError(f"checksum mismatch: header CRC32 {crc:#010x}, bytes "
                                 f"{HEADER_SIZE}..{n} give {actual:#010x}; the segment is "
                                 f"corrupt")
    table = _SECTIONS.unpack_from(buf, _HEADER.size)
    sections, pos = [], HEADER_SIZE
    for i, name in enumerate(SECTION_NAMES):
        off, size = table[2 * i], table[2 * i + 1]
        expected = align_up(pos, 64 if i == _PARAMS else 8)
        if off != expected or size > n - off:
            raise SegmentFormatError(f"{name} section at byte {off}, {size} bytes: it must "
                                     f"start at byte {expected} and end by byte {n}")
        if any(buf[pos:off]):
            raise SegmentFormatError(f"padding before the {name} section is not zero")
        sections.append((off, size))
        pos = off + size
    if pos != n:
        raise SegmentFormatError(f"{n - pos} bytes after the parameter section")

    r = _Reader(buf, *sections[0], "info section")
    name, compiler_id, compiler_version = r.text(), r.text(), r.text()
    r.finish()
    r = _Reader(buf, *sections[1], "io section")
    inputs, outputs = tuple(r.array("<u4", n_in).tolist()), tuple(r.array("<u4", n_out).tolist())
    r.finish()

    starts, ops = [], []
    r = _Reader(buf, *sections[2], "operator section")
    for i in range(n_ops):
        starts.append(r.pos)
        r.where = f"operator {i}"
        opcode, version, ni, no, nm, n_params = r.unpack(_OP)
        ins, outs = r.array("<i4", ni).tolist(), r.array("<u4", no).tolist()
        inter = r.array("<u4", nm).tolist()
        custom_code, custom_options = r.text(), r.raw(r.unpack(_U32)[0])
        params: dict = {}
        for _ in range(n_params):
            key = r.text(r.unpack(_U16)[0])
            if key in params:
                r.fail(f"option {key!r} appears twice")
            params[key] = r.value(r.unpack(_U8)[0])
        r.pad()
        ops.append(SegmentOp(opcode, version, tuple(ins), tuple(outs), params, tuple(inter),
                             custom_code, custom_options))
    r.finish()

    tensors = []
    r = _Reader(buf, *sections[3], "tensor section")
    for i in range(n_tensors):
        starts.append(r.pos)
        r.where = f"tensor {i}"
        tid, kind, dtype, flags, rank, qdim, nq, name_len, offset, nbytes = r.unpack(_TENSOR)
        if kind >= len(KINDS) or flags > 1:
            r.fail(f"kind {kind} is not one of 0..{len(KINDS) - 1} or flags {flags:#x} has "
                   f"bits other than 0x1 (variable)")
        shape = tuple(r.array("<u4", rank).tolist())
        scales = r.array("<f4", nq).astype(np.float32)
        zero_points = r.array("<i8", nq).astype(np.int64)
        tensors.append(SegmentTensor(tid, r.text(name_len), shape, dtype, KINDS[kind], scales,
                                     zero_points, qdim, offset, nbytes, bool(flags)))
        r.pad()
    r.finish()

    r = _Reader(buf, *sections[4], "offset table")
    recorded = r.array("<u8", len(starts)).tolist()
    r.finish()
    if recorded != starts:
        bad = next(i for i, (a, b) in enumerate(zip(recorded, starts)) if a != b)
        raise SegmentFormatError(f"offset table entry {bad} is {recorded[bad]} but that record "
                                 f"starts at byte {starts[bad]}")

    r = _Reader(buf, *sections[5], "memory plan")
    on_chip, peak, param_bytes, on_params, off_params, alignment, n_slots = r.unpack(_PLAN)
    if alignment != ACTIVATION_ALIGNMENT:
        r.fail(f"activation alignment {alignment} is not {ACTIVATION_ALIGNMENT}")
    slots = []
    for _ in range(n_slots):
        tensor, first, last, res, offset, nbytes = r.unpack(_SLOT)
        if res:
            r.fail(f"reserved slot field {res} is not 0")
        slots.append(ActivationSlot(tensor, first, last, offset, nbytes))
    r.finish()

    off, size = sections[_PARAMS]
    parameters = np.frombuffer(buf, np.uint8, size, off)
    parameters.flags.writeable = False
    seg = Segment(tensors, ops, inputs, outputs, parameters,
                  MemoryPlan(peak, param_bytes, on_params, off_params, on_chip, tuple(slots)),
                  name, compiler_id, compiler_version)
    check_segment(seg)
    attach_parameter_views(seg)
    return seg
