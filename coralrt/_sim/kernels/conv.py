"""Convolutions and matrix products: CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED,
TRANSPOSE_CONV.

All four reduce to integer dot products of zero-point-corrected 8-bit values,
which run exactly on the float BLAS: every partial sum is an integer, and
float32 holds integers exactly up to 2^24.  At load time each weight matrix
is split along its reduction axis into chunks whose worst-case partial sums
(largest input magnitude times the largest per-column sum of |weight|) stay
below 2^24; each chunk is one float32 GEMM and the chunks are summed in
float64.  The accumulators then go through TFLite's fixed-point
requantization (MultiplyByQuantizedMultiplier), vectorised per channel.

Which variant TFLite's reference kernels run, and so which one is
reproduced here:

* uint8 (per-tensor): ``(w - w_zp) * (x - x_zp)``; the multiplier comes from
  ``float(in_scale * w_scale)`` widened to double, divided by the output scale.
* int8: the per-channel kernels, which ignore the weights' zero point and
  compute each channel's multiplier in double from the float scales.
* FULLY_CONNECTED with int8 per-tensor weights keeps the weights' zero point, and
  its reference kernel (LiteRT 2.x) rescales with ``round(acc * double scale)``
  rather than the fixed-point multiplier (see FC_DOUBLE_ROUNDING).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from coralrt.errors import UnsupportedOperatorError
from coralrt._ops.arith.common import SAME, compute_out_size, compute_padding
from coralrt._ops.arith.parallel import for_bands
from coralrt._ops.arith.requant import DoubleRequantizer, Requantizer
from coralrt._ops.arith.scratch import TEMPORARIES
from coralrt._ops.fused import activation_range
from coralrt._sim.compiled import ops as compiled
from coralrt._sim.kernels import OpContext, Run
from coralrt._sim.kernels.gemm import (
    _BAND_ELEMENTS, _F32_EXACT, _GEMM_BAND_ELEMENTS, ExactGemm, _bias, _check_shape,
    _conv_geometry, _max_abs_input, _multiplier, _need_const, _padded_rows, _quant_setup,
    _window,
)

# Channels up to which a stride-1 depthwise convolution's einsum runs along flat
# rows of columns and channels (measured: 4x faster than along the channels at
# 32 channels, 2x at 72, 10 % slower at 480).
_ROW_EINSUM_CHANNELS = 256

__all__ = ["conv_2d", "depthwise_conv_2d", "fully_connected", "transpose_conv"]

# -- CONV_2D ---------------------------------------------------------------------------------


def conv_2d(ctx: OpContext) -> Run:
    fast = compiled.conv_2d(ctx)     # the coralrt[fast] extra's kernel, when it applies
    if fast is not None:
        return fast
    op = "CONV_2D"
    x_t, w_t, out_t = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    w = _need_const(ctx, 1, op, "filter")
    oc, kh, kw, ic = w.shape
    n, h, wd, c = x_t.shape
    if c != ic:
        raise UnsupportedOperatorError(op, detail=f"grouped convolution ({c} input channels, "
                                                  f"filters of depth {ic})")
    sh, sw, dh, dw, oh, ow, pt, pl, hp, wp = _conv_geometry(ctx, op, x_t.shape, kh, kw,
                                                            out_t.shape)
    w_offset, requant = _quant_setup(ctx, op, x_t, w_t, out_t, oc, _bias(ctx, 2, oc, op), w, 0)
    x_zp = ctx.zero_point(x_t)
    b = (w.astype(np.int64) - w_offset).reshape(oc, kh * kw * ic).T
    # The requantizer's first step (adding the bias) rides in the GEMM as one more
    # weight row against an input column of ones, when that stays exact.
    gemm = ExactGemm(b, _max_abs_input(ctx.dtype(x_t), x_zp), extra_row=requant.pre_add())
    pointwise = kh == 1 and kw == 1 and pt == 0 and pl == 0
    depth = kh * kw * c
    # Output rows per band: a band's GEMM input and accumulators stay in cache.
    band = max(1, _GEMM_BAND_ELEMENTS // max(ow * max(depth, oc), 1))

    def run(inputs):
        x = inputs[0]
        out = np.empty((n, oh, ow, oc), requant.dtype)
        src = x if sh == 1 and sw == 1 else x[:, ::sh, ::sw]

        def rows(y0, y1):
            r = (y1 - y0) * ow
            full = TEMPORARIES.array("conv.a", (r, gemm.depth), np.float32)
            a = full[:, :depth]
            if gemm.extra:
                full[:, depth] = 1
            acc = TEMPORARIES.array("conv.acc", (r, oc), gemm.dtype)
            for bi in range(n):
                if pointwise:
                    np.subtract(src[bi, y0:y1], np.float32(x_zp), out=_shaped(a, (y1 - y0, ow, c)))
                else:          # im2col from the band's padded input rows
                    buf = _padded_rows(x[bi], x_zp, pt, pl, wp, y0 * sh,
                                       (y1 - 1) * sh + (kh - 1) * dh + 1)
                    if dw == 1:    # a window row's kw taps are kw * c contiguous values
                        cols = _shaped(a, (y1 - y0, ow, kh, kw * c))
                        s0, s1, s2 = buf.strides
                        for i in range(kh):
                            cols[:, :, i] = as_strided(buf[i * dh:], shape=(y1 - y0, ow, kw * c),
                                                       strides=(s0 * sh, s1 * sw, s2),
                                                       writeable=False)
                    else:          # one tap at a time
                        cols = _shaped(a, (1, y1 - y0, ow, kh, kw, c))
                        for i in range(kh):
                            for j in range(kw):
                                cols[:, :, :, i, j, :] = _window(buf[None], i * dh, j * dw,
                                                                 y1 - y0, ow, sh, sw)
                requant(gemm(full, out=acc), out=out[bi, y0:y1].reshape(r, oc),
                        pre_added=gemm.extra)

        for_bands(oh, band, rows)
        return [out]

    return run


def _shaped(a: np.ndarray, shape) -> np.ndarray:
    """A view of ``a`` with ``shape``; raises rather than copy (writes must land in ``a``)."""
    v = a.view()
    v.shape = shape
    return v


# -- DEPTHWISE_CONV_2D -----------------------------------------------------------------------


def depthwise_conv_2d(ctx: OpContext) -> Run:
    fast = compiled.depthwise_conv_2d(ctx)
    if fast is not None:
        return fast
    op = "DEPTHWISE_CONV_2D"
    x_t, w_t, out_t = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    w = _need_const(ctx, 1, op, "filter")
    _, kh, kw, oc = w.shape
    n, h, wd, c = x_t.shape
    if c == 0 or oc % c:
        raise UnsupportedOperatorError(op, detail=f"{oc} output channels is not a multiple of "
                                                  f"{c} input channels")
    dm = oc // c          # TFLite derives the multiplier from the shapes
    sh, sw, dh, dw, oh, ow, pt, pl, hp, wp = _conv_geometry(ctx, op, x_t.shape, kh, kw,
                                                            out_t.shape)
    w_offset, requant = _quant_setup(ctx, op, x_t, w_t, out_t, oc, _bias(ctx, 2, oc, op), w, 3)
    x_zp = ctx.zero_point(x_t)
    wi = w.astype(np.int64).reshape(kh, kw, oc) - w_offset
    bound = _max_abs_input(ctx.dtype(x_t), x_zp) * int(np.abs(wi).sum(axis=(0, 1)).max())
    ftype = np.float32 if bound < _F32_EXACT else np.float64
    # The taps are summed by one einsum over a strided view of the band's padded
    # input rows, exact in any order (integer partial sums below the float
    # type's 2^24 or 2^53).  With stride 1 and up to _ROW_EINSUM_CHANNELS
    # channels, a window row's columns and channels are one flat axis of
    # ow * oc values (a tap shifts it by whole pixels), against weights tiled
    # along it, so the inner loop is long; otherwise the inner loop runs along
    # the channels.
    flat = sw == 1 and oc <= _ROW_EINSUM_CHANNELS
    wk = wi.astype(ftype)
    if flat:
        wk = np.ascontiguousarray(np.tile(wk, (1, 1, ow)))
    band = max(1, _BAND_ELEMENTS // max(ow * oc, 1))

    def run(inputs):
        x = inputs[0]
        out = np.empty((n, oh, ow, oc), requant.dtype)

        def rows(y0, y1):
            r = y1 - y0
            acc = TEMPORARIES.array("depthwise.acc", (r, ow * oc), ftype)
            for bi in range(n):
                # The band's padded input rows, made just before they are read.
                buf = _padded_rows(x[bi], x_zp, pt, pl, wp, y0 * sh,
                                   (y1 - 1) * sh + (kh - 1) * dh + 1, ftype)
                if dm > 1:
                    buf = np.repeat(buf, dm, axis=2)
                s0, s1, s2 = buf.strides
                if flat:
                    view = as_strided(buf, shape=(r, kh, kw, ow * oc),
                                      strides=(s0 * sh, s0 * dh, s1 * dw, s2), writeable=False)
                    np.einsum("rijq,ijq->rq", view, wk, out=acc)
                else:
                    view = as_strided(buf, shape=(r, ow, kh, kw, oc),
                                      strides=(s0 * sh, s1 * sw, s0 * dh, s1 * dw, s2),
                                      writeable=False)
                    np.einsum("rxijc,ijc->rxc", view, wk, out=acc.reshape(r, ow, oc))
                requant(acc.reshape(r * ow, oc), out=out[bi, y0:y1].reshape(r * ow, oc))

        for_bands(oh, band, rows)
        return [out]

    return run


# -- FULLY_CONNECTED -------------------------------------------------------------------------

# LiteRT's reference FULLY_CONNECTED (the one BUILTIN_REF runs) requantizes with
# round(acc * double scale) instead of the fixed-point multiplier; older TFLite
# releases used the fixed-point form, which False selects.
FC_DOUBLE_ROUNDING = True


def fully_connected(ctx: OpContext) -> Run:
    fast = compiled.fully_connected(ctx, FC_DOUBLE_ROUNDING)
    if fast is not None:
        return fast
    op = "FULLY_CONNECTED"
    x_t, w_t, out_t = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    p = ctx.params
    if int(p.get("weights_format", 0)) != 0:
        raise UnsupportedOperatorError(op, detail="shuffled weights are not supported")
    w = _need_const(ctx, 1, op, "weights")
    if w.ndim != 2:
        raise UnsupportedOperatorError(op, detail="weights must have rank 2")
    units, depth = w.shape
    in_dtype = ctx.dtype(x_t)
    if in_dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise UnsupportedOperatorError(op, detail=f"input type {x_t.type_name} is not uint8 "
                                                  f"or int8")
    size = int(np.prod(x_t.shape, dtype=np.int64))
    if depth == 0 or size % depth:
        raise UnsupportedOperatorError(op, detail=f"input of {size} elements does not split "
                                                  f"into rows of {depth}")
    batch = size // depth
    if p.get("keep_num_dims", False):
        want = tuple(x_t.shape[:-1]) + (units,)
    else:
        want = (batch, units)
    _check_shape(op, want, out_t.shape)

    w_scales, w_zps = ctx.quant(w_t)
    per_channel = w_scales.size > 1
    if per_channel and (in_dtype != np.dtype(np.int8) or w_scales.size != units):
        raise UnsupportedOperatorError(op, detail="per-channel weights need int8 tensors and "
                                                  "one scale per unit")
    # Per-tensor kernels keep the weights' zero point; per-channel ones assume 0.
    w_offset = 0 if per_channel else (int(w_zps[0]) if w_zps.size else 0)
    out_dtype = ctx.dtype(out_t)
    zp = ctx.zero_point(out_t)
    lo, hi = activation_range(ctx, int(p.get("fused_activation_function", 0)), ctx.scale(out_t),
                              zp, out_dtype)
    in_scale, out_scale = ctx.scale(x_t), ctx.scale(out_t)
    bias = _bias(ctx, 2, units, op)
    x_zp = ctx.zero_point(x_t)
    acc_bound = (np.abs(w.astype(np.int64) - w_offset).reshape(units, -1).sum(axis=1)
                 * _max_abs_input(in_dtype, x_zp))
    if FC_DOUBLE_ROUNDING:
        eff = float(in_scale) * w_scales.astype(np.float64) / float(out_scale)
        requant = DoubleRequantizer(eff, zp, lo, hi, out_dtype, bias, acc_bound)
    else:
        mult, shift = _multiplier(in_scale, w_scales, out_scale, float_product=not per_channel)
        requant = Requantizer(mult, shift, zp, lo, hi, out_dtype, bias, acc_bound)
    gemm = ExactGemm((w.astype(np.int64) - w_offset).T, _max_abs_input(in_dtype, x_zp))

    def run(inputs):
        a = np.subtract(inputs[0].reshape(batch, depth), np.float32(x_zp), dtype=np.float32)
        return [requant(gemm(a)).reshape(want)]

    return run


# -- TRANSPOSE_CONV --------------------------------------------------------------------------


def transpose_conv(ctx: OpContext) -> Run:
    op = "TRANSPOSE_CONV"
    x_t, w_t, out_t = ctx.inputs[2], ctx.inputs[1], ctx.outputs[0]
    w = _need_const(ctx, 1, op, "weights")
    oc, kh, kw, ic = w.shape
    n, ih, iw, c = x_t.shape
    if c != ic:
        raise UnsupportedOperatorError(op, detail=f"input depth {c} != weights depth {ic}")
    shape = ctx.const(0)
    on, oh, ow, occ = out_t.shape
    if shape is not None:
        _check_shape(op, tuple(int(v) for v in np.asarray(shape).reshape(-1)), out_t.shape)
    if occ != oc or on != n:
        raise UnsupportedOperatorError(op, detail="output shape does not match the weights")
    p = ctx.params
    sh, sw = int(p.get("stride_h", 1)), int(p.get("stride_w", 1))
    if min(sh, sw) < 1:
        raise UnsupportedOperatorError(op, detail="strides must be >= 1")
    padding = int(p.get("padding", SAME))
    # Padding as for a convolution from the output back to the input.
    pt = compute_padding(sh, 1, oh, kh, compute_out_size(padding, oh, kh, sh))
    pl = compute_padding(sw, 1, ow, kw, compute_out_size(padding, ow, kw, sw))
    w_offset, requant = _quant_setup(ctx, op, x_t, w_t, out_t, oc, _bias(ctx, 3, oc, op), w, 0)
    x_zp = ctx.zero_point(x_t)
    wi = w.astype(np.int64) - w_offset
    b = wi.transpose(3, 1, 2, 0).reshape(ic, kh * kw * oc)
    a_max = _max_abs_input(ctx.dtype(x_t), x_zp)
    gemm = ExactGemm(b, a_max)
    total = a_max * int(np.abs(wi).sum(axis=(1, 2, 3)).max(initial=0))
    ftype = np.float32 if gemm.single and total < _F32_EXACT else np.float64
    hb = max((ih - 1) * sh + kh, pt + oh)
    wb = max((iw - 1) * sw + kw, pl + ow)

    def run(inputs):
        x = inputs[2]
        a = np.subtract(x.reshape(n * ih * iw, ic), np.float32(x_zp), dtype=np.float32)
        r = gemm(a).reshape(n, ih, iw, kh, kw, oc)
        buf = np.zeros((n, hb, wb, oc), ftype)
        for i in range(kh):
            for j in range(kw):
                buf[:, i:i + (ih - 1) * sh + 1:sh, j:j + (iw - 1) * sw + 1:sw] += r[:, :, :, i, j]
        acc = buf[:, pt:pt + oh, pl:pl + ow]
        return [requant(acc)]

    return run
