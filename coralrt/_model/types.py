"""The in-memory TFLite model: plain dataclasses over zero-copy buffers.

Objects point at each other directly where TFLite uses indices that only
matter on disk (an operator holds its :class:`OperatorCode`, a tensor holds
its :class:`Buffer`), and keep TFLite's indices where the graph is described
(operator inputs/outputs and subgraph inputs/outputs are tensor indices,
``-1`` meaning an omitted optional input).  The writer rebuilds the on-disk
tables from this graph, so cutting and editing models needs no index fix-ups
for buffers or opcodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from coralrt._formats.opnames import EDGETPU_OP
from coralrt._model._schema import ENUMS
from coralrt._model.extract import extract
from coralrt._model.writer import write_model

__all__ = [
    "TENSOR_TYPES", "TYPE_NAMES", "BUILTIN_CODES", "BUILTIN_NAMES", "ACTIVATIONS",
    "Buffer", "Quantization", "Tensor", "OperatorCode", "Operator", "Subgraph",
    "SignatureDef", "Metadata", "Model", "numpy_dtype", "tensor_type",
]

TENSOR_TYPES: dict[str, int] = ENUMS["TensorType"]
TYPE_NAMES: dict[int, str] = {v: k for k, v in TENSOR_TYPES.items()}
BUILTIN_CODES: dict[str, int] = ENUMS["BuiltinOperator"]
BUILTIN_NAMES: dict[int, str] = {v: k for k, v in BUILTIN_CODES.items()}
ACTIVATIONS: dict[int, str] = {v: k for k, v in ENUMS["ActivationFunctionType"].items()}
CUSTOM = BUILTIN_CODES["CUSTOM"]

_NUMPY_TYPES = {
    "FLOAT32": np.float32, "FLOAT16": np.float16, "INT32": np.int32, "UINT8": np.uint8,
    "INT64": np.int64, "BOOL": np.bool_, "INT16": np.int16, "COMPLEX64": np.complex64,
    "INT8": np.int8, "FLOAT64": np.float64, "COMPLEX128": np.complex128, "UINT64": np.uint64,
    "UINT32": np.uint32, "UINT16": np.uint16,
}
# Sub-byte types pack several elements per byte.
_ELEMENTS_PER_BYTE = {"INT4": 2, "UINT4": 2, "INT2": 4}


def numpy_dtype(type_code: int) -> np.dtype | None:
    """The numpy dtype of a TFLite tensor type, or None when numpy has none."""
    t = _NUMPY_TYPES.get(TYPE_NAMES.get(type_code, ""))
    return None if t is None else np.dtype(t)


def tensor_type(dtype) -> int:
    """The TFLite tensor type code of a numpy dtype."""
    dt = np.dtype(dtype)
    for name, t in _NUMPY_TYPES.items():
        if np.dtype(t) == dt:
            return TENSOR_TYPES[name]
    raise ValueError(f"no TFLite tensor type for numpy dtype {dt}")


def packed_size(type_code: int, shape) -> int | None:
    """Bytes a constant tensor of this type and shape occupies, or None if variable."""
    n = math.prod(shape)
    name = TYPE_NAMES.get(type_code)
    if name in _ELEMENTS_PER_BYTE:
        return -(-n // _ELEMENTS_PER_BYTE[name])
    dt = numpy_dtype(type_code)
    return None if dt is None else n * dt.itemsize


@dataclass(eq=False)
class Buffer:
    """Raw bytes of a constant tensor or metadata entry (a uint8 numpy view)."""

    data: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))

    @property
    def nbytes(self) -> int:
        return int(self.data.size)


@dataclass(eq=False)
class Quantization:
    """Affine quantization: ``real = scale * (q - zero_point)``.

    ``scale`` and ``zero_point`` have one entry per tensor, or one per slice
    along ``quantized_dimension`` for per-channel quantization.
    """

    scale: np.ndarray
    zero_point: np.ndarray
    quantized_dimension: int = 0
    min: np.ndarray | None = None
    max: np.ndarray | None = None
    details: dict | None = None
    details_type: int = 0

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1

    @property
    def params(self) -> tuple[float, int]:
        """(scale, zero_point) of a per-tensor quantization; (0.0, 0) when per-channel."""
        if self.scale.size != 1:
            return (0.0, 0)
        zp = int(self.zero_point[0]) if self.zero_point.size else 0
        return (float(self.scale[0]), zp)


@dataclass(eq=False)
class Tensor:
    name: str
    shape: tuple[int, ...]
    type: int
    buffer: Buffer | None = None
    quantization: Quantization | None = None
    shape_signature: tuple[int, ...] | None = None
    is_variable: bool = False
    has_rank: bool = False
    extra: dict = field(default_factory=dict)  # sparsity and newer fields, kept as read

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, f"TYPE_{self.type}")

    @property
    def dtype(self) -> np.dtype | None:
        return numpy_dtype(self.type)

    @property
    def is_constant(self) -> bool:
        return self.buffer is not None and self.buffer.nbytes > 0

    @property
    def data(self) -> np.ndarray | None:
        """The constant value as a read-only view of the model bytes, or None."""
        if not self.is_constant or self.dtype is None or self.extra.get("sparsity"):
            return None
        return np.frombuffer(self.buffer.data, dtype=self.dtype.newbyteorder("<")).reshape(
            self.shape)

    @property
    def nbytes(self) -> int:
        return packed_size(self.type, self.shape) or 0


@dataclass(frozen=True)
class OperatorCode:
    builtin_code: int
    custom_code: str | None = None
    version: int = 1

    @property
    def name(self) -> str:
        """The builtin operator name (``"CONV_2D"``) or, for custom ops, the custom code."""
        if self.builtin_code == CUSTOM:
            return self.custom_code or ""
        return BUILTIN_NAMES.get(self.builtin_code, f"BUILTIN_{self.builtin_code}")

    @property
    def is_custom(self) -> bool:
        return self.builtin_code == CUSTOM


@dataclass(eq=False)
class Operator:
    opcode: OperatorCode
    inputs: list[int]
    outputs: list[int]
    options: dict = field(default_factory=dict)
    options_type: str | None = None  # e.g. "Conv2DOptions"
    custom_options: memoryview | bytes | None = None
    custom_options_format: int = 0
    intermediates: list[int] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # mutating_variable_inputs, builtin_options2...

    @property
    def name(self) -> str:
        return self.opcode.name

    @property
    def version(self) -> int:
        return self.opcode.version

    def tensor_indices(self) -> list[int]:
        return [i for i in (*self.inputs, *self.outputs, *self.intermediates) if i >= 0]


@dataclass(eq=False)
class Subgraph:
    tensors: list[Tensor]
    operators: list[Operator]
    inputs: list[int]
    outputs: list[int]
    name: str = ""


@dataclass(eq=False)
class SignatureDef:
    key: str
    subgraph_index: int
    inputs: dict[str, int]
    outputs: dict[str, int]


@dataclass(eq=False)
class Metadata:
    name: str
    buffer: Buffer


@dataclass(eq=False)
class Model:
    """A TFLite model.  Build one with :func:`coralrt.load_model` or ``ModelBuilder``."""

    subgraphs: list[Subgraph]
    buffers: list[Buffer] = field(default_factory=list)
    description: str = ""
    version: int = 3
    metadata: list[Metadata] = field(default_factory=list)
    signatures: list[SignatureDef] = field(default_factory=list)
    metadata_buffer: list[int] = field(default_factory=list)
    source: bytes | None = field(default=None, repr=False)  # the bytes it was read from

    @property
    def main(self) -> Subgraph:
        return self.subgraphs[0]

    @property
    def operator_codes(self) -> list[OperatorCode]:
        """Distinct operator codes in first-use order (what the writer stores)."""
        seen: dict[OperatorCode, None] = {}
        for sg in self.subgraphs:
            for op in sg.operators:
                seen.setdefault(op.opcode, None)
        return list(seen)

    @property
    def is_edgetpu_compiled(self) -> bool:
        """True when edgetpu_compiler produced this model (it holds edgetpu-custom-op)."""
        return any(op.opcode.custom_code == EDGETPU_OP
                   for sg in self.subgraphs for op in sg.operators)

    def to_bytes(self) -> bytes:
        """Serialize to a TFLite flatbuffer."""
        return write_model(self)

    def extract(self, op_indices, subgraph: int = 0) -> Model:
        """A standalone model running only ``op_indices`` of a subgraph.

        Its inputs are the non-constant tensors the operators read but do not
        produce; its outputs are the tensors they produce that anything outside
        the cut (another operator or the model's outputs) reads.
        """
        return extract(self, op_indices, subgraph=subgraph).model
