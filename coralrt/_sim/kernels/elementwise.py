"""Element-wise binary operators: ADD, SUB, MUL, MAXIMUM, MINIMUM,
SQUARED_DIFFERENCE and PRELU on 8-bit quantized tensors.

Every 8-bit binary operator here maps a pair of input codes to one output
code, so the factory evaluates TFLite's reference arithmetic once for all
256 x 256 pairs and ``run`` is a single table gather over the broadcast
inputs.  The table is built with the exact integer pipeline of the
reference kernels:

* ADD / SUB: both inputs, offset by their zero points, are shifted left by
  20 bits and rescaled to twice the larger input scale (each with a
  multiplier below one), summed or subtracted, then rescaled to the output
  and clamped to the fused activation range.
* MUL: the product of the offset inputs times one multiplier of
  ``float(s1 * s2 / so)`` (computed in float, as TFLite does).
* SQUARED_DIFFERENCE (int8 only in TFLite): as SUB with a 7-bit left shift,
  then the square of the difference rescaled by ``(2 max s)^2 / (2^14 so)``.
* PRELU: the identity multiplier ``s_in / s_out`` for non-negative offset
  inputs, ``s_in * s_alpha / s_out`` times the offset alpha otherwise.
* MAXIMUM / MINIMUM compare the raw codes (no requantization).

Broadcasting follows numpy's rules, which for these element-wise functions
is what TFLite's broadcast loops compute.
"""

from __future__ import annotations

import math

import numpy as np

from coralrt._ops.arith.common import codes, refuse
from coralrt._ops.arith.fixedpoint import (
    multiply_by_quantized_multiplier, multiply_by_quantized_multiplier_smaller_than_one_exp,
    quantize_multiplier,
)
from coralrt._ops.fused import activation_range
from coralrt._sim.compiled import ops as compiled
from coralrt._sim.kernels import OpContext

__all__ = ["round_half_away"]

_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def round_half_away(x: float) -> float:
    """C's round()/roundf(): nearest integer, ties away from zero."""
    return math.copysign(math.floor(abs(x) + 0.5), x)


def _eight_bit(ctx: OpContext, *tensors, allowed=_EIGHT_BIT) -> np.dtype:
    dtype = ctx.dtype(tensors[0])
    for t in tensors:
        if ctx.dtype(t) != dtype or dtype not in allowed:
            names = " and ".join(str(np.dtype(d)) for d in allowed)
            refuse(ctx, f"only quantized {names} tensors of one type are supported, got "
                        f"{', '.join(t.type_name for t in tensors)}")
        if not len(t.scales):
            refuse(ctx, f"tensor {t.name!r} has no quantization parameters")
    return dtype


def _pair_table(fn, dtype: np.dtype, out_dtype: np.dtype) -> np.ndarray:
    """fn(a, b) over all code pairs; entry ``(ua << 8) | ub`` for the uint8 bit patterns."""
    c = codes(dtype)
    return np.ascontiguousarray(fn(c[:, None], c[None, :]).astype(out_dtype).reshape(-1))


def _table_run(table: np.ndarray, out_shape: tuple[int, ...]):
    fast = compiled.pair_table(table, out_shape)   # the coralrt[fast] extra's gather

    def run(inputs):
        if fast is not None:
            result = fast(inputs)
            if result is not None:
                return result
        a = np.asarray(inputs[0]).view(np.uint8).astype(np.uint16)
        b = np.asarray(inputs[1]).view(np.uint8)
        # np.take with the 16-bit codes: twice as fast as fancy indexing.
        return [np.take(table, (a << 8) | b).reshape(out_shape)]
    return run


def _clamp(x, lo: int, hi: int) -> np.ndarray:
    return np.minimum(np.maximum(x, lo), hi)


def _below_one(ctx: OpContext, real: float, what: str) -> tuple[int, int]:
    """QuantizeMultiplierSmallerThanOneExp.  LiteRT aborts on a multiplier of 1
    or more, except SUB's output multiplier above 1: LiteRT's (double-rounding)
    reference SUB then divides by a negative power of two, which is undefined
    and gives results that depend on each element's position in the tensor;
    the simulator does not imitate that."""
    if not 0.0 <= real < 1.0:
        refuse(ctx, f"the {what} rescaling factor {real:g} must be below 1 (LiteRT aborts "
                    f"on it, or for SUB computes undefined results); the output scale is too "
                    f"small for the input scales")
    return quantize_multiplier(real)


