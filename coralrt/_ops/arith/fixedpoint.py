"""TFLite's integer requantization arithmetic, vectorised with numpy.

These reproduce, element for element, the fixed-point helpers TFLite's
reference kernels use (gemmlowp's ``SaturatingRoundingDoublingHighMul`` and
``RoundingDivideByPOT``, TFLite's ``QuantizeMultiplier`` and
``MultiplyByQuantizedMultiplier`` in its default double-rounding form).  All
arithmetic is int64 on arrays; multipliers and shifts may be scalars or
arrays that broadcast (per-channel quantization).

C++ integer division truncates toward zero and ``>>`` on negative numbers is
an arithmetic shift; numpy's ``>>`` is arithmetic too, so only the division
needs care.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "INT32_MIN", "INT32_MAX", "quantize_multiplier", "quantize_multipliers",
    "srdhm", "rounding_divide_by_pot", "multiply_by_quantized_multiplier",
    "multiply_by_quantized_multiplier_smaller_than_one_exp", "c_int32", "quantize_bound",
]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1


def quantize_multiplier(real: float) -> tuple[int, int]:
    """``real`` as (int32 multiplier in [2^30, 2^31), shift): real = m * 2^(shift-31)."""
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    v = q * (1 << 31)
    q_fixed = int(math.copysign(math.floor(abs(v) + 0.5), v))  # std::round: ties away from 0
    if q_fixed == 1 << 31:
        q_fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    # TFLite clamps shifts above 30 only in its single-rounding build; the
    # default (double-rounding) build that LiteRT ships keeps them.
    return q_fixed, shift


def quantize_multipliers(reals) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel :func:`quantize_multiplier` (arrays of multipliers and shifts)."""
    pairs = [quantize_multiplier(float(r)) for r in np.atleast_1d(reals)]
    return (np.array([p[0] for p in pairs], np.int64), np.array([p[1] for p in pairs], np.int64))


def srdhm(a, b) -> np.ndarray:
    """SaturatingRoundingDoublingHighMul of int32 values (as int64 arrays).

    gemmlowp adds 2^30 (1 - 2^30 for a negative product P) and divides by 2^31
    truncating toward zero; both cases are floor((P + 2^30) / 2^31), an
    arithmetic shift (for P < 0: trunc((P + 1 - 2^30) / 2^31) is the ceiling,
    floor((P + 1 - 2^30 + 2^31 - 1) / 2^31)).  The one overflow, INT32_MIN
    times itself, saturates."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    q = (a * b + (1 << 30)) >> 31
    if (b.ndim == 0 and b != INT32_MIN) or (a.ndim == 0 and a != INT32_MIN):
        return q
    return np.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, q)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """Round-to-nearest (ties away from zero) division by 2^exponent."""
    x = np.asarray(x, np.int64)
    exponent = np.asarray(exponent, np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def multiply_by_quantized_multiplier(x, multiplier, shift) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier: x * multiplier * 2^(shift-31), rounded.

    A multiplier of 2^31 or more (a real multiplier above about 2^31, e.g. a
    MUL whose output scale is 1e-35) leaves a left shift of 32 or more.  The
    kernel computes ``x * (1 << left_shift)`` on a 32-bit int; C++ leaves
    shifts past 31 undefined, and the compiled reference kernels shift with
    the count taken modulo 32 (the x86 SHL instruction).  Measured with
    LiteRT's reference MUL for shifts 32-127, and reproduced here.
    """
    shift = np.asarray(shift, np.int64)
    x = np.asarray(x, np.int64)
    if shift.ndim == 0 and shift <= 0:           # the usual case: no left shift
        right = -shift
    else:
        right = np.maximum(-shift, 0)
        x = x * (np.int64(1) << (np.maximum(shift, 0) & 31))
    # The (left-shifted) value is an int32 in C++; wrap like it would.
    x = ((x - INT32_MIN) & 0xFFFFFFFF) + INT32_MIN
    return rounding_divide_by_pot(srdhm(x, multiplier), right)


