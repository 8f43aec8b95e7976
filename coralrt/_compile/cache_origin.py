"""Does a compiled cache entry belong to its source model?  Its inputs and outputs say.

A cache entry's checksum and an archive's SHA-256 digests prove that bytes
arrived as they were written, not what they were compiled from: whoever
writes an archive can put another model's compiled data under a key and
recompute every digest.  What the compiled model must share with its source
is the interface a session shows: the count, order, shapes, element types
and quantization of the graph's inputs and outputs (compiling replaces
operators, never the graph's inputs and outputs).  That is checked here:

- :func:`model_io` is that interface of a parsed model (its first subgraph),
  :func:`read_io` reads it from a model's bytes without parsing the rest:
  only the root, the first subgraph and the input and output tensors are
  read, with every offset checked against the buffer, so it costs
  microseconds and touches a few pages of a memory-mapped file.
- A JIT entry's record carries its source model's interface as ``source_io``
  (:data:`RECORD_FIELD`), which ``coralrt cache import`` compares with the
  compiled data's before storing the entry.
- Every load of a cached compile compares the compiled model's interface
  with the source model's own (:func:`io_problem`).

An interface is ``{"inputs": [...], "outputs": [...]}``, each tensor as
``[shape, type name, scales, zero points, quantized dimension]``; names are
left out (a compiler may rename tensors).  Another model with exactly the
same interface is not detected: only compiling again would tell.
"""

from __future__ import annotations

import mmap
import os
import struct

from coralrt._model import load_model
from coralrt._model._schema import ENUMS
from coralrt._model.types import Model

__all__ = ["RECORD_FIELD", "model_io", "read_io", "io_problem", "check_io", "source_io"]

RECORD_FIELD = "source_io"

_TYPES = {v: k.lower() for k, v in ENUMS["TensorType"].items()}
_U16, _I32, _U32 = struct.Struct("<H"), struct.Struct("<i"), struct.Struct("<I")
# Field slots of the TFLite schema (coralrt/_model/_schema.py).
_MODEL_SUBGRAPHS = 2
_SUBGRAPH_TENSORS, _SUBGRAPH_INPUTS, _SUBGRAPH_OUTPUTS = 0, 1, 2
_TENSOR_SHAPE, _TENSOR_TYPE, _TENSOR_QUANT = 0, 1, 4
_QUANT_SCALE, _QUANT_ZERO_POINT, _QUANT_DIMENSION = 2, 3, 6


def _tensor(shape, type_code: int, scale, zero_point, axis: int) -> list:
    scale = [float(x) for x in scale]
    zero_point = [int(x) for x in zero_point]
    # The quantized dimension means nothing without per-channel parameters.
    return [[int(x) for x in shape], _TYPES.get(type_code, f"type {type_code}"), scale,
            zero_point, int(axis) if len(scale) > 1 or len(zero_point) > 1 else 0]


def model_io(model: Model) -> dict:
    """The interface (inputs and outputs of the first subgraph) of a parsed model."""
    sg = model.main

    def one(i: int) -> list:
        t = sg.tensors[i]
        q = t.quantization
        if q is None:
            return _tensor(t.shape, t.type, (), (), 0)
        return _tensor(t.shape, t.type, q.scale, q.zero_point, q.quantized_dimension)

    return {"inputs": [one(i) for i in sg.inputs], "outputs": [one(i) for i in sg.outputs]}


class _Reader:
    """Bounds-checked reads of a flatbuffer's tables and vectors."""

    def __init__(self, buf, limit: int):
        self.buf, self.size, self.left = buf, len(buf), limit

    def _check(self, pos: int, length: int) -> None:
        if pos < 0 or length < 0 or pos + length > self.size:
            raise ValueError(f"offset {pos}+{length} lies outside the {self.size}-byte model")

    def u32(self, pos: int) -> int:
        self._check(pos, 4)
        return _U32.unpack_from(self.buf, pos)[0]

    def ref(self, pos: int) -> int:
        return pos + self.u32(pos)

    def field(self, table: int, slot: int) -> int | None:
        """Where field ``slot`` of the table at ``table`` is, or None (absent)."""
        self._check(table, 4)
        vt = table - _I32.unpack_from(self.buf, table)[0]
        self._check(vt, 4)
        vt_len, obj_len = struct.unpack_from("<HH", self.buf, vt)
        entry = 4 + 2 * slot
        if entry + 2 > vt_len:
            return None
        self._check(vt, vt_len)
        off = _U16.unpack_from(self.buf, vt + entry)[0]
        if not off:
            return None
        if off >= obj_len:
            raise ValueError(f"a field lies outside its table at {table}")
        return table + off

    def vector(self, table: int, slot: int, fmt: str) -> list:
        """The numbers of a vector field (``fmt`` a struct code); [] when absent."""
        pos = self.field(table, slot)
        if pos is None:
            return []
        pos = self.ref(pos)
        n = self.u32(pos)
        self.left -= n
        if self.left < 0:
            raise ValueError("its inputs and outputs describe more values than expected")
        item = struct.calcsize(fmt)
        self._check(pos + 4, n * item)
        return list(struct.unpack_from(f"<{n}{fmt}", self.buf, pos + 4))

    def scalar(self, table: int, slot: int, fmt: str, default: int) -> int:
        pos = self.field(table, slot)
        if pos is None:
            return default
        self._check(pos, struct.calcsize(fmt))
        return struct.unpack_from(f"<{fmt}", self.buf, pos)[0]


