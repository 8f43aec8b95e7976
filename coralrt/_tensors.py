"""Tensor descriptions for users, and quantization helpers.

:class:`TensorInfo` is what ``InferenceSession.get_inputs()`` and
``get_outputs()`` return; :func:`tensor_infos` builds them for a subgraph,
with the shapes the file leaves out (custom operator outputs) filled in by
:mod:`coralrt._model.shapes`.  ``quantize``/``dequantize`` use TFLite's affine
mapping ``real = scale * (q - zero_point)``; rounding is half away from zero
as in TFLite's own quantize kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from coralrt.errors import InputError
from coralrt._model.shapes import inferred_shapes
from coralrt._model.types import Subgraph, Tensor

__all__ = ["TensorInfo", "tensor_infos", "check_input", "quantize", "dequantize"]


@dataclass(frozen=True)
class TensorInfo:
    """One input or output of a session.

    ``quantization`` is ``(scale, zero_point)`` for per-tensor quantized
    tensors and ``(0.0, 0)`` otherwise (the TFLite convention); ``scales``,
    ``zero_points`` and ``quantized_dimension`` carry per-channel parameters.
    ``shape_signature`` has ``-1`` where a dimension may change at run time.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    quantization: tuple[float, int] = (0.0, 0)
    scales: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), repr=False)
    zero_points: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    quantized_dimension: int = 0
    shape_signature: tuple[int, ...] = ()
    index: int = -1  # tensor index in the model's main subgraph

    @classmethod
    def from_tensor(cls, t: Tensor, index: int,
                    shape: tuple[int, ...] | None = None) -> TensorInfo:
        """The info of ``t``; ``shape`` replaces a shape the file does not declare."""
        q = t.quantization
        return cls(
            name=t.name, shape=t.shape if shape is None else shape,
            dtype=t.dtype if t.dtype is not None else np.dtype(object),
            quantization=q.params if q is not None else (0.0, 0),
            scales=np.asarray(q.scale if q is not None else [], np.float32),
            zero_points=np.asarray(q.zero_point if q is not None else [], np.int64),
            quantized_dimension=q.quantized_dimension if q is not None else 0,
            shape_signature=t.shape_signature or (t.shape if shape is None else shape),
            index=index,
        )

    @property
    def is_quantized(self) -> bool:
        return self.scales.size > 0 and bool(np.any(self.scales != 0))

    def quantize(self, x) -> np.ndarray:
        """Float values -> this tensor's integer dtype, with its own parameters."""
        if not self.is_quantized:
            raise ValueError(f"tensor {self.name!r} is not quantized")
        return quantize(x, self.scales, self.zero_points, self.dtype,
                        axis=self.quantized_dimension)

    def dequantize(self, q) -> np.ndarray:
        """Integer values of this tensor -> float32 real values."""
        if not self.is_quantized:
            return np.asarray(q, np.float32)
        return dequantize(q, self.scales, self.zero_points, axis=self.quantized_dimension)

    def to_dict(self) -> dict:
        """JSON-friendly form (used by the CLI)."""
        d = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype.name,
             "quantization": {"scale": self.quantization[0],
                              "zero_point": self.quantization[1]}}
        if self.scales.size > 1:
            d["quantization"].update(scales=self.scales.tolist(),
                                     zero_points=self.zero_points.tolist(),
                                     quantized_dimension=self.quantized_dimension)
        if self.shape_signature != self.shape:
            d["shape_signature"] = list(self.shape_signature)
        return d


def tensor_infos(sg: Subgraph, indices) -> list[TensorInfo]:
    """:class:`TensorInfo` of tensors ``indices`` of ``sg``, undeclared shapes inferred.

    The outputs of custom operators that the file declares without a shape
    (the SSD post-processing head) get the shapes their kernel sets
    (:func:`coralrt._model.shapes.inferred_shapes`); every other tensor keeps
    the shape the file gives it.
    """
    shapes = inferred_shapes(sg)
    return [TensorInfo.from_tensor(sg.tensors[i], i, shapes.get(i)) for i in indices]