def c_int32(x) -> np.ndarray:
    """``static_cast<int32_t>`` of a float or double, as LiteRT's x86-64 build
    computes it: truncation toward zero, and INT32_MIN (the "integer
    indefinite" result of CVTTSS2SI/CVTTSD2SI) for NaN and for values outside
    the int32 range.  Kernels reach such values with extreme scales (a
    requantization factor of 1e30, a clamp bound of 6 / 1e-38)."""
    x = np.asarray(x, np.float64)
    inside = (x > -2.0**31 - 1) & (x < 2.0**31)
    with np.errstate(invalid="ignore"):
        return np.where(inside, np.trunc(np.where(inside, x, 0.0)), INT32_MIN).astype(np.int64)


def quantize_bound(value: float, scale: float, zero_point: int) -> int:
    """``zero_point + static_cast<int32_t>(round(value / scale))`` with the
    division in float (inf past FLT_MAX), as TFLite quantizes an activation
    bound (CalculateActivationRangeQuantized, the RELU kernels); the int32 sum
    wraps like the C++ one."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        v = float(np.float32(value) / np.float32(scale))
    rounded = math.copysign(math.floor(abs(v) + 0.5), v) if math.isfinite(v) else v
    return int(wrap_int32(int(zero_point) + c_int32(rounded)))


def multiply_by_quantized_multiplier_smaller_than_one_exp(x, multiplier, shift) -> np.ndarray:
    """For multipliers < 1 (``shift`` <= 0), as the elementwise kernels use it."""
    return rounding_divide_by_pot(srdhm(x, multiplier), -np.asarray(shift, np.int64))


# -- gemmlowp fixed-point helpers (appended) -----------------------------------------------
# Vectorised forms of the gemmlowp ``FixedPoint<int32_t, N>`` operations that
# TFLite's 8-bit softmax, L2 normalization and RSQRT kernels build on.  A
# FixedPoint value is represented by its raw int32 (held in int64 arrays);
# multiplying two of them is ``srdhm`` and adds their integer bits.

__all__ += [
    "wrap_int32", "saturating_rounding_multiply_by_pot", "rounding_half_sum",
    "count_leading_zeros32", "exp_on_negative_values", "one_over_one_plus_x_for_x_in_0_1",
    "get_reciprocal", "inv_sqrt_quantized_multiplier_exp",
]


def wrap_int32(x) -> np.ndarray:
    """Reduce int64 values modulo 2^32 into int32 range (C++ int32 wrap-around)."""
    x = np.asarray(x, np.int64)
    return ((x - INT32_MIN) & 0xFFFFFFFF) + INT32_MIN


def saturating_rounding_multiply_by_pot(x, exponent: int) -> np.ndarray:
    """gemmlowp's SaturatingRoundingMultiplyByPOT<exponent> on int32 raw values."""
    x = np.asarray(x, np.int64)
    if exponent == 0:
        return x
    if exponent < 0:
        return rounding_divide_by_pot(x, -exponent)
    threshold = (1 << (31 - exponent)) - 1
    return np.where(x > threshold, INT32_MAX,
                    np.where(x < -threshold, INT32_MIN, x << exponent))


def rounding_half_sum(a, b) -> np.ndarray:
    """gemmlowp's RoundingHalfSum: (a + b) / 2 rounded half away from zero."""
    s = np.asarray(a, np.int64) + np.asarray(b, np.int64)
    t = s + np.where(s >= 0, 1, -1)
    return np.where(t >= 0, t >> 1, -((-t) >> 1))       # C++ division truncates


def count_leading_zeros32(x) -> np.ndarray:
    """Leading zero bits of ``x`` as a uint32 (32 for 0)."""
    v = np.asarray(x, np.int64) & 0xFFFFFFFF
    n = np.zeros(v.shape, np.int64)
    for step in (16, 8, 4, 2, 1):
        small = v < (np.int64(1) << (32 - step))
        n = n + np.where(small, step, 0)
        v = np.where(small, v << step, v)
    return np.where(np.asarray(x, np.int64) & 0xFFFFFFFF, n, 32)


def _exp_on_interval_between_negative_one_quarter_and_0_excl(a) -> np.ndarray:
    # Q0.31 in and out: a Taylor expansion of exp around -1/8.
    constant_term = 1895147668                  # exp(-1/8)
    one_third = 715827883
    x = wrap_int32(np.asarray(a, np.int64) + (1 << 28))
    x2 = srdhm(x, x)
    x3 = srdhm(x2, x)
    x4 = srdhm(x2, x2)
    x4_over_4 = rounding_divide_by_pot(x4, 2)
    poly = rounding_divide_by_pot(wrap_int32(srdhm(wrap_int32(x4_over_4 + x3), one_third) + x2),
                                  1)
    return wrap_int32(constant_term + srdhm(constant_term, wrap_int32(x + poly)))


