"""8-bit operators the Edge TPU does not have, for the CPU backends: GELU, ABS
and LEAKY_RELU on quantized tensors.

Like the unary activations of :mod:`coralrt._sim.kernels.activations` (whose
table helpers they use), each maps an input code to one output code, so the
factory evaluates TFLite's reference arithmetic for the 256 codes and ``run``
is a table lookup:

* GELU: TFLite's LUTPopulate of the exact form ``0.5 x erfc(-x / sqrt 2)``
  (C library ``erfcf``) or, with ``approximate``, the tanh form, in float32.
* ABS (int8 only, as in TFLite): ``|q - zp_in|`` rescaled by
  ``MultiplyByQuantizedMultiplier`` unless the scales are equal.
* LEAKY_RELU: ``q - zp_in`` rescaled with ``s_in / s_out`` (non-negative) or
  ``alpha * s_in / s_out`` (negative).

The formulas were matched against LiteRT's ``BUILTIN_REF`` on every code for
300 random scale sets each.  None is registered for the simulated Edge TPU;
the NumPy CPU backend (:mod:`coralrt._backends.numpy_backend`) runs them.
"""

from __future__ import annotations

import math

import numpy as np

from coralrt._ops.arith.common import codes, refuse
from coralrt._ops.arith.fixedpoint import multiply_by_quantized_multiplier, quantize_multiplier
from coralrt._sim.kernels import OpContext
from coralrt._sim.kernels.activations import (
    _EIGHT_BIT, _float_lut, _float_map, _lut, _lut_run, _same_type, _tanh,
)

__all__ = ["abs_int8", "gelu_8bit", "leaky_relu_8bit"]

_SQRT_HALF = np.float32(math.sqrt(0.5))
_SQRT_2_OVER_PI = np.float32(math.sqrt(2.0 / math.pi))


def _gelu_exact(v: np.ndarray) -> np.ndarray:
    # 0.5 x erfc(-x / sqrt(2)), all in float32 with the C library's erfcf.
    erfc = _float_map("erfcf", (v * -_SQRT_HALF).astype(np.float32),
                      lambda d: np.array([math.erfc(x) for x in d]))
    return (np.float32(0.5) * v) * erfc


def _gelu_approximate(v: np.ndarray) -> np.ndarray:
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in float32.
    inner = _SQRT_2_OVER_PI * (v + np.float32(0.044715) * v * v * v)
    return (np.float32(0.5) * v) * (np.float32(1.0) + _tanh(inner.astype(np.float32)))


def gelu_8bit(ctx: OpContext):
    """GELU on uint8/int8 tensors as TFLite's reference kernel computes it: the
    LUTPopulate table of the exact (erfc) or ``approximate`` (tanh) form.  Not
    registered for the simulated Edge TPU, which has no GELU; the NumPy CPU
    backend runs it."""
    _same_type(ctx)
    form = _gelu_approximate if ctx.params.get("approximate", False) else _gelu_exact
    with np.errstate(over="ignore", invalid="ignore"):
        return _lut_run(_float_lut(ctx, form), tuple(ctx.outputs[0].shape))


def _one_scale(ctx: OpContext, dtypes, what: str) -> np.dtype:
    x, out = ctx.inputs[0], ctx.outputs[0]
    dtype = ctx.dtype(x)
    if dtype not in dtypes or ctx.dtype(out) != dtype or len(x.scales) != 1 \
            or len(out.scales) != 1:
        refuse(ctx, f"{x.type_name} -> {out.type_name}: {what}")
    return dtype


def _rescaled(v: np.ndarray, real: float) -> np.ndarray:
    multiplier, shift = quantize_multiplier(real)
    return np.asarray(multiply_by_quantized_multiplier(v, multiplier, shift), np.int64)


def abs_int8(ctx: OpContext):
    """ABS of a quantized int8 tensor (TFLite has no uint8 ABS): ``|q - zp_in|``,
    rescaled by ``MultiplyByQuantizedMultiplier`` with the multiplier of
    ``double(s_in) / double(s_out)`` unless the scales are equal, plus the output
    zero point, clamped.  Not registered for the simulated Edge TPU."""
    dtype = _one_scale(ctx, (np.dtype(np.int8),), "per-tensor quantized INT8 ABS only")
    x, out = ctx.inputs[0], ctx.outputs[0]
    v = np.abs(codes(dtype) - ctx.zero_point(x))
    if ctx.scale(x) != ctx.scale(out):
        v = _rescaled(v, float(np.float64(ctx.scale(x)) / np.float64(ctx.scale(out))))
    return _lut_run(_lut(v + ctx.zero_point(out), dtype), tuple(out.shape))


def leaky_relu_8bit(ctx: OpContext):
    """LEAKY_RELU of a quantized 8-bit tensor: ``q - zp_in`` rescaled by
    ``MultiplyByQuantizedMultiplier`` with the multiplier of ``s_in / s_out``
    (non-negative values) or ``alpha * s_in / s_out`` (negative ones), both in
    double, plus the output zero point, clamped.  Not registered for the
    simulated Edge TPU."""
    dtype = _one_scale(ctx, _EIGHT_BIT, "per-tensor quantized 8-bit LEAKY_RELU only")
    x, out = ctx.inputs[0], ctx.outputs[0]
    ratio = np.float64(ctx.scale(x)) / np.float64(ctx.scale(out))
    alpha = np.float64(np.float32(ctx.params.get("alpha", 0.0) or 0.0))
    v = codes(dtype) - ctx.zero_point(x)
    rescaled = np.where(v >= 0, _rescaled(v, float(ratio)), _rescaled(v, float(alpha * ratio)))
    return _lut_run(_lut(rescaled + ctx.zero_point(out), dtype), tuple(out.shape))
