"""Native Edge TPU segments: what the native compiler turns a TPU segment into.

A :class:`Segment` carries everything the simulated Edge TPU needs to run each
operator with TFLite's integer semantics: operator codes and builtin options,
tensor shapes, types and quantization (per-channel included), the constant
data in one aligned parameter blob, and the on-chip memory plan.  It is built
from a standalone model cut out by :func:`coralrt.model.extract.extract`, and
stored with :func:`encode` / :func:`decode` (byte layout in
``docs/segment-format.md``); the memory plan is in :mod:`coralrt.compile.memplan`.
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from coralrt.compile.memplan import (
    ACTIVATION_ALIGNMENT, SMALL_PARAMETER_ALIGNMENT, WEIGHT_ALIGNMENT, ActivationSlot, MemoryPlan,
    align_up, check_plan, plan_memory,
)
from coralrt.errors import SegmentFormatError
from coralrt.model.types import BUILTIN_NAMES, CUSTOM, TYPE_NAMES, Model, numpy_dtype, packed_size

__all__ = [
    "KINDS", "COMPILER_ID", "MAGIC", "FORMAT_VERSION", "HEADER_SIZE", "SegmentTensor",
    "SegmentOp", "Segment", "build_segment", "check_segment", "encode", "decode",
    "parameter_alignment", "attach_parameter_views",
]

KINDS = ("input", "output", "activation", "parameter")
COMPILER_ID = "coralrt-native"
_I32 = 2**31


def _compiler_version() -> str:
    import coralrt
    return str(coralrt.__version__)


@dataclass(eq=False)
class SegmentTensor:
    id: int
    name: str
    shape: tuple[int, ...]
    dtype: int                      # TFLite TensorType code
    kind: str                       # one of KINDS
    scales: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    zero_points: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    quantized_dimension: int = 0
    offset: int = 0                 # parameter: in the parameter section; else on-chip offset
    nbytes: int = 0
    variable: bool = False          # state kept across inferences (LSTM), never shared
    data: np.ndarray | None = field(default=None, repr=False)  # parameters: read-only view

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.dtype, f"TYPE_{self.dtype}")

    def __eq__(self, other):
        if not isinstance(other, SegmentTensor):
            return NotImplemented
        # Quantization arrays compare bit for bit, so NaN scales survive a round trip.
        return ((self.id, self.name, tuple(self.shape), self.dtype, self.kind,
                 self.quantized_dimension, self.offset, self.nbytes, self.variable)
                == (other.id, other.name, tuple(other.shape), other.dtype, other.kind,
                    other.quantized_dimension, other.offset, other.nbytes, other.variable)
                and _same_array(self.scales, other.scales, "<f4")
                and _same_array(self.zero_points, other.zero_points, "<i8"))

    __hash__ = None


def _same_array(a: np.ndarray, b: np.ndarray, dtype: str) -> bool:
    return np.asarray(a, dtype).tobytes() == np.asarray(b, dtype).tobytes()


@dataclass
class SegmentOp:
    opcode: int                      # TFLite BuiltinOperator code (32 = CUSTOM)
    version: int
    inputs: tuple[int, ...]          # -1 marks an omitted optional input
    outputs: tuple[int, ...]
    params: dict = field(default_factory=dict)   # the builtin options
    intermediates: tuple[int, ...] = ()
    custom_code: str = ""            # for CUSTOM operators a plugin declares TPU-compatible
    custom_options: bytes = b""

    @property
    def name(self) -> str:
        if self.opcode == CUSTOM:
            return self.custom_code
        return BUILTIN_NAMES.get(self.opcode, f"BUILTIN_{self.opcode}")


@dataclass(eq=False)
class Segment:
    tensors: list[SegmentTensor]
    ops: list[SegmentOp]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    parameters: np.ndarray           # uint8, read-only; decode: a view of the input bytes
    memory: MemoryPlan | None = None
    name: str = ""
    compiler_id: str = COMPILER_ID
    compiler_version: str = ""

    def __eq__(self, other):
        if not isinstance(other, Segment):
            return NotImplemented
        return ((self.name, self.compiler_id, self.compiler_version, tuple(self.inputs),
                 tuple(self.outputs), self.ops, self.tensors, self.memory)
                == (other.name, other.compiler_id, other.compiler_version, tuple(other.inputs),
                    tuple(other.outputs), other.ops, other.tensors, other.memory)
                and self.parameters.tobytes() == other.parameters.tobytes())

    __hash__ = None

    def tensor_data(self, tensor_id: int) -> np.ndarray:
        data = self.tensors[tensor_id].data
        if data is None:
            raise KeyError(f"tensor {tensor_id} is not a parameter")
        return data


def parameter_alignment(shape) -> int:
    return WEIGHT_ALIGNMENT if len(shape) >= 2 else SMALL_PARAMETER_ALIGNMENT


# -- building ------------------------------------------------------------------------------


def build_segment(model: Model, *, compiler_id: str = COMPILER_ID,
                  compiler_version: str | None = None) -> Segment:
    """The segment of a standalone extracted model (its subgraph 0 is the segment).

    Constants become parameters laid out in order of first use, weights
    (rank >= 2) 64-byte aligned and the rest 4-byte aligned; then the memory
    plan is made.  Raises SegmentFormatError for what the format cannot hold
    and SegmentTooLargeError when the activations exceed on-chip memory.
    """
    sg = model.main
    ins, outs = list(sg.inputs), list(sg.outputs)
    tensors = []
    for i, t in enumerate(sg.tensors):
        where = f"tensor {i} ({t.name!r})"
        size = packed_size(t.type, t.shape)
        if size is None:
            raise SegmentFormatError(f"type {t.type_name} has no fixed size", where=where)
        kind = ("input" if i in ins else "output" if i in outs
                else "parameter" if t.is_constant else "activation")
        if t.is_variable and kind == "parameter":
            raise SegmentFormatError("variable tensors with an initial value are not "
                                     "supported", where=where)
        if kind == "parameter" and (t.extra.get("sparsity") or t.buffer.nbytes != size):
            raise SegmentFormatError(f"constant holds {t.buffer.nbytes} bytes, not the dense "
                                     f"{size} its type and shape need", where=where)
        scales, zps, qdim = _quantization(t, where)
        tensors.append(SegmentTensor(i, t.name, tuple(int(d) for d in t.shape), t.type, kind,
                                     scales, zps, qdim, 0, size, kind == "activation"
                                     and t.is_variable))
    ops = []
    for i, op in enumerate(sg.operators):
        opts = op.custom_options
        ops.append(SegmentOp(
            op.opcode.builtin_code, op.opcode.version, tuple(op.inputs), tuple(op.outputs),
            {k: _plain(v) for k, v in op.options.items()}, tuple(op.intermediates),
            (op.opcode.custom_code or "") if op.opcode.is_custom else "",
            b"" if opts is None else bytes(opts)))
    blob = _layout_parameters(sg, tensors, ops)
    seg = Segment(tensors, ops, tuple(ins), tuple(outs), blob, None, sg.name, compiler_id,
                  _compiler_version() if compiler_version is None else compiler_version)
    _check_structure(seg)
    plan_memory(seg)
    attach_parameter_views(seg)
    return seg


def _quantization(t, where: str):
    q = t.quantization
    if q is None or q.scale.size == 0:
        return np.zeros(0, np.float32), np.zeros(0, np.int64), 0
    scales = np.ascontiguousarray(q.scale, np.float32).reshape(-1)
    zps = np.ascontiguousarray(q.zero_point, np.int64).reshape(-1)
    if zps.size == 0:
        zps = np.zeros(scales.size, np.int64)
    if zps.size != scales.size:
        raise SegmentFormatError(f"{scales.size} scales but {zps.size} zero points",
                                 where=where)
    # The quantized dimension only means something for per-channel quantization.
    return scales, zps, int(q.quantized_dimension) if scales.size > 1 else 0


def _plain(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    return value


def _layout_parameters(sg, tensors, ops) -> np.ndarray:
    order = dict.fromkeys(t for op in ops for t in op.inputs
                          if t >= 0 and tensors[t].kind == "parameter")
    order.update(dict.fromkeys(t.id for t in tensors if t.kind == "parameter"))
    end = 0
    for t in order:
        tensors[t].offset = align_up(end, parameter_alignment(tensors[t].shape))
        end = tensors[t].offset + tensors[t].nbytes
    blob = np.zeros(end, np.uint8)
    for t in order:
        blob[tensors[t].offset:tensors[t].offset + tensors[t].nbytes] = sg.tensors[t].buffer.data
    blob.flags.writeable = False
    return blob


def attach_parameter_views(seg: Segment) -> None:
    """Point every parameter's ``data`` at its bytes in ``seg.parameters`` (no copy)."""
    for t in seg.tensors:
        if t.kind != "parameter":
            t.data = None
            continue
        raw = seg.parameters[t.offset:t.offset + t.nbytes]
        dt = numpy_dtype(t.dtype)
        if dt is not None and t.nbytes == math.prod(t.shape) * dt.itemsize:
            t.data = raw.view(dt.newbyteorder("<")).reshape(t.shape)
        else:
            t.data = raw     # sub-byte types stay packed
        t.data.flags.writeable = False


