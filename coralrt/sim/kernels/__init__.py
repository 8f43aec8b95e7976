"""Integer kernels of the simulated Edge TPU, one operator family per module.

A kernel is a factory registered under the operator's name::

    @register("ADD")
    def add(ctx: OpContext) -> Run:
        ...                       # everything that depends only on the segment
        def run(inputs):          # inputs: list of arrays (None for omitted ones)
            return [out]          # one array per operator output
        return run

The factory runs once when a segment is loaded (the "parameter upload"), so
it precomputes multipliers, weight layouts and lookup tables; ``run`` is the
per-inference path.  Every kernel reproduces TFLite's reference integer
kernels (what LiteRT runs with ``OpResolverType.BUILTIN_REF``) bit for bit;
tests/kernels compare them on generated single-operator models.

Variable tensors (LSTM state) are passed as arrays the kernel may update in
place; they persist across runs of the segment.

May import (layer 6): errors, version, config, fileio, model, tensors,
formats, compile, and the rest of sim (not sim.stick).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from coralrt.formats.segment import SegmentOp, SegmentTensor
from coralrt.model.types import numpy_dtype

__all__ = ["OpContext", "Run", "KERNELS", "register", "kernel_for"]

Run = Callable[[list], list]

KERNELS: dict[str, Callable[["OpContext"], Run]] = {}

# Modules holding kernels; imported on first use so the registry is complete.
_MODULES = ("conv", "pool", "elementwise", "activations", "shape", "reduce", "resize", "lstm")
_loaded = False


def register(*names: str):
    def deco(factory):
        for name in names:
            KERNELS[name] = factory
        return factory
    return deco


def kernel_for(name: str):
    global _loaded
    if not _loaded:
        for module in _MODULES:
            importlib.import_module(f"{__name__}.{module}")
        _loaded = True
    return KERNELS.get(name)


@dataclass
class OpContext:
    """What a kernel factory sees of its operator."""

    op: SegmentOp
    inputs: list[SegmentTensor | None]     # None for omitted optional inputs
    outputs: list[SegmentTensor]
    intermediates: list[SegmentTensor]

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
