"""Shared machinery of the convolution kernels: exact integer GEMMs on the float
BLAS, the setup of TFLite's requantization and the convolution geometry (see
conv.py for the arithmetic they reproduce).  The helpers any kernel may use
(padding and output sizes, the requantizer, activation ranges) live below the
operator specs, in :mod:`coralrt._ops.arith` and :mod:`coralrt._ops.fused`."""

from __future__ import annotations

import numpy as np

from coralrt.errors import UnsupportedOperatorError
from coralrt._ops.arith import fixedpoint
from coralrt._ops.arith.common import SAME, compute_out_size, compute_padding
from coralrt._ops.arith.requant import Requantizer
from coralrt._ops.arith.scratch import TEMPORARIES
from coralrt._ops.fused import activation_range
from coralrt._sim.kernels import OpContext

__all__ = ["ExactGemm"]

_F32_EXACT = 1 << 24
_F32_HALVES = 1 << 23
_BAND_ELEMENTS = 1 << 17          # a depthwise band's accumulators
_GEMM_BAND_ELEMENTS = 1 << 18     # a convolution band's GEMM input or output


# -- shared helpers --------------------------------------------------------------------------


def _check_shape(op: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise UnsupportedOperatorError(
            op, detail=f"output shape {tuple(want)} does not match the {tuple(got)} its inputs "
                       f"and options give")


def _need_const(ctx: OpContext, k: int, op: str, what: str) -> np.ndarray:
    data = ctx.const(k)
    if data is None:
        raise UnsupportedOperatorError(op, detail=f"the {what} must be a constant tensor")
    return data


def _bias(ctx: OpContext, k: int, channels: int, op: str) -> np.ndarray | None:
    if k >= len(ctx.inputs) or ctx.inputs[k] is None:
        return None
    b = _need_const(ctx, k, op, "bias")
    return np.asarray(b, np.int64).reshape(channels)


def _max_abs_input(dtype: np.dtype, zero_point: int) -> int:
    info = np.iinfo(dtype)
    return max(abs(int(info.min) - zero_point), abs(int(info.max) - zero_point))


def _multiplier(in_scale: float, w_scales: np.ndarray, out_scale: float,
                float_product: bool) -> tuple[np.ndarray, np.ndarray]:
    w_scales = np.asarray(w_scales, np.float32).reshape(-1)
    if float_product:
        # float(in * w) widened to double, as GetQuantizedConvolutionMultipler does.
        reals = (np.float32(in_scale) * w_scales).astype(np.float64) / float(out_scale)
    else:
        reals = float(np.float32(in_scale)) * w_scales.astype(np.float64) / float(out_scale)
    return fixedpoint.quantize_multipliers(reals)


class ExactGemm:
    """``a @ b`` for float32 ``a`` holding integers with |a| <= a_max and an integer
    matrix ``b``, exact: float32 chunks whose partial sums stay below 2^24."""

    def __init__(self, b: np.ndarray, a_max: int, extra_row: np.ndarray | None = None):
        """``extra_row``: values to add to every row of the product (a requantizer's
        bias), folded in as one more row of ``b`` that callers feed with an input
        column of ones; done only when every partial sum stays an exact float32
        (multiples of 1/2 below 2^23), which :attr:`extra` then says."""
        b = np.asarray(b, np.int64)
        k = b.shape[0]
        self.bounds = _chunks(np.abs(b), max(int(a_max), 1))
        self.mats = [np.ascontiguousarray(b[s:e], np.float32) for s, e in self.bounds]
        self.single = len(self.bounds) == 1
        self.k = k
        self.extra = False
        row = None if extra_row is None else np.asarray(extra_row, np.float64).reshape(-1)
        if row is not None and row.size == 1:     # one value for all columns (no bias)
            row = np.repeat(row, b.shape[1])
        if row is not None and self.single and row.size == b.shape[1]:
            row = row.reshape(1, -1)
            worst = np.abs(b).sum(axis=0) * max(int(a_max), 1) + np.abs(row[0])
            if (worst < _F32_HALVES).all() and (row * 2 == np.round(row * 2)).all():
                self.mats[0] = np.ascontiguousarray(np.vstack([self.mats[0], row]),
                                                    np.float32)
                self.extra = True

    @property
    def depth(self) -> int:
        """Columns of the input: k, plus the column of ones of a folded extra row."""
        return self.k + self.extra

    @property
    def dtype(self) -> np.dtype:
        """The accumulators' type: float32 for one chunk, else float64."""
        return np.dtype(np.float32 if self.single else np.float64)

    def __call__(self, a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Integer-valued array of :attr:`dtype`, written to ``out`` if given."""
        rows, cols = a.shape[0], self.mats[0].shape[1]
        if out is None:
            out = np.empty((rows, cols), self.dtype)
        if self.single:
            return np.matmul(a, self.mats[0], out=out)
        part = TEMPORARIES.array("gemm.part", (rows, cols), np.float32)
        for k, ((s, e), m) in enumerate(zip(self.bounds, self.mats)):
            np.matmul(a[:, s:e], m, out=part)
            if k == 0:
                np.copyto(out, part)
            else:
                out += part
        return out


def _chunks(abs_b: np.ndarray, a_max: int) -> list[tuple[int, int]]:
    k = abs_b.shape[0]
    if k == 0:
        return [(0, 0)]
    if int(abs_b.sum(axis=0).max(initial=0)) * a_max < _F32_EXACT:
        return [(0, k)]
    cum = np.cumsum(abs_b, axis=0)
    bounds, start = [], 0
    while start < k:
        base = cum[start - 1] if start else 0
        worst = (cum[start:] - base).max(axis=1) * a_max     # non-decreasing
        n = max(int(np.searchsorted(worst, _F32_EXACT, side="left")), 1)
        bounds.append((start, start + n))
        start += n
    return bounds


def _padded_rows(x: np.ndarray, zero_point: int, pad_t: int, pad_l: int, wp: int, r0: int,
                 r1: int, dtype=np.float32) -> np.ndarray:
    """Rows ``r0:r1`` of the padded input of one image ``x`` (H, W, C): ``x - zero_point``
    as floats in a frame that starts pad_t rows and pad_l columns before the
    input and is ``wp`` columns wide, 0 (the zero point) outside the input.  It
    is what a band of output rows reads, built just before it is read (the
    thread's temporary ``padded.rows``)."""
    h, w, c = x.shape
    buf = TEMPORARIES.array("padded.rows", (r1 - r0, wp, c), dtype)
    i0, i1 = max(r0 - pad_t, 0), min(r1 - pad_t, h)      # input rows inside the band
    ww = max(min(w, wp - pad_l), 0)
    if i1 <= i0:
        buf[...] = 0
        return buf
    top, bottom = i0 + pad_t - r0, i1 + pad_t - r0
    buf[:top] = 0
    buf[bottom:] = 0
    buf[top:bottom, :pad_l] = 0
    buf[top:bottom, pad_l + ww:] = 0
    np.subtract(x[i0:i1, :ww], dtype(zero_point), out=buf[top:bottom, pad_l:pad_l + ww])
    return buf


def _window(buf: np.ndarray, i: int, j: int, oh: int, ow: int, sh: int, sw: int) -> np.ndarray:
    return buf[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw]


def _conv_geometry(ctx: OpContext, op: str, in_shape, kh: int, kw: int, out_shape):
    p = ctx.params
    sh, sw = int(p.get("stride_h", 1)), int(p.get("stride_w", 1))
    dh, dw = int(p.get("dilation_h_factor", 1)), int(p.get("dilation_w_factor", 1))
    padding = int(p.get("padding", SAME))
    if min(sh, sw, dh, dw) < 1:
        raise UnsupportedOperatorError(op, detail="strides and dilations must be >= 1")
    _, h, w, _ = in_shape
    oh = compute_out_size(padding, h, kh, sh, dh)
    ow = compute_out_size(padding, w, kw, sw, dw)
    _check_shape(op, (in_shape[0], oh, ow, out_shape[3]), out_shape)
    pt = compute_padding(sh, dh, h, kh, oh)
    pl = compute_padding(sw, dw, w, kw, ow)
    hp = (oh - 1) * sh + (kh - 1) * dh + 1
    wp = (ow - 1) * sw + (kw - 1) * dw + 1
    return sh, sw, dh, dw, oh, ow, pt, pl, hp, wp


def _quant_setup(ctx: OpContext, op: str, x_t, w_t, out_t, channels: int, bias,
                 weights: np.ndarray, channel_axis: int):
    """(weight zero points to subtract, Requantizer) for the conv-like operators.

    ``weights`` (with its output channels along ``channel_axis``) bounds the
    accumulators, which the requantizer uses to prove a multiplier above 1
    cannot overflow int32."""
    in_dtype = ctx.dtype(x_t)
    if in_dtype not in (np.dtype(np.uint8), np.dtype(np.int8)):
        raise UnsupportedOperatorError(op, detail=f"input type {x_t.type_name} is not uint8 "
                                                  f"or int8")
    w_scales, w_zps = ctx.quant(w_t)
    if w_scales.size not in (1, channels):
        raise UnsupportedOperatorError(op, detail=f"{w_scales.size} weight scales for "
                                                  f"{channels} output channels")
    uint8 = in_dtype == np.dtype(np.uint8)
    if uint8 and w_scales.size > 1:
        raise UnsupportedOperatorError(op, detail="per-channel weights need int8 tensors")
    mult, shift = _multiplier(ctx.scale(x_t), w_scales[:1] if uint8 else w_scales,
                              ctx.scale(out_t), float_product=uint8)
    out_dtype = ctx.dtype(out_t)
    zp = ctx.zero_point(out_t)
    lo, hi = activation_range(ctx, int(ctx.params.get("fused_activation_function", 0)),
                              ctx.scale(out_t), zp, out_dtype)
    w_offset = int(w_zps[0]) if uint8 and w_zps.size else 0
    wi = np.moveaxis(weights.astype(np.int64) - w_offset, channel_axis, 0).reshape(channels, -1)
    acc_bound = np.abs(wi).sum(axis=1) * _max_abs_input(in_dtype, ctx.zero_point(x_t))
    return w_offset, Requantizer(mult, shift, zp, lo, hi, out_dtype, bias, acc_bound)