# -- validation ----------------------------------------------------------------------------


def check_segment(seg: Segment) -> None:
    """Raise SegmentFormatError unless every field, id, offset and the plan are consistent."""
    _check_structure(seg)
    if seg.memory is None:
        raise SegmentFormatError("the segment has no memory plan; run plan_memory first")
    check_plan(seg)


def _check_structure(seg: Segment) -> None:
    n = len(seg.tensors)
    if not seg.ops:
        raise SegmentFormatError("a segment needs at least one operator")
    for name, ids in (("inputs", seg.inputs), ("outputs", seg.outputs)):
        bad = [t for t in ids if not 0 <= t < n]
        if bad or len(set(ids)) != len(ids):
            raise SegmentFormatError(f"segment {name} {list(ids)[:16]} hold ids out of range "
                                     f"0..{n - 1} or repeated ids")
    ins, outs = set(seg.inputs), set(seg.outputs)
    params = []
    for i, t in enumerate(seg.tensors):
        where = f"tensor {i} ({t.name!r})"
        kind = "input" if i in ins else "output" if i in outs else None
        if t.id != i or t.kind not in KINDS or (kind or t.kind) != t.kind or (
                kind is None and t.kind in ("input", "output")):
            raise SegmentFormatError(f"id {t.id} / kind {t.kind!r} do not match its position "
                                     f"and the segment's input/output lists", where=where)
        if t.variable and t.kind != "activation":
            raise SegmentFormatError(f"a variable tensor must be an activation, not "
                                     f"{t.kind!r}", where=where)
        if t.dtype not in TYPE_NAMES or any(not 0 <= d < _I32 for d in t.shape):
            raise SegmentFormatError(f"type code {t.dtype} or shape {t.shape} is invalid",
                                     where=where)
        size = packed_size(t.dtype, t.shape)
        if size is None or size != t.nbytes:
            raise SegmentFormatError(f"holds {t.nbytes} bytes but type {t.type_name} and "
                                     f"shape {t.shape} need {size}", where=where)
        _check_quantization(t, where)
        if t.kind == "parameter":
            align = parameter_alignment(t.shape)
            if (t.nbytes == 0 or t.offset < 0 or t.offset % align
                    or t.offset + t.nbytes > len(seg.parameters)):
                raise SegmentFormatError(
                    f"parameter bytes {t.offset}..{t.offset + t.nbytes} must be non-empty, "
                    f"{align}-byte aligned and inside the {len(seg.parameters)}-byte parameter "
                    f"section", where=where)
            params.append((t.offset, t.offset + t.nbytes, i))
    params.sort()
    for (_, end, a), (start, _, b) in zip(params, params[1:]):
        if start < end:
            raise SegmentFormatError(f"parameters {a} and {b} overlap in the parameter section")
    for i, op in enumerate(seg.ops):
        where = f"operator {i} ({op.name!r})"
        ids = (*op.inputs, *op.outputs, *op.intermediates)
        if any(not -1 <= t < n for t in op.inputs) or any(
                not 0 <= t < n for t in (*op.outputs, *op.intermediates)):
            raise SegmentFormatError(f"tensor ids {list(ids)[:16]} are out of range 0..{n - 1}",
                                     where=where)
        if op.version < 1 or not 0 <= op.opcode < 2**32 or (op.opcode == CUSTOM) != bool(
                op.custom_code):
            raise SegmentFormatError(f"opcode {op.opcode} / version {op.version} / custom code "
                                     f"{op.custom_code!r} are inconsistent", where=where)


def _check_quantization(t: SegmentTensor, where: str) -> None:
    if t.scales.ndim != 1 or t.scales.shape != t.zero_points.shape:
        raise SegmentFormatError(f"{t.scales.size} scales but {t.zero_points.size} zero points",
                                 where=where)
    k = t.scales.size
    if k > 1:
        qd = t.quantized_dimension
        if not 0 <= qd < len(t.shape) or t.shape[qd] != k:
            raise SegmentFormatError(f"{k} per-channel scales along dimension {qd} of shape "
                                     f"{t.shape}", where=where)
    elif t.quantized_dimension != 0:
        raise SegmentFormatError(f"per-tensor quantization with quantized dimension "
                                 f"{t.quantized_dimension} (must be 0)", where=where)


# -- byte format (docs/segment-format.md) -------------------------------------------------

MAGIC = b"CRTSEG\0\0"
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
