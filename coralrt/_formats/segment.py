"""Native Edge TPU segments: what the native compiler turns a TPU segment into.

A :class:`Segment` carries everything the simulated Edge TPU needs to run each
operator with TFLite's integer semantics: operator codes and builtin options,
tensor shapes, types and quantization (per-channel included), the constant
data in one aligned parameter blob, and the on-chip memory plan.  It is built
from a standalone model cut out by :func:`coralrt._model.extract.extract`, and
stored with :func:`encode` / :func:`decode` (byte layout in
``docs/segment-format.md``); the memory plan is in :mod:`coralrt._formats.memplan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from coralrt._formats.memplan import (
    SMALL_PARAMETER_ALIGNMENT, WEIGHT_ALIGNMENT, MemoryPlan, align_up, check_plan, plan_memory,
)
from coralrt.errors import SegmentFormatError
from coralrt._version import version
from coralrt._model.types import BUILTIN_NAMES, CUSTOM, TYPE_NAMES, Model, numpy_dtype, packed_size

__all__ = [
    "KINDS", "COMPILER_ID", "SegmentTensor",
    "SegmentOp", "Segment", "build_segment", "check_segment",
    "parameter_alignment", "attach_parameter_views", "quantization_arrays", "plain_option", "segment_ops",
]

KINDS = ("input", "output", "activation", "parameter")
COMPILER_ID = "coralrt-native"
_I32 = 2**31




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
        scales, zps, qdim = quantization_arrays(t, where)
        tensors.append(SegmentTensor(i, t.name, tuple(int(d) for d in t.shape), t.type, kind,
                                     scales, zps, qdim, 0, size, kind == "activation"
                                     and t.is_variable))
    ops = segment_ops(sg)
    blob = _layout_parameters(sg, tensors, ops)
    seg = Segment(tensors, ops, tuple(ins), tuple(outs), blob, None, sg.name, compiler_id,
                  version() if compiler_version is None else compiler_version)
    _check_structure(seg)
    plan_memory(seg)
    attach_parameter_views(seg)
    return seg


def quantization_arrays(t, where: str):
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


def segment_ops(sg) -> list[SegmentOp]:
    """The operators of subgraph ``sg`` as segment operators (options as plain values)."""
    ops = []
    for op in sg.operators:
        opts = op.custom_options
        ops.append(SegmentOp(
            op.opcode.builtin_code, op.opcode.version, tuple(op.inputs), tuple(op.outputs),
            {k: plain_option(v) for k, v in op.options.items()}, tuple(op.intermediates),
            (op.opcode.custom_code or "") if op.opcode.is_custom else "",
            b"" if opts is None else bytes(opts)))
    return ops


def plain_option(value):
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
    """Check the segment's fields, tensor ids, kinds and parameter bytes (not the plan)."""
    n = len(seg.tensors)
    if not seg.ops:
        raise SegmentFormatError("a segment needs at least one operator")
    _check_io_lists(seg, n)
    ins, outs = set(seg.inputs), set(seg.outputs)
    params = []     # (start, end, tensor id) of each parameter's bytes
    for i, t in enumerate(seg.tensors):
        where = f"tensor {i} ({t.name!r})"
        _check_tensor(t, i, ins, outs, where)
        if t.kind == "parameter":
            _check_parameter_bytes(t, len(seg.parameters), where)
            params.append((t.offset, t.offset + t.nbytes, i))
    _check_parameter_overlap(params)
    for i, op in enumerate(seg.ops):
        _check_op(op, f"operator {i} ({op.name!r})", n)


def _check_io_lists(seg: Segment, n: int) -> None:
    for name, ids in (("inputs", seg.inputs), ("outputs", seg.outputs)):
        bad = [t for t in ids if not 0 <= t < n]
        if bad or len(set(ids)) != len(ids):
            raise SegmentFormatError(f"segment {name} {list(ids)[:16]} hold ids out of range "
                                     f"0..{n - 1} or repeated ids")


def _check_tensor(t: SegmentTensor, i: int, ins: set[int], outs: set[int], where: str) -> None:
    """Check tensor ``i``'s role, then its type, shape, size and quantization."""
    _check_tensor_role(t, i, ins, outs, where)
    if t.dtype not in TYPE_NAMES or any(not 0 <= d < _I32 for d in t.shape):
        raise SegmentFormatError(f"type code {t.dtype} or shape {t.shape} is invalid",
                                 where=where)
    size = packed_size(t.dtype, t.shape)
    if size is None or size != t.nbytes:
        raise SegmentFormatError(f"holds {t.nbytes} bytes but type {t.type_name} and "
                                 f"shape {t.shape} need {size}", where=where)
    _check_quantization(t, where)


def _check_tensor_role(t: SegmentTensor, i: int, ins: set[int], outs: set[int],
                       where: str) -> None:
    """Check that tensor ``i`` has id ``i``, a kind that agrees with the segment's
    inputs ``ins`` and outputs ``outs``, and is variable only as an activation."""
    kind = "input" if i in ins else "output" if i in outs else None
    if t.id != i or t.kind not in KINDS or (kind or t.kind) != t.kind or (
            kind is None and t.kind in ("input", "output")):
        raise SegmentFormatError(f"id {t.id} / kind {t.kind!r} do not match its position "
                                 f"and the segment's input/output lists", where=where)
    if t.variable and t.kind != "activation":
        raise SegmentFormatError(f"a variable tensor must be an activation, not "
                                 f"{t.kind!r}", where=where)


def _check_parameter_bytes(t: SegmentTensor, section: int, where: str) -> None:
    """Check that a parameter's bytes are non-empty, aligned for its shape and
    inside the ``section``-byte parameter section."""
    align = parameter_alignment(t.shape)
    if (t.nbytes == 0 or t.offset < 0 or t.offset % align
            or t.offset + t.nbytes > section):
        raise SegmentFormatError(
            f"parameter bytes {t.offset}..{t.offset + t.nbytes} must be non-empty, "
            f"{align}-byte aligned and inside the {section}-byte parameter "
            f"section", where=where)


def _check_parameter_overlap(params: list[tuple[int, int, int]]) -> None:
    """Check that no two parameters' byte ranges (start, end, tensor id) overlap."""
    params.sort()
    for (_, end, a), (start, _, b) in zip(params, params[1:]):
        if start < end:
            raise SegmentFormatError(f"parameters {a} and {b} overlap in the parameter section")


def _check_op(op: SegmentOp, where: str, n: int) -> None:
    """Check an operator's tensor ids (-1 only for an omitted input) and its
    opcode, version and custom code."""
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
