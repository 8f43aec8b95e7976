"""Reductions over axes: MEAN, SUM, REDUCE_MAX, REDUCE_MIN.

8-bit MEAN and SUM follow LiteRT's reference path, which for uint8 and int8
always goes through the quantized mean-or-sum kernel (there is no separate
same-scale or 4-D spatial path under the reference resolver): an int32 sum
of the raw values, minus ``input_zero_point * count``, rescaled with the
multiplier of ``double(input_scale) / double(output_scale)``.  For MEAN the
division by the element count is folded into that multiplier: it is shifted
left by ``floor(log2(count))`` (at most 32, and at most ``31 + shift``) and
divided by the count with integer division.  REDUCE_MAX/MIN need equal input
and output quantization and just pick values.

LiteRT's reference int8 SUM (as shipped in ai-edge-litert 2.3) runs the
uint8 instantiation of that kernel on the int8 bytes: values are read as
uint8, the result is clamped to [0, 255] and stored as a byte, while the
int8 zero points are used unchanged.  It is reproduced as it is, since the
simulated device must agree with the reference bit for bit.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import ModelError
from coralrt._ops.arith.fixedpoint import multiply_by_quantized_multiplier, quantize_multiplier
from coralrt._sim.kernels import OpContext

__all__ = ["reduction_axes"]


def _refuse(ctx: OpContext, detail: str):
    raise ModelError(detail, where=f"{ctx.op.name} operator")


def reduction_axes(ctx: OpContext) -> tuple[int, ...]:
    """The constant axis input, negatives resolved and duplicates dropped."""
    value = ctx.const(1)
    if value is None:
        _refuse(ctx, "the reduction axes (input 1) must be a constant")
    rank = len(ctx.inputs[0].shape)
    axes: list[int] = []
    for a in np.asarray(value).reshape(-1).tolist():
        a = a + rank if a < 0 else a
        if not 0 <= a < rank:
            _refuse(ctx, f"axis {a} is out of range for rank {rank}")
        if a not in axes:
            axes.append(a)
    return tuple(axes)


def _count(shape, axes) -> int:
    n = 1
    for a in axes:
        n *= int(shape[a])
    return n


def mean_or_sum(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    dtype = ctx.dtype(out)
    if dtype not in (np.dtype(np.uint8), np.dtype(np.int8)) or not len(x.scales) \
            or not len(out.scales):
        _refuse(ctx, "only quantized uint8 and int8 reductions are supported")
    axes = reduction_axes(ctx)
    shape = tuple(out.shape)
    n = _count(x.shape, axes)
    in_zp, out_zp = ctx.zero_point(x), ctx.zero_point(out)
    multiplier, shift = quantize_multiplier(float(ctx.scale(x)) / float(ctx.scale(out)))
    if ctx.op.name == "MEAN" and n > 0:
        up = min(n.bit_length() - 1, 32, 31 + shift)
        multiplier = (multiplier << up) // n if up >= 0 else (multiplier >> -up) // n
        shift -= up
    as_uint8 = ctx.op.name == "SUM" and dtype == np.dtype(np.int8)
    info = np.iinfo(np.uint8 if as_uint8 else dtype)
    # The int32 accumulator holds at most count * 255; wider sums would have
    # wrapped in TFLite, so wrap them the same way.
    offset = in_zp * n

    def run(inputs):
        x = np.asarray(inputs[0])
        if as_uint8:
            x = x.view(np.uint8)
        s = x.sum(axis=axes, dtype=np.int64) - offset
        s = ((s + 2**31) % 2**32) - 2**31
        y = multiply_by_quantized_multiplier(s, multiplier, shift) + out_zp
        y = np.clip(y, info.min, info.max).astype(info.dtype).reshape(shape)
        return [y.view(dtype) if as_uint8 else y]
    return run


def reduce_max_min(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    dtype = ctx.dtype(out)
    if dtype in (np.dtype(np.uint8), np.dtype(np.int8)) and (
            ctx.scale(x) != ctx.scale(out) or ctx.zero_point(x) != ctx.zero_point(out)):
        _refuse(ctx, "TFLite requires equal input and output quantization")
    axes = reduction_axes(ctx)
    shape = tuple(out.shape)
    reducer = np.max if ctx.op.name == "REDUCE_MAX" else np.min

    def run(inputs):
        return [reducer(np.asarray(inputs[0]), axis=axes).astype(dtype, copy=False)
                .reshape(shape)]
    return run