def add_sub(ctx: OpContext):
    x1, x2, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    dtype = _eight_bit(ctx, x1, x2, out)
    s1, s2, so = ctx.scale(x1), ctx.scale(x2), ctx.scale(out)
    z1, z2, zo = ctx.zero_point(x1), ctx.zero_point(x2), ctx.zero_point(out)
    left_shift = 20
    twice_max = 2.0 * max(s1, s2)
    m1, sh1 = _below_one(ctx, s1 / twice_max, "input 1")
    m2, sh2 = _below_one(ctx, s2 / twice_max, "input 2")
    mo, sho = _below_one(ctx, twice_max / ((1 << left_shift) * so), "output")
    lo, hi = activation_range(ctx, int(ctx.params.get("fused_activation_function", 0)), so, zo,
                              dtype)
    sign = 1 if ctx.op.name == "ADD" else -1

    def fn(a, b):
        sa = multiply_by_quantized_multiplier_smaller_than_one_exp((a - z1) << left_shift, m1, sh1)
        sb = multiply_by_quantized_multiplier_smaller_than_one_exp((b - z2) << left_shift, m2, sh2)
        raw = multiply_by_quantized_multiplier_smaller_than_one_exp(sa + sign * sb, mo, sho) + zo
        return _clamp(raw, lo, hi)

    return _table_run(_pair_table(fn, dtype, dtype), tuple(out.shape))


def mul(ctx: OpContext):
    x1, x2, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    dtype = _eight_bit(ctx, x1, x2, out)
    z1, z2, zo = ctx.zero_point(x1), ctx.zero_point(x2), ctx.zero_point(out)
    real = np.float32(ctx.scale(x1)) * np.float32(ctx.scale(x2)) / np.float32(ctx.scale(out))
    m, sh = quantize_multiplier(float(real))
    lo, hi = activation_range(ctx, int(ctx.params.get("fused_activation_function", 0)),
                              ctx.scale(out), zo, dtype)

    def fn(a, b):
        return _clamp(multiply_by_quantized_multiplier((a - z1) * (b - z2), m, sh) + zo, lo, hi)

    return _table_run(_pair_table(fn, dtype, dtype), tuple(out.shape))


def squared_difference(ctx: OpContext):
    x1, x2, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    dtype = _eight_bit(ctx, x1, x2, out, allowed=(np.dtype(np.int8),))
    s1, s2, so = ctx.scale(x1), ctx.scale(x2), ctx.scale(out)
    z1, z2, zo = ctx.zero_point(x1), ctx.zero_point(x2), ctx.zero_point(out)
    left_shift = 7
    twice_max = 2.0 * max(s1, s2)
    m1, sh1 = _below_one(ctx, s1 / twice_max, "input 1")
    m2, sh2 = _below_one(ctx, s2 / twice_max, "input 2")
    mo, sho = _below_one(ctx, twice_max * twice_max / ((1 << 2 * left_shift) * so), "output")

    def fn(a, b):
        sa = multiply_by_quantized_multiplier_smaller_than_one_exp((a - z1) << left_shift, m1, sh1)
        sb = multiply_by_quantized_multiplier_smaller_than_one_exp((b - z2) << left_shift, m2, sh2)
        d = sa - sb
        raw = multiply_by_quantized_multiplier_smaller_than_one_exp(d * d, mo, sho) + zo
        return _clamp(raw, -128, 127)

    return _table_run(_pair_table(fn, dtype, dtype), tuple(out.shape))


def prelu(ctx: OpContext):
    x, alpha, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    dtype = _eight_bit(ctx, x, alpha, out)
    si, sa, so = np.float32(ctx.scale(x)), np.float32(ctx.scale(alpha)), np.float32(ctx.scale(out))
    zi, za, zo = ctx.zero_point(x), ctx.zero_point(alpha), ctx.zero_point(out)
    m1, sh1 = quantize_multiplier(float(si / so))
    m2, sh2 = quantize_multiplier(float(si * sa / so))
    info = np.iinfo(dtype)

    def fn(a, b):
        v = a - zi
        raw = np.where(v >= 0, multiply_by_quantized_multiplier(v, m1, sh1),
                       multiply_by_quantized_multiplier(v * (b - za), m2, sh2))
        return _clamp(raw + zo, int(info.min), int(info.max))

    return _table_run(_pair_table(fn, dtype, dtype), tuple(out.shape))


def maximum_minimum(ctx: OpContext):
    x1, x2, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    dtype = ctx.dtype(out)
    if dtype is None or ctx.dtype(x1) != dtype or ctx.dtype(x2) != dtype:
        refuse(ctx, f"inputs {x1.type_name}, {x2.type_name} and output {out.type_name} must "
                    f"have one numeric type")
    pick = np.maximum if ctx.op.name == "MAXIMUM" else np.minimum
    out_shape = tuple(out.shape)

    def run(inputs):
        return [pick(inputs[0], inputs[1]).astype(dtype, copy=False).reshape(out_shape)]
    return run
