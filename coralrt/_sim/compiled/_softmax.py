"""The 8-bit SOFTMAX's per-row arithmetic as compiled loops.

The NumPy kernel (coralrt/_sim/kernels/activations.py) precomputes, per
operator, the exp of every possible (row maximum - value) difference; what is
left per row is a sum, gemmlowp's fixed-point reciprocal of it and one
multiplication per value.  Vectorised NumPy spends most of a small row's time
in per-call overhead there (about 0.4 ms for a 1001-class row), so these
loops do it value by value, with the same integer steps as
:mod:`coralrt._ops.arith.fixedpoint` (int32 values held in int64).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_MIN = -(1 << 31)
_MAX = (1 << 31) - 1
_ACCUMULATION_INTEGER_BITS = 12       # the exp sums' Q12.19 format (TFLite's choice)


@njit(cache=True, nogil=True, inline="always")
def _wrap(x):
    return ((x - _MIN) & 0xFFFFFFFF) + _MIN


@njit(cache=True, nogil=True, inline="always")
def _srdhm(a, b):
    if a == _MIN and b == _MIN:
        return _MAX
    return (a * b + (1 << 30)) >> 31


@njit(cache=True, nogil=True, inline="always")
def _rounding_divide_by_pot(x, exponent):
    mask = (1 << exponent) - 1
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if (x & mask) > threshold else 0)


@njit(cache=True, nogil=True, inline="always")
def _saturating_multiply_by_pot(x, exponent):
    threshold = (1 << (31 - exponent)) - 1
    if x > threshold:
        return _MAX
    if x < -threshold:
        return _MIN
    return x << exponent


@njit(cache=True, nogil=True)
def _reciprocal(x):
    """GetReciprocal(x, 12): (Q0.31 scale of 1/x, num_bits_over_unit) for x > 0."""
    v = x & 0xFFFFFFFF
    headroom = 0                                  # CountLeadingZeros of the uint32
    for step in (16, 8, 4, 2, 1):
        if v < (1 << (32 - step)):
            headroom += step
            v <<= step
    a = _wrap(((x & 0xFFFFFFFF) << headroom) - (1 << 31))
    # one_over_one_plus_x_for_x_in_0_1: RoundingHalfSum(a, INT32_MAX), then Newton.
    s = a + _MAX
    t = s + (1 if s >= 0 else -1)
    half = t >> 1 if t >= 0 else -((-t) >> 1)
    r = _wrap(1515870810 + _srdhm(half, -1010580540))
    for _ in range(3):
        one_minus = _wrap((1 << 29) - _srdhm(half, r))
        r = _wrap(r + _saturating_multiply_by_pot(_srdhm(r, one_minus), 2))
    return _saturating_multiply_by_pot(r, 1), _ACCUMULATION_INTEGER_BITS - headroom


@njit(cache=True, nogil=True)
def softmax_rows(x, exp_acc, exp_q0, bits, out_min, out_max, out):
    """x (rows, n) 8-bit; exp_acc and exp_q0 (256) int64: the exp of each
    difference from the row maximum in Q12.19 and Q0.31; out (rows, n)."""
    rows, n = x.shape
    for r in range(rows):
        top = np.int64(x[r, 0])
        for j in range(1, n):
            top = max(top, np.int64(x[r, j]))
        total = np.int64(0)
        for j in range(n):
            total += exp_acc[top - np.int64(x[r, j])]
        scale, over = _reciprocal(_wrap(total))
        exponent = over + 31 - bits
        for j in range(n):
            y = _rounding_divide_by_pot(_srdhm(scale, exp_q0[top - np.int64(x[r, j])]),
                                        exponent) + out_min
            out[r, j] = min(max(y, out_min), out_max)
