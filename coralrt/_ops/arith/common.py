"""Small helpers kernel factories share: refusing an operator, the codes of an
8-bit type, and TFLite's convolution and pooling geometry.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import ModelError

__all__ = ["refuse", "codes", "SAME", "VALID", "compute_out_size", "compute_padding"]

# TFLite's Padding enum (Conv2DOptions, Pool2DOptions, ...).
SAME, VALID = 0, 1


def refuse(ctx: "OpContext", detail: str):
    """Raise the ModelError of an operator a kernel cannot run.  ``ctx`` is the
    factory's ``coralrt._sim.kernels.OpContext`` (a layer above; not imported)."""
    raise ModelError(detail, where=f"{ctx.op.name} operator")


def codes(dtype: np.dtype) -> np.ndarray:
    """All 256 values of an 8-bit type, in the order of their bit patterns (int64)."""
    return np.arange(256, dtype=np.uint8).view(dtype).astype(np.int64)


def compute_out_size(padding: int, size: int, filt: int, stride: int, dilation: int = 1) -> int:
    effective = (filt - 1) * dilation + 1
    if padding == SAME:
        return (size + stride - 1) // stride
    return (size + stride - effective) // stride


def compute_padding(stride: int, dilation: int, in_size: int, filt: int, out_size: int) -> int:
    """Padding before the first element (TFLite drops the odd extra one at the end)."""
    effective = (filt - 1) * dilation + 1
    total = (out_size - 1) * stride + effective - in_size
    return max(total // 2, 0)