def read_io(buf, limit: int = 1 << 20) -> dict:
    """The interface of the TFLite model in ``buf`` (bytes, memoryview or mmap),
    reading only what it needs.

    ``limit`` bounds the work: the numbers read in all (tensor indices,
    dimensions, scales, zero points).  Raises ValueError when ``buf`` is not
    a model whose first subgraph can be read, or describes more than that.
    """
    if len(buf) < 8:
        raise ValueError(f"{len(buf)} bytes is too short to be a TFLite model")
    r = _Reader(buf, limit)
    root = r.ref(0)
    pos = r.field(root, _MODEL_SUBGRAPHS)
    if pos is None:
        raise ValueError("the model has no subgraph")
    subgraphs = r.ref(pos)
    if r.u32(subgraphs) < 1:
        raise ValueError("the model has no subgraph")
    sg = r.ref(subgraphs + 4)
    pos = r.field(sg, _SUBGRAPH_TENSORS)
    tensors = None if pos is None else r.ref(pos)
    count = 0 if tensors is None else r.u32(tensors)

    def one(i: int) -> list:
        if not 0 <= i < count:
            raise ValueError(f"tensor index {i} is out of range ({count} tensors)")
        t = r.ref(tensors + 4 + 4 * i)
        shape = r.vector(t, _TENSOR_SHAPE, "i")
        type_code = r.scalar(t, _TENSOR_TYPE, "b", 0)
        pos = r.field(t, _TENSOR_QUANT)
        if pos is None:
            return _tensor(shape, type_code, (), (), 0)
        q = r.ref(pos)
        return _tensor(shape, type_code, r.vector(q, _QUANT_SCALE, "f"),
                       r.vector(q, _QUANT_ZERO_POINT, "q"),
                       r.scalar(q, _QUANT_DIMENSION, "i", 0))

    return {"inputs": [one(i) for i in r.vector(sg, _SUBGRAPH_INPUTS, "i")],
            "outputs": [one(i) for i in r.vector(sg, _SUBGRAPH_OUTPUTS, "i")]}


def _show(t: list) -> str:
    shape, dtype, scale, zero_point, axis = t
    text = f"{dtype} {shape}"
    if scale or zero_point:
        if len(scale) == 1 and len(zero_point) == 1:
            text += f" (scale {scale[0]:g}, zero point {zero_point[0]})"
        else:
            text += f" (per-channel quantization along dimension {axis})"
    return text


def io_problem(got: dict, want: dict, got_name: str = "the compiled model",
               want_name: str = "the source model") -> str | None:
    """What differs between two interfaces (the first difference), or None."""
    for side in ("inputs", "outputs"):
        g, w = got.get(side), want.get(side)
        if not isinstance(g, list) or not isinstance(w, list):
            return f"the {side} of {got_name if not isinstance(g, list) else want_name} " \
                   f"are not described"
        if len(g) != len(w):
            return f"{got_name} has {len(g)} {side}, {want_name} has {len(w)}"
        for i, (a, b) in enumerate(zip(g, w)):
            if a != b:
                name = side[:-1]
                if not (isinstance(a, list) and len(a) == 5):
                    return f"{name} {i} of {got_name} is not described"
                if not (isinstance(b, list) and len(b) == 5):
                    return f"{name} {i} of {want_name} is not described"
                return f"{name} {i} of {got_name} is {_show(a)}, of {want_name} {_show(b)}"
    return None


def check_io(data, record: dict) -> str | None:
    """Why the compiled model ``data`` does not have the interface its record
    says its source model has, or None (also None when the record does not
    say: entries that carry no ``source_io`` are checked at load only)."""
    want = record.get(RECORD_FIELD)
    if want is None:
        return None
    if not isinstance(want, dict):
        return f"its record's {RECORD_FIELD} is not a description of inputs and outputs"
    # Each number of the description takes at least one byte of the record: a
    # compiled model describing more cannot match, and is not read further.
    limit = 64 + sum(len(str(want.get(side))) for side in ("inputs", "outputs"))
    try:
        got = read_io(data, limit)
    except (ValueError, struct.error) as e:
        return f"its data is not a TFLite model whose inputs and outputs can be read ({e})"
    problem = io_problem(got, want, "its compiled model", "its source model (as its record "
                                                          "says)")
    return None if problem is None else f"it does not belong to its source model: {problem}"


def source_io(source, data: bytes | None = None, model: Model | None = None) -> dict:
    """The interface of a source model given as a Model, bytes or a path
    (``data``: its bytes when the caller has them, ``model``: parsed).

    A path is memory-mapped and only the interface is read.  A model that
    cannot be read that way is parsed whole, so that an invalid model raises
    the :class:`~coralrt.errors.ModelError` loading it gives.
    """
    if model is None and isinstance(source, Model):
        model = source
    if model is not None:
        return model_io(model)
    try:
        if data is not None or not isinstance(source, (str, os.PathLike)):
            return read_io(memoryview(data if data is not None else source))
        with open(source, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return read_io(m)
    except (OSError, ValueError, TypeError, struct.error):
        return model_io(load_model(data if data is not None else source))
