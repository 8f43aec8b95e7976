"""The compiled kernels' numba loops (the only module that imports numba).

Every loop computes in integers exactly what TFLite's reference kernels do:
int32 accumulators of zero-point-corrected 8-bit products (the callers only
come here when the accumulators plus the bias provably stay within int32, so
no partial sum wraps), then MultiplyByQuantizedMultiplier step by step in
int64 (a left shift wrapped to 32 bits, SaturatingRoundingDoublingHighMul as
``(P + 2^30) >> 31``, RoundingDivideByPOT with its remainder test), the
output zero point and the activation clamp; or, for FULLY_CONNECTED, the
reference kernel's ``round((acc + bias) * double scale)`` with halves rounded
away from zero.  Compiled code is cached on disk (numba's ``cache=True``) and
runs without the GIL.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_HALF = np.int64(1) << np.int64(30)
_INT32_MIN = np.int64(-(1 << 31))
_MASK32 = np.int64(0xFFFFFFFF)

# The pixels of one output row a convolution accumulates at once (each weight
# loaded once per group).
_GROUP = 4


@njit(cache=True, nogil=True, inline="always")
def _requant(v, m, ls, rs, zp, lo, hi):
    if ls > 0:                          # x * (1 << left_shift) on an int32
        v = ((v << ls) - _INT32_MIN & _MASK32) + _INT32_MIN
    q = (v * m + _HALF) >> np.int64(31)     # SaturatingRoundingDoublingHighMul
    mask = (np.int64(1) << rs) - np.int64(1)
    thr = (mask >> np.int64(1)) + (q < 0)   # RoundingDivideByPOT
    r = (q >> rs) + ((q & mask) > thr) + zp
    return min(max(r, lo), hi)


@njit(cache=True, nogil=True)
def _requant_row(acc, m, ls, rs, zp, lo, hi, out):
    for o in range(acc.shape[0]):
        out[o] = _requant(np.int64(acc[o]), m[o], ls[o], rs[o], zp, lo, hi)


@njit(cache=True, nogil=True)
def to_float32(x, x_zp, out):
    """out[r, k] = x[r, k] - x_zp as float32 (exact: 8-bit values)."""
    rows, k = x.shape
    for r in range(rows):
        for j in range(k):
            out[r, j] = np.float32(np.int32(x[r, j]) - x_zp)


@njit(cache=True, nogil=True)
def requant_rows(acc, bias, m, ls, rs, zp, lo, hi, out):
    """acc (rows, oc) float32 holding exact integers (a GEMM's sums, without bias)."""
    rows, oc = acc.shape
    for r in range(rows):
        ar, orow = acc[r], out[r]
        for o in range(oc):
            v = np.int64(np.int32(ar[o])) + bias[o]
            orow[o] = _requant(v, m[o], ls[o], rs[o], zp, lo, hi)


@njit(cache=True, nogil=True)
def conv_2d(x, wt, bias, x_zp, sh, sw, dh, dw, pt, pl, m, ls, rs, zp, lo, hi, out):
    """x (n, h, w, c); wt (kh, kw, c, oc) int32 with the weight offset applied;
    bias int32 (oc); m, ls, rs int64 (oc); out (n, oh, ow, oc)."""
    n, h, w, c = x.shape
    kh, kw, _, oc = wt.shape
    oh, ow = out.shape[1], out.shape[2]
    acc = np.empty((_GROUP, oc), np.int32)
    xv = np.empty((_GROUP, c), np.int32)
    for b in range(n):
        for oy in range(oh):
            iy0 = oy * sh - pt
            for ox0 in range(0, ow, _GROUP):
                g = min(_GROUP, ow - ox0)
                for p in range(g):
                    acc[p, :] = bias
                for ky in range(kh):
                    iy = iy0 + ky * dh
                    if iy < 0 or iy >= h:
                        continue
                    for kx in range(kw):
                        # Taps outside the input read the zero point: they add 0.
                        for p in range(g):
                            ix = (ox0 + p) * sw - pl + kx * dw
                            if ix < 0 or ix >= w:
                                xv[p, :] = 0
                            else:
                                for ci in range(c):
                                    xv[p, ci] = np.int32(x[b, iy, ix, ci]) - x_zp
                        wk = wt[ky, kx]
                        if g == _GROUP:
                            for ci in range(c):
                                a0, a1, a2, a3 = xv[0, ci], xv[1, ci], xv[2, ci], xv[3, ci]
                                wr = wk[ci]
                                for o in range(oc):
                                    wo = wr[o]
                                    acc[0, o] += a0 * wo
                                    acc[1, o] += a1 * wo
                                    acc[2, o] += a2 * wo
                                    acc[3, o] += a3 * wo
                        else:
                            for p in range(g):
                                for ci in range(c):
                                    a = xv[p, ci]
                                    wr = wk[ci]
                                    for o in range(oc):
                                        acc[p, o] += a * wr[o]
                for p in range(g):
                    _requant_row(acc[p], m, ls, rs, zp, lo, hi, out[b, oy, ox0 + p])


@njit(cache=True, nogil=True)
def depthwise_conv_2d(x, wt, bias, x_zp, dm, sh, sw, dh, dw, pt, pl, m, ls, rs, zp, lo, hi,
                      out):
    """x (n, h, w, c); wt (kh, kw, c * dm) int32 with the weight offset applied;
    output channel ``ci * dm + k`` reads input channel ``ci``."""
    n, h, w, c = x.shape
    kh, kw, oc = wt.shape
    oh, ow = out.shape[1], out.shape[2]
    acc = np.empty(oc, np.int32)
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
                _requant_row(acc, m, ls, rs, zp, lo, hi, out[b, oy, ox])


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
