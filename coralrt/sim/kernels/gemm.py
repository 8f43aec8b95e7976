"""Shared machinery of the convolution kernels: exact integer GEMMs on the float
BLAS, TFLite's requantization, padding geometry and activation ranges (see
conv.py for the arithmetic they reproduce)."""

from __future__ import annotations

import numpy as np

try:                                   # the clip ufunc, without np.clip's Python checks
    from numpy._core.umath import clip as _clip
except ImportError:                    # numpy < 2
    from numpy.core.umath import clip as _clip

from coralrt.errors import UnsupportedOperatorError
from coralrt.sim import fixedpoint
from coralrt.sim.kernels import OpContext

__all__ = ["activation_range", "compute_out_size", "compute_padding", "Requantizer",
           "DoubleRequantizer", "ExactGemm"]

# Activation function codes of the TFLite schema.
_RELU, _RELU_N1_TO_1, _RELU6 = 1, 2, 3
_SAME, _VALID = 0, 1
_F32_EXACT = 1 << 24
_BAND_ELEMENTS = 1 << 15


# -- shared helpers --------------------------------------------------------------------------


def activation_range(activation: int, scale: float, zero_point: int,
                     dtype: np.dtype) -> tuple[int, int]:
    """TFLite's CalculateActivationRangeQuantized for an output tensor."""
    info = np.iinfo(dtype)
    qmin, qmax = int(info.min), int(info.max)

    def quantize(f: float) -> int:
        # TFLite divides in float and rounds half away from zero.
        return fixedpoint.quantize_bound(f, scale, zero_point)

    if activation == _RELU:
        return max(qmin, quantize(0.0)), qmax
    if activation == _RELU6:
        return max(qmin, quantize(0.0)), min(qmax, quantize(6.0))
    if activation == _RELU_N1_TO_1:
        return max(qmin, quantize(-1.0)), min(qmax, quantize(1.0))
    return qmin, qmax


def compute_out_size(padding: int, size: int, filt: int, stride: int, dilation: int = 1) -> int:
    effective = (filt - 1) * dilation + 1
    if padding == _SAME:
        return (size + stride - 1) // stride
    return (size + stride - effective) // stride


