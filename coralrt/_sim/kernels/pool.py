"""Pooling: AVERAGE_POOL_2D and MAX_POOL_2D on uint8 and int8 tensors.

TFLite's reference kernels only look at the part of each window inside the
input (padding contributes nothing and does not count), work on the raw
integers (input and output share their quantization), and clamp to the
fused activation range of the output.  The average divides the integer sum
by the number of elements with rounding half away from zero.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import UnsupportedOperatorError
from coralrt._ops.arith.common import compute_out_size, compute_padding
from coralrt._ops.fused import activation_range
from coralrt._sim.kernels import OpContext, Run

__all__: list[str] = []


def _geometry(ctx: OpContext, op: str):
    x_t, out_t = ctx.inputs[0], ctx.outputs[0]
    dtype = ctx.dtype(x_t)
    if dtype not in (np.dtype(np.uint8), np.dtype(np.int8)) or ctx.dtype(out_t) != dtype:
        raise UnsupportedOperatorError(op, detail=f"{x_t.type_name} -> {out_t.type_name}: only "
                                                  f"uint8 and int8 are supported")
    if len(x_t.shape) != 4:
        raise UnsupportedOperatorError(op, detail="input must have rank 4")
    p = ctx.params
    sh, sw = int(p.get("stride_h", 1)), int(p.get("stride_w", 1))
    fh, fw = int(p.get("filter_height", 1)), int(p.get("filter_width", 1))
    if min(sh, sw, fh, fw) < 1:
        raise UnsupportedOperatorError(op, detail="strides and filter sizes must be >= 1")
    padding = int(p.get("padding", 0))
    n, h, w, c = x_t.shape
    oh, ow = compute_out_size(padding, h, fh, sh), compute_out_size(padding, w, fw, sw)
    if tuple(out_t.shape) != (n, oh, ow, c):
        raise UnsupportedOperatorError(op, detail=f"output shape {tuple(out_t.shape)} does not "
                                                  f"match the {(n, oh, ow, c)} the options give")
    pt, pl = compute_padding(sh, 1, h, fh, oh), compute_padding(sw, 1, w, fw, ow)
    lo, hi = activation_range(ctx, int(p.get("fused_activation_function", 0)), ctx.scale(out_t),
                              ctx.zero_point(out_t), dtype)
    return dtype, (n, h, w, c), (sh, sw, fh, fw), (oh, ow, pt, pl), (lo, hi)


def _clipped_counts(out: int, stride: int, pad: int, filt: int, size: int) -> np.ndarray:
    origin = np.arange(out) * stride - pad
    start = np.maximum(0, -origin)
    end = np.minimum(filt, size - origin)
    return np.maximum(end - start, 0)


def average_pool_2d(ctx: OpContext) -> Run:
    dtype, (n, h, w, c), (sh, sw, fh, fw), (oh, ow, pt, pl), (lo, hi) = \
        _geometry(ctx, "AVERAGE_POOL_2D")
    counts = np.multiply.outer(_clipped_counts(oh, sh, pt, fh, h),
                               _clipped_counts(ow, sw, pl, fw, w)).astype(np.int64)
    if (counts == 0).any():
        raise UnsupportedOperatorError("AVERAGE_POOL_2D",
                                       detail="a pooling window lies entirely in the padding")
    counts = counts[None, :, :, None]
    half = counts // 2
    signed = dtype == np.dtype(np.int8)
    # The window sums come from an integral image over the zero-padded input:
    # I[y, x] = sum of rows < y and columns < x, with a leading row and column of 0.
    hp = (oh - 1) * sh + fh
    wp = (ow - 1) * sw + fw
    hh, ww = max(min(h, hp - pt), 0), max(min(w, wp - pl), 0)
    acc_type = np.int32 if 255 * hp * wp < 2**31 else np.int64

    # One window covering the whole input (a global average pool): a plain sum.
    whole = oh == 1 and ow == 1 and pt == 0 and pl == 0

    def run(inputs):
        x = inputs[0]
        if whole:
            acc = x[:, :hh, :ww].sum(axis=(1, 2), dtype=np.int64, keepdims=True)
            return [_average(acc)]
        integral = np.zeros((n, hp + 1, wp + 1, c), acc_type)
        integral[:, 1 + pt:1 + pt + hh, 1 + pl:1 + pl + ww] = x[:, :hh, :ww]
        np.cumsum(integral, axis=1, out=integral)
        np.cumsum(integral, axis=2, out=integral)
        ys, xs = slice(0, (oh - 1) * sh + 1, sh), slice(0, (ow - 1) * sw + 1, sw)
        ye, xe = slice(fh, fh + (oh - 1) * sh + 1, sh), slice(fw, fw + (ow - 1) * sw + 1, sw)
        acc = (integral[:, ye, xe].astype(np.int64) - integral[:, ys, xe]
               - integral[:, ye, xs] + integral[:, ys, xs])
        return [_average(acc)]

    def _average(acc):
        """Window sums -> averages rounded half away from zero, clamped."""
        if signed:
            neg = acc < 0
            np.abs(acc, out=acc)
            acc += half
            acc //= counts
            np.negative(acc, out=acc, where=neg)
        else:
            acc += half
            acc //= counts
        np.clip(acc, lo, hi, out=acc)
        return acc.astype(dtype)

    return run


def max_pool_2d(ctx: OpContext) -> Run:
    dtype, (n, h, w, c), (sh, sw, fh, fw), (oh, ow, pt, pl), (lo, hi) = \
        _geometry(ctx, "MAX_POOL_2D")
    # Padding holds the type's minimum, which never beats a real element; the
    # reference starts from that value too, so fully padded windows agree.
    fill = np.iinfo(dtype).min
    hp = (oh - 1) * sh + fh
    wp = (ow - 1) * sw + fw
    hh, ww = max(min(h, hp - pt), 0), max(min(w, wp - pl), 0)
    plain = pt == 0 and pl == 0 and hh == hp and ww == wp

    def run(inputs):
        x = inputs[0]
        if plain:
            buf = x
        else:
            buf = np.full((n, hp, wp, c), fill, dtype)
            buf[:, pt:pt + hh, pl:pl + ww] = x[:, :hh, :ww]
        # Separable: the maximum over columns of each window, then over rows.
        rows = None
        for j in range(fw):
            v = buf[:, :, j:j + (ow - 1) * sw + 1:sw]
            rows = v.copy() if rows is None else np.maximum(rows, v, out=rows)
        out = None
        for i in range(fh):
            v = rows[:, i:i + (oh - 1) * sh + 1:sh]
            out = v.copy() if out is None else np.maximum(out, v, out=out)
        np.clip(out, lo, hi, out=out)
        return [out]

    return run
