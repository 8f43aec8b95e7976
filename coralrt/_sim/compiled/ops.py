"""Kernel factories over the compiled loops: ``conv_2d(ctx)``, ``depthwise_conv_2d(ctx)``
and ``fully_connected(ctx)`` return a sim kernel's ``run``, or None when the NumPy
kernel is to run instead (compiled kernels off or unavailable, or an operator
outside what the loops reproduce exactly).  They never raise for a model the
NumPy kernel would refuse: they leave it to the NumPy kernel, which raises
the usual error.

What the loops need from the operator is what the NumPy kernels use
(coralrt/_sim/kernels/gemm.py): the geometry, the weights with their offset
(uint8: the weights' zero point; int8: none, as the per-channel reference
kernels ignore it), and the fixed-point multipliers of
``GetQuantizedConvolutionMultipler`` (float32 scale product for uint8, double
for int8) as right shifts; multipliers above 1 stay with the NumPy kernel.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import CoralRTError
from coralrt._ops.arith.requant import may_wrap
from coralrt._ops.fused import activation_range
from coralrt._sim.compiled import jit
from coralrt._sim.kernels import OpContext, Run
from coralrt._ops.arith.scratch import TEMPORARIES
from coralrt._sim.kernels.gemm import (
    _F32_EXACT, _bias, _conv_geometry, _max_abs_input, _multiplier,
)

__all__ = ["conv_2d", "depthwise_conv_2d", "fully_connected", "pair_table", "softmax"]

_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))

#: Sums whose partial sums stay below this (2^24) are exact in float32 and may
#: run there (the 3x3 depthwise loop); above it the int32 loops run.
F32_EXACT = _F32_EXACT

#: int16 pairs of a convolution band's rows (128 KiB): the band stays in the
#: cache while every block of columns reads it.
_PAIR_BAND = 1 << 15


def _runner(loop, args: tuple, shape, dtype):
    """A step that runs the compiled ``loop(x, *args, out)`` into a new output array."""
    def run(inputs):
        out = np.empty(shape, dtype)
        loop(_plain(inputs[0]), *args, out)
        return [out]

    return run


def _plain(x: np.ndarray) -> np.ndarray:
    """``x`` as a writeable C-contiguous array, the layout the loops were compiled
    for (a read-only or strided input would make numba compile another variant
    on first use)."""
    if x.flags.c_contiguous and x.flags.writeable:
        return x
    return np.array(x, order="C")


def _setup(ctx: OpContext, w: np.ndarray, channel_axis: int, bias_index: int):
    """The loops' operands (weights minus offset as int64; bias, multipliers, right
    shifts, zero points and bounds as int32), or None for the NumPy kernel."""
    x_t, w_t, out_t = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    in_dtype, out_dtype = ctx.dtype(x_t), ctx.dtype(out_t)
    if in_dtype not in _EIGHT_BIT or out_dtype != in_dtype:
        return None
    channels = w.shape[channel_axis]
    w_scales, w_zps = ctx.quant(w_t)
    uint8 = in_dtype == np.dtype(np.uint8)
    if w_scales.size not in (1, channels) or (uint8 and w_scales.size > 1):
        return None
    mult, shift = _multiplier(ctx.scale(x_t), w_scales[:1] if uint8 else w_scales,
                              ctx.scale(out_t), float_product=uint8)
    full = np.ones(channels, np.int64)
    shift = shift.astype(np.int64) * full
    if (shift < -31).any() or (shift > 30).any():
        return None
    zp = ctx.zero_point(out_t)
    lo, hi = activation_range(ctx, int(ctx.params.get("fused_activation_function", 0)),
                              ctx.scale(out_t), zp, out_dtype)
    w_offset = int(w_zps[0]) if uint8 and w_zps.size else 0
    bias = _bias(ctx, bias_index, channels, "")
    bias = np.zeros(channels, np.int64) if bias is None else bias.astype(np.int64)
    # A multiplier above 1 shifts the sum left before the high multiplication
    # (MultiplyByQuantizedMultiplier's ``x * (1 << left_shift)``): folded into the
    # weights and the bias, so the loops only ever shift right.  Exact while the
    # shifted sum stays within int32, which the bound below checks.
    left = np.left_shift(1, np.maximum(shift, 0))
    wi = (w.astype(np.int64) - w_offset) * left.reshape(
        [-1 if a == channel_axis else 1 for a in range(w.ndim)])
    bias = bias * left
    x_zp = ctx.zero_point(x_t)
    acc_bound = (np.abs(np.moveaxis(wi, channel_axis, 0).reshape(channels, -1)).sum(axis=1)
                 * _max_abs_input(in_dtype, x_zp))
    if may_wrap(bias, acc_bound):        # the int32 accumulator could wrap: NumPy kernel
        return None
    i32 = np.int32
    return dict(w=wi, bias=bias.astype(i32), m=(mult * full).astype(i32),
                rs=np.maximum(-shift, 0).astype(i32), zp=i32(zp), lo=i32(lo), hi=i32(hi),
                x_zp=i32(x_zp), dtype=out_dtype)


def conv_2d(ctx: OpContext) -> Run | None:
    loops = jit()
    if loops is None:
        return None
    x_t, out_t = ctx.inputs[0], ctx.outputs[0]
    w = ctx.const(1)
    if w is None or w.ndim != 4 or w.shape[3] != x_t.shape[3]:
        return None
    oc, kh, kw, _ = w.shape
    try:
        sh, sw, dh, dw, oh, ow, pt, pl, _, _ = _conv_geometry(ctx, "CONV_2D", x_t.shape, kh, kw,
                                                              out_t.shape)
        q = _setup(ctx, w, 0, 2)
    except CoralRTError:                 # the NumPy kernel raises it again, with context
        return None
    if q is None or np.abs(q["w"]).max(initial=0) > np.iinfo(np.int16).max:   # int16 pairs
        return None
    return _pair_gemm_conv(loops, q, tuple(out_t.shape), (kh, kw, sh, sw, dh, dw, pt, pl))


def _pair_gemm_conv(loops, q, shape, geometry) -> Run:
    """The convolution as an integer GEMM per band of output rows: the windows as
    rows of int16 (``x - x_zp``, laid out by a compiled im2col, or converted as
    they are for 1x1 windows), their int32 sums with the weights in blocks of
    ROWS x COLS (:mod:`._simd`), each block requantized as it is finished."""
    kh, kw, sh, sw, dh, dw, pt, pl = geometry
    rows_, cols = loops.ROWS, loops.COLS
    w = q["w"]                                                    # (oc, kh, kw, c)
    oc = w.shape[0]
    depth = kh * kw * w.shape[3]
    kp = (depth + 1) // 2                                         # int16 pairs per row
    n_pad = -(-oc // cols) * cols
    wk = np.zeros((2 * kp, n_pad), np.int16)
    wk[:depth, :oc] = w.transpose(1, 2, 3, 0).reshape(depth, oc)  # int16 (conv_2d checks)
    # Block-major: each block of `cols` columns holds its kp steps contiguously,
    # so a block streams through memory in order; a step is (cols, 2) weights
    # for the paired form, (2, cols) for the other (see _simd).
    steps = wk.reshape(kp, 2, n_pad // cols, cols)
    b = np.ascontiguousarray(steps.transpose(2, 0, 3, 1) if loops.PAIRED
                             else steps.transpose(2, 0, 1, 3)).reshape(-1)
    n, oh, ow, _ = shape
    pointwise = kh == 1 and kw == 1 and pt == 0 and pl == 0
    band = max(1, _PAIR_BAND // max(ow * kp, 1))                  # output rows per band
    req = (q["bias"], q["m"], q["rs"], q["zp"], q["lo"], q["hi"])
    x_zp, dtype = q["x_zp"], q["dtype"]
    to_int16, im2col, gemm = loops.rows_int16, loops.im2col_int16, loops.gemm_requant

    def run(inputs):
        x = inputs[0]
        if pointwise and (sh != 1 or sw != 1):
            x = x[:, ::sh, ::sw]
        x = _plain(x)
        out = np.empty(shape, dtype)
        flat = out.reshape(n, oh * ow * oc)
        for bi in range(n):
            for y0 in range(0, oh, band):
                y1 = min(oh, y0 + band)
                r = (y1 - y0) * ow
                a = TEMPORARIES.array("compiled.a", (-(-r // rows_) * rows_, 2 * kp), np.int16)
                if pointwise:
                    to_int16(x[bi, y0:y1].reshape(r, depth), x_zp, a)
                else:
                    im2col(x, bi, y0, y1, ow, kh, kw, sh, sw, dh, dw, pt, pl, x_zp, a)
                gemm(a.view(np.int32), r, b, oc, n_pad, *req, flat[bi, y0 * ow * oc:y1 * ow * oc])
        return [out]

    return run


def depthwise_conv_2d(ctx: OpContext) -> Run | None:
    loops = jit()
    if loops is None:
        return None
    x_t, out_t = ctx.inputs[0], ctx.outputs[0]
    w = ctx.const(1)
    if w is None or w.ndim != 4:
        return None
    _, kh, kw, oc = w.shape
    c = x_t.shape[3]
    if c == 0 or oc % c:
        return None
    try:
        sh, sw, dh, dw, oh, ow, pt, pl, _, _ = _conv_geometry(ctx, "DEPTHWISE_CONV_2D",
                                                              x_t.shape, kh, kw, out_t.shape)
        q = _setup(ctx, w, 3, 2)
    except CoralRTError:
        return None
    if q is None:
        return None
    wt = np.ascontiguousarray(q["w"].reshape(kh, kw, oc), np.int32)
    shape = tuple(out_t.shape)
    if kh == 3 and kw == 3 and oc == c:
        taps = wt.reshape(9, oc).astype(np.int64)
        wsum = taps.sum(axis=0)
        bias = q["bias"].astype(np.int64)
        # float32 is exact when every partial sum stays an integer below 2^24: inside
        # the input, of bias - x_zp * sum(w) + sum(x * w) (|x| <= 255 or 128); at the
        # borders, of bias + sum((x - x_zp) * w) (|x - x_zp| <= 255).
        x_abs = 255 if q["dtype"] == np.dtype(np.uint8) else 128
        w_abs = np.abs(taps).sum(axis=0)
        worst = np.maximum(np.abs(bias - int(q["x_zp"]) * wsum) + x_abs * w_abs,
                           np.abs(bias) + 255 * w_abs)
        if worst.max(initial=0) < F32_EXACT:
            args = (np.ascontiguousarray(taps, np.float32), bias.astype(np.float32),
                    wsum.astype(np.float32), q["x_zp"], sh, sw, dh, dw, pt, pl, q["m"], q["rs"],
                    q["zp"], q["lo"], q["hi"])
            return _runner(loops.depthwise_3x3, args, shape, q["dtype"])
    args = (wt, q["bias"], q["x_zp"], oc // c, sh, sw, dh, dw, pt, pl, q["m"], q["rs"],
            q["zp"], q["lo"], q["hi"])
    depthwise, dtype = loops.depthwise_conv_2d, q["dtype"]

    return _runner(depthwise, args, shape, dtype)


def fully_connected(ctx: OpContext, double_rounding: bool = True) -> Run | None:
    """``double_rounding``: the reference kernel's ``round(acc * double scale)``
    (LiteRT 2.x); the fixed-point form is left to the NumPy kernel."""
    loops = jit()
    if loops is None or not double_rounding:
        return None
    x_t, w_t, out_t = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    p = ctx.params
    w = ctx.const(1)
    in_dtype = ctx.dtype(x_t)
    if (w is None or w.ndim != 2 or int(p.get("weights_format", 0)) != 0
            or in_dtype not in _EIGHT_BIT or ctx.dtype(out_t) != in_dtype):
        return None
    units, depth = w.shape
    size = int(np.prod(x_t.shape, dtype=np.int64))
    if depth == 0 or size % depth:
        return None
    batch = size // depth
    want = tuple(x_t.shape[:-1]) + (units,) if p.get("keep_num_dims", False) else (batch, units)
    if tuple(want) != tuple(out_t.shape):
        return None
    w_scales, w_zps = ctx.quant(w_t)
    per_channel = w_scales.size > 1
    if per_channel and (in_dtype != np.dtype(np.int8) or w_scales.size != units):
        return None
    try:
        zp = ctx.zero_point(out_t)
        lo, hi = activation_range(ctx, int(p.get("fused_activation_function", 0)),
                                  ctx.scale(out_t), zp, in_dtype)
        bias = _bias(ctx, 2, units, "FULLY_CONNECTED")
    except CoralRTError:
        return None
    w_offset = 0 if per_channel else (int(w_zps[0]) if w_zps.size else 0)
    wi = w.astype(np.int64) - w_offset
    x_zp = ctx.zero_point(x_t)
    acc_bound = np.abs(wi).sum(axis=1) * _max_abs_input(in_dtype, x_zp)
    if may_wrap(bias, acc_bound):
        return None
    eff = float(ctx.scale(x_t)) * w_scales.astype(np.float64) / float(ctx.scale(out_t))
    eff = np.ascontiguousarray(np.broadcast_to(eff, (units,)))
    b64 = np.zeros(units, np.int64) if bias is None else bias.astype(np.int64)
    worst = (acc_bound + np.abs(b64)) * np.abs(eff)
    if not np.all(np.isfinite(worst)) or worst.max(initial=0) >= 2.0**31 - 1:
        return None                      # round() past int32: the NumPy kernel's edge case
    wt = np.ascontiguousarray(wi, np.int32)
    fc = loops.fully_connected

    def run(inputs):
        out = np.empty((batch, units), in_dtype)
        fc(_plain(inputs[0]).reshape(batch, depth), wt, b64, x_zp, eff, int(zp),
           int(lo), int(hi), out)
        return [out.reshape(want)]

    return run


def pair_table(table: np.ndarray, out_shape: tuple[int, ...]) -> Run | None:
    """An element-wise operator's ``run`` as one compiled gather from its table of
    all 256 x 256 code pairs, for inputs of the output's shape (broadcasting
    inputs keep the NumPy gather); None when the compiled loops are off."""
    loops = jit()
    if loops is None:
        return None
    gather, shape = loops.pair_table, tuple(out_shape)

    def run(inputs):
        a, b = inputs[0], inputs[1]
        if a.shape != shape or b.shape != shape:
            return None
        out = np.empty(shape, table.dtype)
        gather(_plain(a).view(np.uint8).reshape(-1), _plain(b).view(np.uint8).reshape(-1),
               table, out.reshape(-1))
        return [out]

    return run


def softmax(exp_acc: np.ndarray, exp_q0: np.ndarray, bits: int, lo: int, hi: int, out_dtype,
            out_shape) -> Run | None:
    """An 8-bit SOFTMAX's ``run`` over rows of the last axis (rank 1 or more, the
    NumPy kernel checks), from that kernel's tables of exp per difference from
    the row maximum and its output width and range; None when the compiled loops
    are off."""
    loops = jit()
    if loops is None:
        return None
    acc = np.ascontiguousarray(exp_acc, np.int64)
    q0 = np.ascontiguousarray(exp_q0, np.int64)
    rows_of, shape = loops.softmax_rows, tuple(out_shape)

    def run(inputs):
        x = _plain(inputs[0])
        flat = x.reshape(-1, x.shape[-1])
        out = np.empty(flat.shape, out_dtype)
        rows_of(flat, acc, q0, bits, lo, hi, out)
        return [out.reshape(shape)]

    return run

