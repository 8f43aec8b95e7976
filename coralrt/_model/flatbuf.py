"""A generic, bounds-checked flatbuffer codec driven by the TFLite schema table.

``decode(buf)`` turns a TFLite file into nested dicts (one per table, keyed
by the schema's field names); ``encode(root)`` turns such dicts back into
flatbuffer bytes.  The layout comes from ``_schema.TABLES`` so there is no
generated class per table and no dependency on any CPU backend's bindings.

Every read is checked against the buffer length before it happens, so a
malformed file raises :class:`FlatbufferError` naming the field being read,
and no offset is followed outside the buffer.  Numeric vectors are returned as
zero-copy numpy views into the caller's buffer.  :func:`decode_root` runs the
same decoder over another schema's layout (the Edge TPU executable format).

A flatbuffer may point many offsets at one table, so a small file can describe
a huge tree; every decode draws from a :class:`DecodeBudget` proportional to
the bytes, so decoding time and memory stay linear in the file size.
"""

from __future__ import annotations

import struct

import flatbuffers
import numpy as np

from coralrt._model._schema import TABLES, UNIONS

__all__ = ["FlatbufferError", "DecodeBudget", "decode", "decode_root", "compile_layout",
           "encode", "FILE_IDENTIFIER"]

FILE_IDENTIFIER = b"TFL3"

_SCALARS = {
    "bool": struct.Struct("<?"), "int8": struct.Struct("<b"), "uint8": struct.Struct("<B"),
    "utype": struct.Struct("<B"), "int16": struct.Struct("<h"), "uint16": struct.Struct("<H"),
    "int32": struct.Struct("<i"), "uint32": struct.Struct("<I"), "int64": struct.Struct("<q"),
    "uint64": struct.Struct("<Q"), "float32": struct.Struct("<f"), "float64": struct.Struct("<d"),
}
_NP = {
    "bool": np.dtype(np.uint8), "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8),
    "int16": np.dtype("<i2"), "uint16": np.dtype("<u2"), "int32": np.dtype("<i4"),
    "uint32": np.dtype("<u4"), "int64": np.dtype("<i8"), "uint64": np.dtype("<u8"),
    "float32": np.dtype("<f4"), "float64": np.dtype("<f8"),
}
_BYTE_ELEMS = frozenset({"uint8", "int8"})
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")


def compile_layout(tables: dict) -> dict:
    """Pre-split a table dict (``_schema.TABLES`` format) for :func:`decode_root`.

    Each field becomes (name, vtable entry offset, kind, default).
    """
    return {name: tuple((f[0], 4 + 2 * f[1], f[2], f[3]) for f in fields)
            for name, fields in tables.items()}


# The TFLite table layouts, pre-split once.
_LAYOUT = compile_layout(TABLES)


class FlatbufferError(ValueError):
    """The bytes are not a well-formed flatbuffer of the expected schema."""

    def __init__(self, message: str, where: str):
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class DecodeBudget:
    """How much decoding work a buffer of ``nbytes`` bytes may cause.

    The unit is about one table decode.  Charges: 1 per table; 1 per element of
    a vector of tables or strings; 1 per string reference (each string is
    copied once, later references reuse it); 1 per numeric vector plus 1 per
    16 elements, except byte vectors (``[uint8]``/``[int8]``: buffers and
    blobs nobody walks element by element in Python) which cost 1 whatever
    their length.  Other numeric vectors are charged per element because the
    reader turns them into Python ints and validation walks them, per decode.

    Why ``4 * nbytes + 4096`` is safe for valid files: without sharing, every
    charge stands for distinct bytes of the file.  A table is reached by a
    4-byte offset and starts with a 4-byte vtable offset (2 units per 8
    bytes), a string by a 4-byte offset and has a 4-byte length (1 per 8), a
    numeric vector has an offset and a length (1 per 8) and 16 elements of at
    least one byte each (1 per 16); so an unshared file spends at most
    ``nbytes / 4`` units, 16 times less than the cap.  Sharing is legal and
    writers do it (one operator code or buffer for many entries, one string):
    any table whose subtree costs up to about 15 units may be shared by every
    offset of the file, and a large subtree may be shared a few times.  What
    the cap refuses is sharing that multiplies: a subgraph vector repeating one
    offset N times to a subgraph whose operator vector repeats one operator M
    times costs N * M units in about 4 * (N + M) bytes.  The constant lets tiny
    files share freely.  At a few microseconds per unit, a file at the cap
    costs tens of microseconds per byte.  Nested flatbuffers (DWN1 packages)
    draw from the budget of the buffer that contains them, so re-reading one
    nested buffer many times is refused too.
    """

    PER_BYTE = 4
    BASE = 4096

    __slots__ = ("left", "limit", "nbytes")

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.limit = self.left = self.PER_BYTE * nbytes + self.BASE

    @property
    def spent(self) -> int:
        return self.limit - self.left

    def spend(self, units: int, where: str) -> None:
        self.left -= units
        if self.left < 0:
            self.exhausted(where)

    def exhausted(self, where: str):
        raise FlatbufferError(
            f"decoding would take more than {self.limit} steps, the most a "
            f"{self.nbytes}-byte file can need: its offsets point many entries at the same "
            f"tables to describe a far larger model than the file holds", where)


