"""gemmlowp's int16 fixed point, as TFLite's integer LSTM uses it.

The logistic and tanh of int16 fixed-point values, reproduced bit for bit
(gemmlowp's ``exp_on_negative_values`` and Newton-Raphson reciprocal) and
evaluated once for all 65536 inputs into lookup tables
(:func:`sigmoid_q3_12`, :func:`tanh_int16`).

All values are int64 arrays holding int16 values; ``_w16`` reproduces the
truncation C++ applies when a wider intermediate is stored back as int16.
"""

from __future__ import annotations

import numpy as np

try:                                   # the clip ufunc, without np.clip's Python checks
    from numpy._core.umath import clip as _clip
except ImportError:                    # numpy < 2
    from numpy.core.umath import clip as _clip

__all__ = ["sigmoid_q3_12", "tanh_int16"]

_I16_MIN, _I16_MAX = -32768, 32767


def _w16(x):
    return ((np.asarray(x, np.int64) + 32768) & 0xFFFF) - 32768


def _tdiv(x, d: int):
    """C++ integer division (truncates toward zero) by a positive constant."""
    q = np.abs(x) // d
    return np.where(x < 0, -q, q)


def _srdhm16(a, b):
    ab = a * b
    q = _tdiv(ab + np.where(ab >= 0, 1 << 14, 1 - (1 << 14)), 1 << 15)
    return np.where((a == b) & (a == _I16_MIN), _I16_MAX, _w16(q))


def _rdbypot(x, exponent: int):
    mask = (1 << exponent) - 1
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + ((x & mask) > threshold)


def _srmbypot16(x, exponent: int):
    """SaturatingRoundingMultiplyByPOT<exponent> on int16."""
    if exponent == 0:
        return x
    if exponent < 0:
        return _rdbypot(x, -exponent)
    threshold = (1 << (15 - exponent)) - 1
    r = _w16(x << exponent)
    return np.where(x > threshold, _I16_MAX, np.where(x < -threshold, _I16_MIN, r))


def _const16(raw32: int) -> int:
    """A gemmlowp constant given as int32 raw, narrowed to int16."""
    return int(_w16(_rdbypot(np.int64(raw32), 16)))


def _exp_on_quarter_interval(a):
    """exp(a) for a in [-1/4, 0), Q0.15 in and out."""
    c_term, c_third = _const16(1895147668), _const16(715827883)
    x = _w16(a + (1 << 12))
    x2 = _srdhm16(x, x)
    x3 = _srdhm16(x2, x)
    x4 = _srdhm16(x2, x2)
    t = _w16(_srdhm16(_w16(_rdbypot(x4, 2) + x3), c_third) + x2)
    t = _rdbypot(t, 1)
    return _clip(c_term + _srdhm16(c_term, _w16(x + t)), _I16_MIN, _I16_MAX)


_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
               (2, 39332535), (3, 720401), (4, 242))


def _exp_on_negative_values(a, integer_bits: int):
    frac = 15 - integer_bits
    quarter = 1 << (frac - 2)
    a_mod = _w16((a & (quarter - 1)) - quarter)
    result = _exp_on_quarter_interval(_srmbypot16(a_mod, integer_bits))
    remainder = _w16(a_mod - a)
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = int(_w16(1 << (frac + exponent)))
            result = np.where((remainder & bit) != 0,
                              _srdhm16(result, _const16(multiplier)), result)
    if integer_bits > 5:
        clamp = _const16(-(1 << (36 - integer_bits)))
        result = np.where(a < clamp, 0, result)
    return np.where(a == 0, _I16_MAX, result)


def _newton_reciprocal(a):
    """x ~= 1 / ((1 + a) / 2) in Q2.13, for a in Q0.15."""
    s = a + _I16_MAX
    half = _w16(_tdiv(s + np.where(s >= 0, 1, -1), 2))
    x = _w16(_const16(1515870810) + _srdhm16(half, _const16(-1010580540)))
    for _ in range(3):
        one_minus = _w16((1 << 13) - _srdhm16(half, x))
        x = _w16(x + _srmbypot16(_srdhm16(x, one_minus), 2))
    return x


def _logistic(a, integer_bits: int):
    positive = a > 0
    abs_a = np.where(positive, a, _w16(-a))
    e = _exp_on_negative_values(_w16(-abs_a), integer_bits)
    r_pos = _srmbypot16(_newton_reciprocal(e), 1)
    r_neg = _w16(_I16_MAX - r_pos)
    return np.where(a == 0, _const16(1 << 30), np.where(positive, r_pos, r_neg))


def _tanh(a, integer_bits: int):
    negative = a < 0
    n = np.where(negative, a, _w16(-a))
    e = _exp_on_negative_values(n, integer_bits + 1)
    t = _srmbypot16(_w16(_newton_reciprocal(e) - (1 << 13)), 2)
    return np.where(a == 0, 0, np.where(negative, _w16(-t), t))


_ALL_INT16 = np.arange(_I16_MIN, _I16_MAX + 1, dtype=np.int64)
_TABLES: dict = {}


def sigmoid_q3_12() -> np.ndarray:
    """int16 logistic of every Q3.12 input (index = raw + 32768), Q0.15 out."""
    if "sigmoid" not in _TABLES:
        _TABLES["sigmoid"] = _logistic(_ALL_INT16, 3).astype(np.int16)
    return _TABLES["sigmoid"]


def tanh_int16(integer_bits: int) -> np.ndarray:
    """int16 tanh of every input with ``integer_bits`` integer bits, Q0.15 out."""
    key = ("tanh", integer_bits)
    if key not in _TABLES:
        _TABLES[key] = _tanh(_ALL_INT16, integer_bits).astype(np.int16)
    return _TABLES[key]