def compute_padding(stride: int, dilation: int, in_size: int, filt: int, out_size: int) -> int:
    """Padding before the first element (TFLite drops the odd extra one at the end)."""
    effective = (filt - 1) * dilation + 1
    total = (out_size - 1) * stride + effective - in_size
    return max(total // 2, 0)


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


class Requantizer:
    """Accumulators (without bias) -> output integers, exactly as TFLite's
    ``MultiplyByQuantizedMultiplier(acc + bias, m, shift) + zero_point`` clamped to
    the activation range; multipliers broadcast along the last axis.

    For the usual multipliers below 1 the two roundings fold into one shift:
    with P = (acc + bias) * m, SaturatingRoundingDoublingHighMul is
    floor((P + 2^30) / 2^31) (for a positive multiplier and int32 values), and
    RoundingDivideByPOT by 2^e adds 2^(e-1), minus 1 for negative values, before
    flooring; nested floors by powers of two compose, so the result is
    (P + 2^30 + (2^(e-1) - [P + 2^30 < 0]) * 2^31) >> (31 + e).  When the
    activation range excludes negative results the [.. < 0] term cannot change
    the clamped output and is skipped.  Work goes in row blocks that stay in cache.
    """

    BLOCK = 1 << 15      # elements per block

    def __init__(self, multipliers, shifts, zero_point: int, act_min: int, act_max: int,
                 dtype: np.dtype, bias: np.ndarray | None = None):
        m = np.asarray(multipliers, np.int64).reshape(-1)
        s = np.asarray(shifts, np.int64).reshape(-1)
        if m.size > 1 and (m == m[0]).all() and (s == s[0]).all():
            m, s = m[:1], s[:1]
        self.dtype = np.dtype(dtype)
        self.zp = int(zero_point)
        self.lo, self.hi = int(act_min) - self.zp, int(act_max) - self.zp
        self.bias = None if bias is None else np.asarray(bias, np.int64)
        # Left shifts (multipliers above 1) and shifts past 31 (never produced by
        # QuantizeMultiplier) take the step-by-step route.
        self.general = bool((s > 0).any() or (s < -31).any())
        if self.general:
            self.m, self.s = m, s
            return
        e = -s
        half = np.where(e > 0, np.int64(1) << np.maximum(e - 1, 0), 0)
        b = 0 if self.bias is None else self.bias
        self.m = m if m.size > 1 else int(m[0])
        self.shift = 31 + e if e.size > 1 else int(31 + e[0])
        self.signed = self.lo < 0 and bool((e > 0).any())
        if self.signed:
            self.k = b * m + (1 << 30)
            self.k2 = half << 31
            # Channels without a rounding shift take no correction.
            mask = np.where(e > 0, -(1 << 31), 0).astype(np.int64)
            self.mask = int(mask[0]) if (mask == mask[0]).all() else mask
        else:
            self.k = b * m + (1 << 30) + (half << 31)

    def __call__(self, acc: np.ndarray) -> np.ndarray:
        """``acc``: integer-valued float or int array of shape (..., channels)."""
        out = np.empty(acc.shape, self.dtype)
        if self.general:
            v = acc.astype(np.int64)
            if self.bias is not None:
                v += self.bias
            v = fixedpoint.multiply_by_quantized_multiplier(v, self.m, self.s)
            np.clip(v, self.lo, self.hi, out=v)
            np.add(v, self.zp, out=out, casting="unsafe")
            return out
        ch = acc.shape[-1] if acc.ndim else 1
        a2 = acc.reshape(-1, ch) if acc.ndim else acc.reshape(1, 1)
        o2 = out.reshape(a2.shape)
        rows = max(1, self.BLOCK // max(ch, 1))
        v = np.empty((min(rows, a2.shape[0]), ch), np.int64)
        t = np.empty_like(v) if self.signed else None
        for r in range(0, a2.shape[0], rows):
            blk = a2[r:r + rows]
            n = blk.shape[0]
            vb = v[:n]
            np.copyto(vb, blk, casting="unsafe")      # exact: the values are integers
            vb *= self.m
            vb += self.k
            if self.signed:
                tb = t[:n]
                np.right_shift(vb, 63, out=tb)         # -1 where P + 2^30 < 0
                tb &= self.mask
                vb += tb
                vb += self.k2
            vb >>= self.shift
            _clip(vb, self.lo, self.hi, out=vb)
            np.add(vb, self.zp, out=o2[r:r + rows], casting="unsafe")
        return out


class DoubleRequantizer:
    """Requantization as ``round((acc + bias) * (in_scale * w_scale / out_scale))`` in
    double, which TFLite's reference FULLY_CONNECTED uses instead of the fixed-point
    multiplier."""

    def __init__(self, effective_scales, zero_point: int, act_min: int, act_max: int,
                 dtype: np.dtype, bias: np.ndarray | None = None):
        eff = np.asarray(effective_scales, np.float64).reshape(-1)
        self.eff = float(eff[0]) if eff.size == 1 or (eff == eff[0]).all() else eff
        self.dtype = np.dtype(dtype)
        self.zp = int(zero_point)
        self.lo, self.hi = int(act_min) - self.zp, int(act_max) - self.zp
        self.bias = None if bias is None else np.asarray(bias, np.float64)

    def __call__(self, acc: np.ndarray) -> np.ndarray:
        x = acc.astype(np.float64)
        if self.bias is not None:
            x += self.bias
        x *= self.eff
        r = np.rint(x)
        # C's round() sends halves away from zero; rint sends them to even.
        t = np.trunc(x)
        tie = np.abs(x - t) == 0.5
        if tie.any():
            r[tie] = t[tie] + np.sign(x[tie])
        if not np.all(np.abs(r) < 2.0**31):
            # static_cast<int32_t>(round(x)) of a value past int32 (an extreme
            # scale ratio) is INT32_MIN; adding the zero point wraps.
            v = fixedpoint.wrap_int32(fixedpoint.c_int32(r) + self.zp)
            np.clip(v, self.lo + self.zp, self.hi + self.zp, out=v)
            return v.astype(self.dtype)
        _clip(r, self.lo, self.hi, out=r)
        out = np.empty(r.shape, self.dtype)
        np.add(r, self.zp, out=out, casting="unsafe")
        return out


class ExactGemm:
    """``a @ b`` for float32 ``a`` holding integers with |a| <= a_max and an integer
    matrix ``b``, exact: float32 chunks whose partial sums stay below 2^24."""

    def __init__(self, b: np.ndarray, a_max: int):
        b = np.asarray(b, np.int64)
        k = b.shape[0]
        self.bounds = _chunks(np.abs(b), max(int(a_max), 1))
        self.mats = [np.ascontiguousarray(b[s:e], np.float32) for s, e in self.bounds]
        self.single = len(self.bounds) == 1
        self.k = k

    def __call__(self, a: np.ndarray) -> np.ndarray:
        """Integer-valued float array (float32 for one chunk, else float64)."""
        if self.single:
            return a @ self.mats[0]
        acc = None
        for (s, e), m in zip(self.bounds, self.mats):
            r = a[:, s:e] @ m
            if acc is None:
                acc = r.astype(np.float64)
            else:
                acc += r
        return acc


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


def _padded(x: np.ndarray, zero_point: int, pad_t: int, pad_l: int, hp: int, wp: int,
            dtype=np.float32) -> np.ndarray:
    """``x - zero_point`` as floats in an (N, hp, wp, C) frame starting pad_t rows and
    pad_l columns before the input; outside the input it is 0 (the zero point)."""
    n, h, w, c = x.shape
    hh, ww = max(min(h, hp - pad_t), 0), max(min(w, wp - pad_l), 0)
    if pad_t == 0 and pad_l == 0 and hh == hp and ww == wp:
        buf = np.empty((n, hp, wp, c), dtype)
    else:
        buf = np.zeros((n, hp, wp, c), dtype)
    np.subtract(x[:, :hh, :ww], dtype(zero_point), out=buf[:, pad_t:pad_t + hh, pad_l:pad_l + ww])
    return buf


def _window(buf: np.ndarray, i: int, j: int, oh: int, ow: int, sh: int, sw: int) -> np.ndarray:
    return buf[:, i:i + (oh - 1) * sh + 1:sh, j:j + (ow - 1) * sw + 1:sw]


def _conv_geometry(ctx: OpContext, op: str, in_shape, kh: int, kw: int, out_shape):
    p = ctx.params
    sh, sw = int(p.get("stride_h", 1)), int(p.get("stride_w", 1))
    dh, dw = int(p.get("dilation_h_factor", 1)), int(p.get("dilation_w_factor", 1))
    padding = int(p.get("padding", _SAME))
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


def _quant_setup(ctx: OpContext, op: str, x_t, w_t, out_t, channels: int, bias):
    """(weight zero points to subtract, Requantizer) for the conv-like operators."""
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
    lo, hi = activation_range(int(ctx.params.get("fused_activation_function", 0)),
                              ctx.scale(out_t), zp, out_dtype)
    w_offset = int(w_zps[0]) if uint8 and w_zps.size else 0
    return w_offset, Requantizer(mult, shift, zp, lo, hi, out_dtype, bias)