def _along(p: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    if p.size <= 1:
        return p.reshape(())
    shape = [1] * ndim
    shape[axis] = p.size
    return p.reshape(shape)


def quantize(x, scale, zero_point, dtype, axis: int = 0) -> np.ndarray:
    """``clamp(round(x / scale) + zero_point)`` in ``dtype``; per-channel along ``axis``."""
    x = np.asarray(x, np.float64)
    s = _along(np.asarray(scale, np.float64), x.ndim, axis)
    zp = _along(np.asarray(zero_point, np.float64), x.ndim, axis)
    v = x / s
    q = np.sign(v) * np.floor(np.abs(v) + 0.5) + zp
    info = np.iinfo(dtype)
    return np.clip(q, info.min, info.max).astype(dtype)


def dequantize(q, scale, zero_point, axis: int = 0) -> np.ndarray:
    """``scale * (q - zero_point)`` as float32; per-channel along ``axis``."""
    q = np.asarray(q)
    s = _along(np.asarray(scale, np.float32), q.ndim, axis)
    zp = _along(np.asarray(zero_point, np.int64), q.ndim, axis)
    return (s * (q.astype(np.int64) - zp)).astype(np.float32)


def check_input(info: TensorInfo, value) -> np.ndarray:
    """``value`` as an array for input ``info`` (dtype and shape as ``run`` checks
    them; see there), or :class:`~coralrt.errors.InputError`."""
    if not isinstance(value, np.ndarray):
        value = _coerce(info, value)
    if value.dtype != info.dtype:
        if not value.dtype.isnative and value.dtype.newbyteorder("=") == info.dtype:
            # Same type, other byte order (a big-endian file): byte-swap
            # into a copy.  Off the common path, which stays one comparison.
            value = value.astype(info.dtype)
        else:
            hint = ""
            if info.is_quantized and value.dtype.kind == "f":
                hint = (f"; this input is quantized (scale {info.quantization[0]:g}, zero "
                        f"point {info.quantization[1]}): convert with "
                        f"session.get_inputs()[i].quantize(x)")
            raise InputError(f"input {info.name!r} expects dtype {info.dtype.name}, got "
                             f"{value.dtype.name}{hint}")
    if value.shape != info.shape:
        sig = info.shape_signature
        if not (len(value.shape) == len(sig)
                and all(g == -1 or d == g for d, g in zip(value.shape, sig))):
            raise InputError(f"input {info.name!r} expects shape {list(info.shape)}"
                             f"{'' if sig == info.shape else f' (signature {list(sig)})'}"
                             f", got {list(value.shape)}")
    return value


def _coerce(info: TensorInfo, value) -> np.ndarray:
    # Python scalars and lists carry no dtype of their own: take the input's,
    # but only when no value changes on the way.
    if value is None:
        raise InputError(f"input {info.name!r} is None; pass a {info.dtype.name} array of "
                         f"shape {list(info.shape)}")
    try:
        arr = np.asarray(value)
        # astype would turn a None inside a list into NaN for a float input.
        holds_none = arr.dtype.kind == "O" and any(v is None for v in arr.flat)
        cast = None if holds_none else arr.astype(info.dtype)
    except (TypeError, ValueError) as e:
        raise InputError(f"input {info.name!r}: cannot make a {info.dtype.name} array from "
                         f"{type(value).__name__} ({e})") from None
    if holds_none:
        raise InputError(f"input {info.name!r}: cannot make a {info.dtype.name} array from "
                         f"{type(value).__name__} holding None")
    if arr.dtype.kind in "iufb" and not np.array_equal(cast, arr):
        raise InputError(f"input {info.name!r}: values do not fit dtype {info.dtype.name}")
    return cast
