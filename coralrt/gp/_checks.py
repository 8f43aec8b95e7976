"""Checking the operands of ``coralrt.gp`` operations before any work is queued.

Runs on the host.  Operands become C-contiguous float64 arrays; anything that
cannot be computed raises :class:`~coralrt.errors.InputError` (wrong rank or
shape, empty, not numeric, NaN or infinite values) or
:class:`~coralrt.errors.ConfigError` (an unsupported option such as ``axis``).
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import ConfigError, InputError

__all__ = ["array", "same_shape", "matmul_operands", "conv_operands", "validate"]


def array(x, name: str, *, axis=None) -> np.ndarray:
    """``x`` as a finite, non-empty float64 array."""
    if axis is not None:
        raise ConfigError(f"only whole-array reductions are supported (axis=None), "
                          f"not axis={axis!r}")
    try:
        a = np.asarray(x)
    except Exception as e:  # noqa: BLE001 - ragged lists and the like
        raise InputError(f"{name}: not an array ({e})") from None
    if a.dtype == object or not (np.issubdtype(a.dtype, np.number)
                                 or a.dtype == np.bool_):
        raise InputError(f"{name}: expected a numeric array, got dtype {a.dtype}")
    if np.iscomplexobj(a):
        raise InputError(f"{name}: complex values are not supported")
    a = np.ascontiguousarray(a, dtype=np.float64)
    if a.size == 0:
        raise InputError(f"{name}: the array is empty (shape {a.shape})")
    bad = ~np.isfinite(a)
    if bad.any():
        what = "NaN" if np.isnan(a).any() else "infinite"
        raise InputError(f"{name}: {int(bad.sum())} {what} value(s), the first at index "
                         f"{tuple(int(i) for i in np.argwhere(bad)[0])}")
    return a


def same_shape(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = array(a, "a"), array(b, "b")
    if a.shape != b.shape:
        raise InputError(f"element-wise operands differ in shape: {a.shape} and {b.shape} "
                         f"(broadcasting is not supported)")
    return a, b


def matmul_operands(a, b) -> tuple[np.ndarray, np.ndarray]:
    a, b = array(a, "a"), array(b, "b")
    if a.ndim != 2 or b.ndim != 2:
        raise InputError(f"matmul takes 2-D arrays, got shapes {a.shape} and {b.shape}")
    if a.shape[1] != b.shape[0]:
        raise InputError(f"matmul: inner dimensions differ: a is {a.shape}, b is {b.shape}")
    return a, b


def conv_operands(x, w, stride) -> tuple[np.ndarray, np.ndarray, int]:
    x, w = array(x, "x"), array(w, "w")
    if x.ndim != 2 or w.ndim != 2:
        raise InputError(f"conv2d takes a 2-D image and a 2-D kernel, got shapes {x.shape} "
                         f"and {w.shape}")
    if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
        raise ConfigError(f"stride must be a positive int, not {stride!r}")
    if w.shape[0] > x.shape[0] or w.shape[1] > x.shape[1]:
        raise InputError(f"conv2d: kernel {w.shape} larger than the image {x.shape}")
    return x, w, int(stride)


def validate(op: str, args, kwargs) -> None:
    """Check the arguments of a task now, so submit raises rather than its Future."""
    try:
        if op == "matmul":
            matmul_operands(*args, **kwargs)
        elif op == "conv2d":
            names = ("x", "w", "stride")
            given = dict(zip(names, args), **kwargs)
            conv_operands(given.get("x"), given.get("w"), given.get("stride", 1))
        elif op in ("add", "sub", "mul"):
            same_shape(*args, **kwargs)
        else:
            x = args[0] if args else kwargs.get("x")
            array(x, "x", axis=kwargs.get("axis", args[1] if len(args) > 1 else None))
    except TypeError as e:
        raise InputError(f"{op}: {e}") from None