class _Decoder:
    def __init__(self, buf, layout: dict | None = None, unions: dict | None = None,
                 budget: DecodeBudget | None = None):
        self.buf = buf
        self.size = len(buf)
        self.layout = _LAYOUT if layout is None else layout
        self.unions = UNIONS if unions is None else unions
        self.budget = DecodeBudget(self.size) if budget is None else budget
        self.strings: dict[int, str] = {}

    def _check(self, pos: int, length: int, where: str) -> None:
        if pos < 0 or length < 0 or pos + length > self.size:
            raise FlatbufferError(
                f"offset {pos}+{length} is outside the {self.size}-byte file", where)

    def _uoffset(self, pos: int, where: str) -> int:
        self._check(pos, 4, where)
        return pos + _U32.unpack_from(self.buf, pos)[0]

    def table(self, pos: int, tname: str, where: str) -> dict:
        budget = self.budget
        budget.left -= 1
        if budget.left < 0:
            budget.exhausted(where)
        self._check(pos, 4, where)
        vt = pos - _I32.unpack_from(self.buf, pos)[0]
        self._check(vt, 4, where)
        vt_len, obj_len = struct.unpack_from("<HH", self.buf, vt)
        if vt_len < 4 or vt_len % 2:
            raise FlatbufferError(f"vtable length {vt_len} is invalid", where)
        self._check(vt, vt_len, where)
        self._check(pos, obj_len, where)
        out: dict = {}
        layout = self.layout[tname]
        for name, entry, kind, default in layout:
            off = _U16.unpack_from(self.buf, vt + entry)[0] if entry < vt_len else 0
            if not off:
                if default is not None:
                    out[name] = default
                continue
            if off >= obj_len:
                raise FlatbufferError(f"field {name!r} lies outside its table", where)
            fpos = pos + off
            scalar = _SCALARS.get(kind)
            if scalar is not None:
                self._check(fpos, scalar.size, f"{where}.{name}")
                out[name] = scalar.unpack_from(self.buf, fpos)[0]
            elif kind.startswith("union:"):
                out[name] = (fpos, kind[6:])  # resolved below, needs the type tag
            else:
                out[name] = self.value(self._uoffset(fpos, f"{where}.{name}"), kind,
                                       f"{where}.{name}")
        for name, _, kind, _ in layout:
            if kind.startswith("union:") and name in out:
                fpos, union = out[name]
                member = self.unions[union].get(out.get(name + "_type", 0))
                # An unknown member comes from a newer schema: keep going without it.
                out[name] = None if member is None else self.table(
                    self._uoffset(fpos, f"{where}.{name}"), member, f"{where}.{name}")
        return out

    def value(self, pos: int, kind: str, where: str):
        if kind == "string":
            return self.string(pos, where)
        if kind.startswith("["):
            elem = kind[1:-1]
            dtype = _NP.get(elem)
            budget = self.budget
            if dtype is not None:
                n = self._vec_len(pos, dtype.itemsize, where)
                # Byte vectors stay views whatever their length; others are
                # walked per element downstream (see DecodeBudget).
                budget.left -= 1 if elem in _BYTE_ELEMS else 1 + (n >> 4)
                if budget.left < 0:
                    budget.exhausted(where)
                arr = np.frombuffer(self.buf, dtype=dtype, count=n, offset=pos + 4)
                return arr.astype(bool) if elem == "bool" else arr
            n = self._vec_len(pos, 4, where)
            budget.spend(n, where)
            if elem == "string":
                return [self.value(self._uoffset(pos + 4 + 4 * i, where), "string", f"{where}[{i}]")
                        for i in range(n)]
            return [self.table(self._uoffset(pos + 4 + 4 * i, where), elem, f"{where}[{i}]")
                    for i in range(n)]
        return self.table(pos, kind, where)

    def string(self, pos: int, where: str) -> str:
        budget = self.budget
        budget.left -= 1
        if budget.left < 0:
            budget.exhausted(where)
        s = self.strings.get(pos)
        if s is None:
            n = self._vec_len(pos, 1, where)
            try:
                s = bytes(self.buf[pos + 4:pos + 4 + n]).decode("utf-8")
            except UnicodeDecodeError as e:
                # Flatbuffer strings are UTF-8 by definition; native readers choke on others.
                raise FlatbufferError(f"string is not valid UTF-8 ({e.reason})", where) from None
            # Shared strings are copied once: memory stays within the file size.
            self.strings[pos] = s
        return s

    def _vec_len(self, pos: int, itemsize: int, where: str) -> int:
        self._check(pos, 4, where)
        n = _U32.unpack_from(self.buf, pos)[0]
        self._check(pos + 4, n * itemsize, where)
        return n


