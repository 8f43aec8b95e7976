"""The compiled kernels' numba loops (with :mod:`._simd`'s vector blocks and
:mod:`._softmax`'s rows, the only modules that import numba).

Every loop computes in integers exactly what TFLite's reference kernels do:
int32 accumulators of zero-point-corrected 8-bit products (the callers only
come here when the accumulators plus the bias provably stay within int32, so
no partial sum wraps), then MultiplyByQuantizedMultiplier step by step
(SaturatingRoundingDoublingHighMul as ``(P + 2^30) >> 31`` on the int64
product, RoundingDivideByPOT with its remainder test in int32), the
output zero point and the activation clamp; or, for FULLY_CONNECTED, the
reference kernel's ``round((acc + bias) * double scale)`` with halves rounded
away from zero.  Compiled code is cached on disk (numba's ``cache=True``) and
runs without the GIL.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from coralrt._sim.compiled._simd import (
    COLS, LANES, PAIRED, ROWS, pair_dot_block, requant_lanes,
)
from coralrt._sim.compiled._softmax import softmax_rows

__all__ = ["rows_int16", "im2col_int16", "gemm_requant", "depthwise_conv_2d", "depthwise_3x3",
           "fully_connected", "pair_table", "softmax_rows", "ROWS", "COLS", "PAIRED"]

_HALF = np.int64(1) << np.int64(30)
_U = np.uint64


@njit(cache=True, nogil=True, inline="always")
def _requant(v, m, rs, zp, lo, hi):
    """MultiplyByQuantizedMultiplier(v, m, -rs) + zp clamped to [lo, hi], for an int32
    ``v``, 0 < m < 2^31 and 0 <= rs <= 31 (no left shift: the callers fold a
    multiplier's left shift into the weights and bias, ops._setup).  The product
    needs 64 bits; its rounded high half ``q`` does not (|q| <= |v|), so the rest
    runs in 32-bit lanes."""
    q = np.int32((np.int64(v) * np.int64(m) + _HALF) >> np.int64(31))   # SRDHM
    mask = np.int32((np.int32(1) << rs) - np.int32(1))                  # RoundingDivideByPOT
    thr = np.int32((mask >> np.int32(1)) + np.int32(q < 0))
    r = np.int32(np.int32(q >> rs) + np.int32((q & mask) > thr) + zp)
    return min(max(r, lo), hi)


@njit(cache=True, nogil=True, inline="always")
def _requant_run(acc, src, bias, m, rs, c0, count, zp, lo, hi, out, dst):
    """out[dst + i] = requant(acc[src + i] + bias[c0 + i]) with channel c0 + i's
    multiplier, for i < count (unsigned offsets): LANES at a time, then one by one."""
    i = _U(0)
    while i + _U(LANES) <= count:
        requant_lanes(acc, src + i, bias, m, rs, c0 + i, zp, lo, hi, out, dst + i)
        i += _U(LANES)
    while i < count:
        o = c0 + i
        out[dst + i] = _requant(np.int32(np.int32(acc[src + i]) + bias[o]), m[o], rs[o], zp,
                                lo, hi)
        i += _U(1)


@njit(cache=True, nogil=True)
def rows_int16(x, x_zp, out):
    """out[r, j] = x[r, j] - x_zp as int16 for the (rows, k) 8-bit ``x``; the rest
    of ``out`` (more rows, an even row length) is set to 0."""
    rows, k = x.shape
    xf = x.reshape(-1)
    of = out.reshape(-1)
    kp = _U(out.shape[1])
    ku = _U(k)
    for r in range(_U(rows)):
        src = r * ku
        dst = r * kp
        for j in range(ku):
            of[dst + j] = np.int16(np.int32(xf[src + j]) - x_zp)
        for j in range(ku, kp):
            of[dst + j] = 0
    for j in range(_U(rows) * kp, _U(of.shape[0])):
        of[j] = 0


@njit(cache=True, nogil=True)
def im2col_int16(x, b, y0, y1, ow, kh, kw, sh, sw, dh, dw, pt, pl, x_zp, out):
    """The windows of output rows y0:y1 (``ow`` pixels each) of image ``b`` as rows
    of int16: each window's (ky, kx, ci) values minus x_zp, 0 for taps outside
    the input (they read the zero point); the rest of ``out`` (more rows, an
    even row length) is set to 0.  Flat views with unsigned offsets, as in
    :func:`depthwise_3x3`."""
    n, h, w, c = x.shape
    xf = x.reshape(-1)
    af = out.reshape(-1)
    depth = _U(out.shape[1])
    cu = _U(c)
    run = _U(kw * c)
    used = _U(kh * kw * c)
    r = _U(0)
    for oy in range(y0, y1):
        iy0 = oy * sh - pt
        for ox in range(ow):
            ix0 = ox * sw - pl
            q = r * depth
            cols_in = dw == 1 and ix0 >= 0 and ix0 + kw <= w
            for ky in range(kh):
                iy = iy0 + ky * dh
                inside = 0 <= iy < h
                if inside and cols_in:        # the window row is kw * c contiguous values
                    p = _U(((b * h + iy) * w + ix0) * c)
                    for j in range(run):
                        af[q + j] = np.int16(np.int32(xf[p + j]) - x_zp)
                    q += run
                    continue
                for kx in range(kw):
                    ix = ix0 + kx * dw
                    if inside and 0 <= ix < w:
                        p = _U(((b * h + iy) * w + ix) * c)
                        for ci in range(cu):
                            af[q + ci] = np.int16(np.int32(xf[p + ci]) - x_zp)
                    else:
                        for ci in range(cu):
                            af[q + ci] = 0
                    q += cu
            for j in range(used, depth):
                af[r * depth + j] = 0
            r += _U(1)
    for j in range(r * depth, _U(af.shape[0])):
        af[j] = 0


@njit(cache=True, nogil=True)
def gemm_requant(a, rows, b, n, n_pad, bias, m, rs, zp, lo, hi, out):
    """out[r, c] for r < rows, c < n: the requantized int32 sum of row r of ``a``
    (int16 pairs as int32, see :mod:`._simd`; its rows a multiple of ROWS) with
    column c of the weights ``b``, plus bias[c].  ``b`` holds n_pad / COLS
    blocks one after the other, each kp steps of 2 * COLS weights laid out as
    :mod:`._simd` says.  ``out`` is flat, rows x n values; bias, m and rs have
    n values."""
    rows_pad, kp = a.shape
    af = a.reshape(-1)
    acc = np.empty(ROWS * COLS, np.int32)
    nu = _U(n)
    for c0 in range(0, n_pad, COLS):
        width = _U(min(COLS, n - c0))
        cu0 = _U(c0)
        for r0 in range(0, rows_pad, ROWS):
            pair_dot_block(af, r0 * kp, kp, b, 2 * c0 * kp, 2 * COLS, kp, acc)
            for i in range(min(ROWS, rows - r0)):
                _requant_run(acc, _U(i * COLS), bias, m, rs, cu0, width, zp, lo, hi, out,
                             _U(r0 + i) * nu + cu0)


@njit(cache=True, nogil=True)
def depthwise_conv_2d(x, wt, bias, x_zp, dm, sh, sw, dh, dw, pt, pl, m, rs, zp, lo, hi,
                      out):
    """x (n, h, w, c); wt (kh, kw, c * dm) int32 with the weight offset applied;
    output channel ``ci * dm + k`` reads input channel ``ci``."""
    n, h, w, c = x.shape
    kh, kw, oc = wt.shape
    oh, ow = out.shape[1], out.shape[2]
    of = out.reshape(-1)
    acc = np.empty(oc, np.int32)
    zeros = np.zeros(oc, np.int32)         # acc starts from the bias
    for b in range(n):
        for oy in range(oh):
            iy0 = oy * sh - pt
            for ox in range(ow):
                ix0 = ox * sw - pl
                acc[:] = bias
                for ky in range(kh):
                    iy = iy0 + ky * dh
                    if iy < 0 or iy >= h:
                        continue
                    for kx in range(kw):
                        ix = ix0 + kx * dw
                        if ix < 0 or ix >= w:
                            continue
                        xr = x[b, iy, ix]
                        wr = wt[ky, kx]
                        if dm == 1:
                            for o in range(oc):
                                acc[o] += (np.int32(xr[o]) - x_zp) * wr[o]
                        else:
                            for ci in range(c):
                                a = np.int32(xr[ci]) - x_zp
                                for k in range(dm):
                                    acc[ci * dm + k] += a * wr[ci * dm + k]
                _requant_run(acc, _U(0), zeros, m, rs, _U(0), _U(oc), zp, lo, hi, of,
                             _U(((b * oh + oy) * ow + ox) * oc))


@njit(cache=True, nogil=True, fastmath=True)     # fastmath: only the exact float32 sums
def depthwise_3x3(x, wf, biasf, wsum, x_zp, sh, sw, dh, dw, pt, pl, m, rs, zp, lo, hi, out):
    """A 3x3 depthwise convolution with multiplier 1 in float32, for a layer whose
    every partial sum the caller proved an integer below 2^24: wf (9, c) float32
    (row-major taps, the weight offset applied), biasf and wsum (c) float32 (the
    bias; each channel's sum of taps).  Where all nine taps are inside the input,
    each output is ``bias - x_zp * sum(w) + sum(x * w)`` summed for all channels
    of a pixel in one pass; at the borders the taps outside are skipped (they
    would read the zero point and add 0) and the others add ``(x - x_zp) * w``.
    One output row's sums are then requantized together.

    The input and output are read through flat views with unsigned offsets:
    signed offsets would make every load check for a negative index, and a view
    per pixel would cost reference counting per pixel (both several times the
    arithmetic)."""
    n, h, w, c = x.shape
    oh, ow = out.shape[1], out.shape[2]
    xf = x.reshape(-1)
    of = out.reshape(-1)
    wk = wf.reshape(-1)
    cu = _U(c)
    zpf = np.float32(x_zp)
    base = np.empty(c, np.float32)
    for o in range(c):
        base[o] = biasf[o] - zpf * wsum[o]
    row = np.empty(ow * c, np.float32)
    zeros = np.zeros(c, np.int32)          # the row's sums include the bias
    dx = _U(dw * c)
    dy = _U(dh * w * c)
    k1, k2, k3, k4 = cu, _U(2) * cu, _U(3) * cu, _U(4) * cu
    k5, k6, k7, k8 = _U(5) * cu, _U(6) * cu, _U(7) * cu, _U(8) * cu
    for b in range(n):
        for oy in range(oh):
            iy0 = oy * sh - pt
            rows_in = iy0 >= 0 and iy0 + 2 * dh < h
            for ox in range(ow):
                ix0 = ox * sw - pl
                r0 = _U(ox * c)
                if rows_in and ix0 >= 0 and ix0 + 2 * dw < w:
                    p0 = _U(((b * h + iy0) * w + ix0) * c)
                    p1 = p0 + dy
                    p2 = p1 + dy
                    for o in range(cu):
                        # Three partial sums: shorter dependency chains.
                        s0 = (base[o] + np.float32(xf[p0 + o]) * wk[o]
                              + np.float32(xf[p0 + dx + o]) * wk[k1 + o]
                              + np.float32(xf[p0 + dx + dx + o]) * wk[k2 + o])
                        s1 = (np.float32(xf[p1 + o]) * wk[k3 + o]
                              + np.float32(xf[p1 + dx + o]) * wk[k4 + o]
                              + np.float32(xf[p1 + dx + dx + o]) * wk[k5 + o])
                        s2 = (np.float32(xf[p2 + o]) * wk[k6 + o]
                              + np.float32(xf[p2 + dx + o]) * wk[k7 + o]
                              + np.float32(xf[p2 + dx + dx + o]) * wk[k8 + o])
                        row[r0 + o] = s0 + (s1 + s2)
                    continue
                for o in range(cu):
                    row[r0 + o] = biasf[o]
                for ky in range(3):
                    iy = iy0 + ky * dh
                    if iy < 0 or iy >= h:
                        continue
                    for kx in range(3):
                        ix = ix0 + kx * dw
                        if ix < 0 or ix >= w:
                            continue
                        p = _U(((b * h + iy) * w + ix) * c)
                        k = _U(ky * 3 + kx) * cu
                        for o in range(cu):
                            row[r0 + o] += (np.float32(xf[p + o]) - zpf) * wk[k + o]
            q0 = _U((b * oh + oy) * ow * c)
            for ox in range(ow):
                r0 = _U(ox * c)
                _requant_run(row, r0, zeros, m, rs, _U(0), cu, zp, lo, hi, of, q0 + r0)


@njit(cache=True, nogil=True)
def fully_connected(x, wt, bias, x_zp, eff, zp, lo, hi, out):
    """x (batch, depth); wt (units, depth) int32 with the weight offset applied;
    bias int32 (units); eff float64 (units); out (batch, units).  Rounds as
    C's ``round``: halves away from zero."""
    batch, depth = x.shape
    units = wt.shape[0]
    xv = np.empty(depth, np.int32)
    for b in range(batch):
        for k in range(depth):
            xv[k] = np.int32(x[b, k]) - x_zp
        for u in range(units):
            s = np.int32(0)
            wr = wt[u]
            for k in range(depth):
                s += xv[k] * wr[k]
            v = np.float64(np.int64(s) + bias[u]) * eff[u]
            t = np.trunc(v)
            d = v - t                   # exact in double
            if d >= 0.5:
                t += 1.0
            elif d <= -0.5:
                t -= 1.0
            r = np.int64(t) + zp
            out[b, u] = min(max(r, lo), hi)


@njit(cache=True, nogil=True)
def pair_table(a, b, table, out):
    """out[i] = table[a[i] * 256 + b[i]] for the flat bytes of two same-size 8-bit
    inputs (the element-wise operators' precomputed table of every code pair)."""
    for i in range(a.shape[0]):
        out[i] = table[(_U(a[i]) << _U(8)) | _U(b[i])]