_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
               (2, 39332535), (3, 720401), (4, 242))


def exp_on_negative_values(a, integer_bits: int) -> np.ndarray:
    """gemmlowp's exp_on_negative_values: Q(integer_bits) raw in, Q0.31 raw out."""
    a = np.asarray(a, np.int64)
    fractional_bits = 31 - integer_bits
    one_quarter = 1 << (fractional_bits - 2)
    a_mod = wrap_int32((a & (one_quarter - 1)) - one_quarter)
    result = _exp_on_interval_between_negative_one_quarter_and_0_excl(
        saturating_rounding_multiply_by_pot(a_mod, integer_bits))
    remainder = wrap_int32(a_mod - a)
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = np.int64(1) << (fractional_bits + exponent)
            result = np.where(remainder & bit, srdhm(result, multiplier), result)
    if integer_bits > 5:
        clamp = -(1 << (36 - integer_bits))
        result = np.where(a < clamp, 0, result)
    return np.where(a == 0, INT32_MAX, result)


def one_over_one_plus_x_for_x_in_0_1(a) -> np.ndarray:
    """gemmlowp's 1 / (1 + x) for a Q0.31 x in [0, 1): Newton-Raphson, Q0.31 out."""
    half_denominator = rounding_half_sum(a, INT32_MAX)
    x = wrap_int32(1515870810 + srdhm(half_denominator, -1010580540))   # Q2.29: 48/17 - 32/17 d
    for _ in range(3):
        one_minus = wrap_int32((1 << 29) - srdhm(half_denominator, x))
        x = wrap_int32(x + saturating_rounding_multiply_by_pot(srdhm(x, one_minus), 2))
    return saturating_rounding_multiply_by_pot(x, 1)


def get_reciprocal(x, x_integer_digits: int) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's GetReciprocal: (Q0.31 scale of 1/x, num_bits_over_unit) for positive x."""
    x = np.asarray(x, np.int64)
    headroom_plus_one = count_leading_zeros32(x)
    num_bits_over_unit = x_integer_digits - headroom_plus_one
    shifted_minus_one = wrap_int32(((x & 0xFFFFFFFF) << headroom_plus_one) - (1 << 31))
    return one_over_one_plus_x_for_x_in_0_1(shifted_minus_one), num_bits_over_unit


def inv_sqrt_quantized_multiplier_exp(x, reverse_shift: int) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's GetInvSqrtQuantizedMultiplierExp: 1/sqrt(x) as (multiplier, shift).

    Vectorised over non-negative int32 ``x``; inputs 0 and 1 give
    (INT32_MAX, 0) as in TFLite.
    """
    x = np.asarray(x, np.int64)
    tiny = x <= 1
    v = np.where(tiny, 2, x)
    shift = np.full(v.shape, 11, np.int64)
    while True:
        big = v >= (1 << 29)
        if not big.any():
            break
        v = np.where(big, v // 4, v)
        shift = shift + big
    pairs = (count_leading_zeros32(v) - 1) // 2 - 1
    shift = shift - pairs
    v = v << (2 * pairs)
    half_input = rounding_divide_by_pot(v >> 1, 1)        # Q3.28 x / 2
    half_three = (1 << 28) + (1 << 27)
    y = np.full(v.shape, 1 << 28, np.int64)               # Q3.28 one
    for _ in range(5):
        y3 = saturating_rounding_multiply_by_pot(srdhm(srdhm(y, y), y), 6)
        y = saturating_rounding_multiply_by_pot(
            wrap_int32(srdhm(half_three, y) - srdhm(half_input, y3)), 3)
    y = srdhm(y, 1518500250)                              # times sqrt(2) / 2
    negative = shift < 0
    y = np.where(negative, wrap_int32(y << np.where(negative, -shift, 0)), y)
    shift = np.where(negative, 0, shift) * reverse_shift
    return np.where(tiny, INT32_MAX, y), np.where(tiny, 0, shift)