def decode(buf, budget: DecodeBudget | None = None) -> dict:
    """Decode a whole TFLite file (``bytes``/``memoryview``) into a dict tree.

    Raises :class:`FlatbufferError` when decoding would spend more than
    ``budget`` (by default a :class:`DecodeBudget` for ``len(buf)`` bytes).
    """
    if len(buf) < 8:
        raise FlatbufferError(f"{len(buf)} bytes is too short to be a TFLite model", "file")
    dec = _Decoder(buf, budget=budget)
    return dec.table(dec._uoffset(0, "root"), "Model", "model")


def decode_root(buf, root: str, layout: dict, unions: dict, where: str = "root",
                budget: DecodeBudget | None = None) -> dict:
    """Decode a flatbuffer of another schema into a dict tree.

    ``layout`` comes from :func:`compile_layout`, ``unions`` maps a union name
    to {type tag: table name}, ``root`` names the root table.  Same checks,
    zero-copy numeric vectors and budget as :func:`decode`; a flatbuffer
    nested in another buffer passes the outer buffer's budget.
    """
    if len(buf) < 8:
        raise FlatbufferError(f"{len(buf)} bytes is too short to be a flatbuffer", where)
    dec = _Decoder(buf, layout, unions, budget)
    return dec.table(dec._uoffset(0, where), root, where)


# ---------------------------------------------------------------------------
# encoding


def _create_vector(b: flatbuffers.Builder, elem: str, items) -> int:
    dtype = _NP.get(elem)
    if dtype is not None:
        data = np.ascontiguousarray(np.asarray(items), dtype=dtype)
        return _create_bytes(b, data.tobytes(), dtype.itemsize, len(data),
                             16 if elem in ("uint8", "int8") else dtype.itemsize)
    if elem == "string":
        offs = [b.CreateString(s) for s in items]
    else:
        offs = [_encode_table(b, elem, t) for t in items]
    b.StartVector(4, len(offs), 4)
    for off in reversed(offs):
        b.PrependUOffsetTRelative(off)
    return _end_vector(b, len(offs))


def _create_bytes(b: flatbuffers.Builder, data: bytes, itemsize: int, count: int,
                  alignment: int) -> int:
    # Byte vectors are copied in one slice instead of element by element, and
    # aligned to 16 bytes like the TFLite converter does, so constant tensors
    # can be used in place by SIMD kernels.
    b.StartVector(itemsize, count, alignment)
    b.head = b.head - len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    return _end_vector(b, count)


def _end_vector(b: flatbuffers.Builder, count: int) -> int:
    try:
        return b.EndVector()
    except TypeError:  # flatbuffers < 2.0 wants the element count
        return b.EndVector(count)


_PREPEND = {
    "bool": "PrependBoolSlot", "int8": "PrependInt8Slot", "uint8": "PrependUint8Slot",
    "utype": "PrependUint8Slot", "int16": "PrependInt16Slot", "uint16": "PrependUint16Slot",
    "int32": "PrependInt32Slot", "uint32": "PrependUint32Slot", "int64": "PrependInt64Slot",
    "uint64": "PrependUint64Slot", "float32": "PrependFloat32Slot",
    "float64": "PrependFloat64Slot",
}


def _encode_table(b: flatbuffers.Builder, tname: str, obj: dict) -> int:
    fields = TABLES[tname]
    children: list[tuple[int, int]] = []
    for name, slot, kind, _ in fields:
        value = obj.get(name)
        if value is None or kind in _PREPEND:
            continue
        if kind == "string":
            children.append((slot, b.CreateString(value)))
        elif kind.startswith("["):
            children.append((slot, _create_vector(b, kind[1:-1], value)))
        elif kind.startswith("union:"):
            member = UNIONS[kind[6:]].get(obj.get(name + "_type", 0))
            if member is not None:
                children.append((slot, _encode_table(b, member, value)))
        else:
            children.append((slot, _encode_table(b, kind, value)))
    b.StartObject(len(fields) and max(f[1] for f in fields) + 1)
    for name, slot, kind, default in fields:
        prepend = _PREPEND.get(kind)
        value = obj.get(name)
        if prepend is not None and value is not None:
            getattr(b, prepend)(slot, value, default if default is not None else 0)
    for slot, off in children:
        b.PrependUOffsetTRelativeSlot(slot, off, 0)
    return b.EndObject()


def encode(model: dict, size_hint: int = 1024) -> bytes:
    """Encode a ``Model`` dict tree into TFLite flatbuffer bytes."""
    b = flatbuffers.Builder(size_hint)
    root = _encode_table(b, "Model", model)
    b.Finish(root, file_identifier=FILE_IDENTIFIER)
    return bytes(b.Output())
