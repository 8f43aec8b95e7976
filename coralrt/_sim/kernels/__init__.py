"""Integer kernels of the simulated Edge TPU ("sim kernels"), one operator family per module.

A sim kernel is a factory that an operator's spec names (its ``sim`` field,
:mod:`coralrt._ops`)::

    def add(ctx: OpContext) -> Run:
        ...                       # everything that depends only on the segment
        def run(inputs):          # inputs: list of arrays (None for omitted ones)
            return [out]          # one array per operator output
        return run

(A plugin's CPU kernel, ``fn(inputs, OpInfo)``, is another thing: it runs a
whole step outside any segment.)

The factory runs once when a segment is loaded (the "parameter upload"), so
it precomputes multipliers, weight layouts and lookup tables; ``run`` is the
per-inference path.  Every kernel reproduces TFLite's reference integer
kernels (what LiteRT runs with ``OpResolverType.BUILTIN_REF``) bit for bit;
tests/kernels compare them on generated single-operator models.

Variable tensors (LSTM state) are passed as arrays the kernel may update in
place; they persist across runs of the segment.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from coralrt.errors import ModelError
from coralrt._formats.segment import SegmentOp, SegmentTensor
from coralrt._model.types import numpy_dtype
from coralrt._ops import kernel_table

__all__ = ["OpContext", "Run", "KERNELS", "register", "kernel_for"]

Run = Callable[[list], list]

_QUANTIZED = (np.dtype(np.uint8), np.dtype(np.int8), np.dtype(np.int16))

#: Operator name -> sim kernel factory: the ``sim`` kernels of the operator
#: specs (coralrt._ops), imported on the first :func:`kernel_for`.
KERNELS: dict[str, Callable[["OpContext"], Run]] = {}
_loaded = False


def _load() -> None:
    global _loaded
    if not _loaded:
        KERNELS.update({name: factory for name, factory in kernel_table("sim").items()
                        if name not in KERNELS})
        _loaded = True


def register(*names: str):
    """Decorator: make ``factory`` the sim kernel of ``names`` in this process
    (kept for code written before the operator specs; a plugin registers its
    kernels with ``coralrt_register_ops``)."""
    def deco(factory):
        _load()
        for name in names:
            KERNELS[name] = factory
        return factory
    return deco


def kernel_for(name: str):
    """The sim kernel factory of operator ``name``, or None."""
    _load()
    return KERNELS.get(name)


@dataclass
class OpContext:
    """What a kernel factory sees of its operator."""

    op: SegmentOp
    inputs: list[SegmentTensor | None]     # None for omitted optional inputs
    outputs: list[SegmentTensor]
    intermediates: list[SegmentTensor]

    def __post_init__(self) -> None:
        # The kernels reproduce LiteRT's reference arithmetic for quantization
        # within TFLite's spec: zero points in the type's range, scales that are
        # 0 or normal float32 numbers.  Validation accepts more (LiteRT runs it),
        # but there LiteRT's int32 and int16 intermediates overflow (an ADD with
        # zero point 70000, HARD_SWISH with -300) or its float conversions hit
        # infinities (a subnormal output scale), so the simulated Edge TPU
        # declines the operator instead of answering differently.
        for t in (*self.inputs, *self.outputs):
            dt = None if t is None else numpy_dtype(t.dtype)
            if dt not in _QUANTIZED or not len(t.scales):
                continue
            info = np.iinfo(dt)
            zps = np.asarray(t.zero_points, np.int64)
            scales = np.abs(np.asarray(t.scales, np.float32))
            if zps.size and (zps.min() < info.min or zps.max() > info.max):
                raise ModelError(f"tensor {t.name!r} has zero point {zps[:4].tolist()} outside "
                                 f"the {dt} range; the simulated Edge TPU follows TFLite's "
                                 f"quantization spec", where=f"{self.op.name} operator")
            if np.any((scales > 0) & (scales < np.finfo(np.float32).tiny)):
                raise ModelError(f"tensor {t.name!r} has a subnormal scale "
                                 f"{scales[:4].tolist()}; the simulated Edge TPU follows "
                                 f"TFLite's quantization spec", where=f"{self.op.name} operator")

    @property
    def params(self) -> dict:
        return self.op.params

    def const(self, k: int) -> np.ndarray | None:
        """Input ``k``'s constant value (typed, shaped, read-only), or None."""
        t = self.inputs[k] if k < len(self.inputs) else None
        return None if t is None or t.kind != "parameter" else t.data

    def quant(self, t: SegmentTensor) -> tuple[np.ndarray, np.ndarray]:
        """(scales as float32, zero points as int64) of a tensor."""
        return np.asarray(t.scales, np.float32), np.asarray(t.zero_points, np.int64)

    def scale(self, t: SegmentTensor) -> float:
        return float(np.float32(t.scales[0])) if len(t.scales) else 0.0

    def zero_point(self, t: SegmentTensor) -> int:
        return int(t.zero_points[0]) if len(t.zero_points) else 0

    def dtype(self, t: SegmentTensor) -> np.dtype:
        return numpy_dtype(t.dtype)
