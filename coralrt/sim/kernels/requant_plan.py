"""How the requantizer's fast paths are set up and proven exact (the arithmetic
is explained in coralrt/sim/kernels/requant.py): the clamp range of each
channel found by searching TFLite's integer formula, the float64 constants
with their exactness bounds, and the float32 constants with their proof.

May import (layer 6): numpy and the rest of coralrt.sim.
"""

from __future__ import annotations

import numpy as np

try:                                   # the clip ufunc, without np.clip's Python checks
    from numpy._core.umath import clip as _clip
except ImportError:                    # numpy < 2
    from numpy.core.umath import clip as _clip

__all__ = ["no_wrap", "float_plan", "float32_steps"]

_EXACT = 1 << 53                       # integers float64 holds exactly
_F32_HALVES = 1 << 23                  # halves of integers float32 holds exactly
_TILE = 2048                           # per-channel constants tiled to this length
_F32_CHECK = 1 << 20                   # most x the float32 check computes one by one
_F32_NUDGES = 4                        # offsets tried per float32 multiplier
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def no_wrap(m, s, bias, acc_bound) -> bool:
    """True if no accumulator within ``acc_bound`` (plus the bias) overflows int32
    when left-shifted by ``s`` (> 0), as MultiplyByQuantizedMultiplier does."""
    if acc_bound is None:
        return False
    ch = max(m.size, s.size, 1 if bias is None else bias.size)
    bound = np.broadcast_to(np.asarray(acc_bound, np.int64).reshape(-1), (ch,))
    b = np.zeros(ch, np.int64) if bias is None else np.broadcast_to(bias, (ch,))
    s = np.broadcast_to(s, (ch,))
    return all(((int(a) + abs(int(c))) << max(int(k), 0)) < 1 << 31
               for a, c, k in zip(bound, b, s))


def _exact_f(x: np.ndarray, m, e, K) -> np.ndarray:
    """F(x) of the module docstring, in int64 (|x| <= 2^31, m < 2^31: no overflow).
    For a left shift (e < 0) it is srdhm(x * 2^-e, m) = floor((x m + 2^(30+e)) / 2^(31+e))."""
    p = x * m
    w = p + K + np.where((e > 0) & (p + (1 << 30) < 0), -(1 << 31), 0)
    return w >> (31 + e)


def _search(m, e, K, target: int, first_at_least: bool) -> np.ndarray:
    """Per channel: the smallest int32 x with F(x) >= target, or the largest with
    F(x) <= target (F is non-decreasing)."""
    lo = np.full(m.shape, _INT32_MIN, np.int64)
    hi = np.full(m.shape, _INT32_MAX, np.int64)
    while (lo < hi).any():
        if first_at_least:
            mid = (lo + hi) >> 1
            ok = _exact_f(mid, m, e, K) >= target
            hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid + 1)
        else:
            mid = (lo + hi + 1) >> 1
            ok = _exact_f(mid, m, e, K) <= target
            lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid - 1)
    return lo


def float_plan(m, e, bias, lo: int, hi: int, zp: int, dtype: np.dtype) -> dict | None:
    """Constants of the float64 path, or None where its exactness bounds fail."""
    if dtype not in (np.dtype(np.uint8), np.dtype(np.int8)) or lo > hi:
        return None
    if not (((m >= 1 << 30) & (m < 1 << 31)) | (m == 0)).all():
        return None
    off = zp + (128 if dtype == np.dtype(np.int8) else 0)
    if lo + off < 0 or hi + off > 255:
        return None
    ch = max(m.size, 1 if bias is None else bias.size)
    m, e = np.broadcast_to(m, (ch,)), np.broadcast_to(e, (ch,))
    b = np.zeros(ch, np.int64) if bias is None else np.broadcast_to(bias, (ch,))
    if (e < -30).any():
        return None
    K = np.where(e >= 0, (1 << 30) + np.where(e > 0, np.int64(1) << np.maximum(e - 1, 0), 0)
                 * (1 << 31), np.int64(1) << np.maximum(30 + e, 0))
    # Multipliers above 1 (e < 0) step F by more than 1: x is clamped one past
    # its range and the output clamped too.
    wide = bool((e < 0).any())
    if (np.abs(b) >= _F32_HALVES).any() or (e > 21).any():
        # b + 1/2 must be exact in float32; past e = 21 (multipliers below 2^-21)
        # the offsets no longer fit the float64 bounds anyway.
        return None
    # The search and the bounds depend on (m, e) only: done once per distinct pair.
    pairs, inverse = np.unique(np.stack([m, e]), axis=1, return_inverse=True)
    inverse = inverse.reshape(-1)
    um, ue = pairs[0], pairs[1]
    uK = K[np.unique(inverse, return_index=True)[1]]
    f_min = _exact_f(np.full(um.shape, _INT32_MIN, np.int64), um, ue, uK)[inverse]
    f_max = _exact_f(np.full(um.shape, _INT32_MAX, np.int64), um, ue, uK)[inverse]
    x_lo = _search(um, ue, uK, lo, True)[inverse]
    x_hi = _search(um, ue, uK, hi, False)[inverse]
    # A channel whose F misses the range, or is flat, is a constant.
    const = (m == 0) | (f_max < lo) | (f_min > hi) | (f_min == f_max)
    live = ~const
    signed = lo < 0 and bool(((e > 0) & live).any())
    half = 0.5 if signed else 0.0
    S = 31 + e
    xl, xh = x_lo - wide, x_hi + wide
    if (np.maximum(np.abs(xl), np.abs(xh))[live] >= _F32_HALVES).any():
        return None
    # Every quantity below is an int64 (S <= 52, |x| < 2^23, m < 2^31) that must
    # stay under 2^53 for the float64 steps to be exact.
    if signed:
        # Units of 2^-(S+1): (2x + 1) * m + kc2 (+-2^31 for e > 0).
        corr = np.where(e > 0, np.int64(1) << 31, 0)
        kc_int = 2 * K + off * (np.int64(1) << (S + 1)) - m - corr
        ends = [(2 * xl + 1) * m, (2 * xh + 1) * m]
        unit = S + 1
    else:
        corr = np.zeros_like(e)
        kc_int = K + off * (np.int64(1) << S)
        ends = [xl * m, xh * m]
        unit = S
    big = np.abs(kc_int) >= _EXACT
    for end in ends:
        big |= (np.abs(end) >= _EXACT) | (np.abs(end + kc_int) + corr >= _EXACT)
    if big[live].any():
        return None
    cols = {
        "b": b + half,
        "xlo": np.where(live, xl + half, half),
        "xhi": np.where(live, xh + half, half),
        "r": np.where(live, np.ldexp(m.astype(np.float64), -S), 0.0),
        "kc": np.where(live, np.ldexp(kc_int.astype(np.float64), -unit),
                       np.clip(f_min, lo, hi).astype(np.float64) + off),
        "dh": np.where(live & (e > 0), np.ldexp(1.0, -(e + 1)), 0.0) if signed
        else np.zeros(ch),
    }
    plan = {"signed": signed, "flip": dtype == np.dtype(np.int8),
            "tile": max(1, -(-_TILE // ch)), "clamp_out": wide,
            "ylo": np.float64(lo + off), "yhi": np.float64(hi + off)}
    for k, v in cols.items():
        arr = np.asarray(v, np.float64)
        # Uniform values as float64 scalars: a Python float would let a float32
        # operand pick a float32 loop (NumPy's casting rules), losing exactness.
        plan[k] = arr[0] if (arr == arr[0]).all() else arr
    plan["uniform_bounds"] = not isinstance(plan["xlo"], np.ndarray) and \
        not isinstance(plan["xhi"], np.ndarray)
    plan["f32"] = None
    if plan["uniform_bounds"] and not any(isinstance(plan[k], np.ndarray)
                                          for k in ("r", "kc", "dh")):
        plan["f32"] = _float32_constants(
            plan, lambda x: np.clip(_exact_f(x, m[0], e[0], K[0]), lo, hi) + off)
    return plan


def float32_steps(t: np.ndarray, r, kc, dh, plan: dict, s: np.ndarray) -> np.ndarray:
    """The float32 form, in place on ``t`` (x, or x + 1/2 in the signed form, already
    clamped): t * r + kc (+ copysign(dh, t)), clamped.  ``s``: a scratch array.
    The one sequence of float32 operations both the check and the kernels run."""
    np.multiply(t, r, out=t)
    if plan["signed"]:
        np.copysign(dh, t, out=s)        # t * r has the sign of t (r > 0, |t| >= 1/2)
    np.add(t, kc, out=t)
    if plan["signed"]:
        np.add(t, s, out=t)
    if plan["clamp_out"]:
        _clip(t, np.float32(plan["ylo"]), np.float32(plan["yhi"]), out=t)
    return t


def _float32_constants(plan: dict, exact) -> dict | None:
    """float32 (r, kc, dh) for which the float32 form gives exactly F(x) + off for
    every x of the clamped range, or None if no candidate near the float64
    constants does.

    float32 cannot hold the products exactly, so the proof has two halves.
    The float32 result differs from the exact value Y(x) = F's argument + off
    by at most E (:func:`_float32_error`: the constants' own rounding plus one
    rounding per operation).  Where Y(x) is farther than E from every integer,
    both floor to the same integer.  The other x, the "near" ones, lie within
    E / r of the points where Y crosses an integer, at most a few per output
    value: :func:`_near_integers` lists them all and each is computed with the
    very float32 operations the kernels run (float32 arithmetic is
    deterministic: correctly rounded, never fused) and compared with F.  The
    values must also stay in (-1, 256), where the cast to uint8 truncates."""
    half = 0.5 if plan["signed"] else 0.0
    lo, hi = int(plan["xlo"] - half), int(plan["xhi"] - half)
    dh = np.float32(plan["dh"])
    r0, kc0 = np.float32(plan["r"]), np.float32(plan["kc"])

    def misses(r, kc):
        """None if (r, kc) is exact on the whole range, else the direction to nudge kc."""
        xs = _near_integers(plan, lo, hi, r, kc)
        if xs is None:
            return 0.0                                      # too many to check
        t = xs.astype(np.float32) + np.float32(half)
        y = float32_steps(t, r, kc, dh, plan, np.empty_like(t))
        if y.min(initial=0) <= -1 or y.max(initial=0) >= 256:
            return 0.0                                      # no nudge helps
        got, want = y.astype(np.uint8).astype(np.int64), exact(xs)
        bad = got != want
        if bad.any():
            return np.inf if (got[bad] < want[bad]).sum() * 2 >= bad.sum() else -np.inf
        return None

    for r in (r0, np.nextafter(r0, np.float32(np.inf)), np.nextafter(r0, np.float32(0))):
        kc = kc0
        for _ in range(_F32_NUDGES):
            direction = misses(r, kc)
            if direction is None:
                return {"r": r, "kc": kc, "dh": dh}
            if direction == 0.0:
                break
            kc = np.nextafter(kc, np.float32(direction))    # toward the side of the misses
    return None


def _float32_error(plan: dict, lo: int, hi: int, r32, kc32) -> float:
    """A bound on |float32 result - Y(x)| over x in [lo, hi] (see _float32_constants).

    With t = x (+ 1/2) exact, the float32 steps are p = fl(t r32), q = fl(p + kc32)
    and, signed, fl(q +- dh) (dh a power of two, exact); each fl() is off by at
    most u = 2^-24 times its result, and every result is at most
    B = |t| max(r) + max(|kc|) + dh + 256 in magnitude (the output is below 256,
    and |t r| can exceed it only by |kc|).  So the error is at most
    |t| |r32 - r| + |kc32 - kc| + 3 u B (1 + 2u)^2, taken here with margin."""
    half = 0.5 if plan["signed"] else 0.0
    t = max(abs(lo + half), abs(hi + half))
    r, kc, dh = float(plan["r"]), float(plan["kc"]), float(plan["dh"])
    r32, kc32 = float(r32), float(kc32)
    bound = t * max(r, r32) + max(abs(kc), abs(kc32)) + dh + 256.0
    return (t * abs(r32 - r) + abs(kc32 - kc) + 3.0 * 2.0**-24 * bound) * 1.01 + 2.0**-40


def _near_integers(plan: dict, lo: int, hi: int, r32, kc32) -> np.ndarray | None:
    """Every x in [lo, hi] whose Y(x) lies within the float32 error of an integer
    (plus the range's ends), or None if there would be too many to list.

    Y(x) = x r + c, with c = kc (unsigned form) or (1/2) r + kc +- dh for x >= 0
    and x < 0 (signed form): for each integer n Y can reach, the x with
    |x r + c - n| <= E form one short interval, listed with a margin of one x
    on each side for the rounding of the division that finds it."""
    err = _float32_error(plan, lo, hi, r32, kc32)
    r, kc, dh = float(plan["r"]), float(plan["kc"]), float(plan["dh"])
    if r == 0.0:                                          # a constant: one x tells
        return np.array([lo, hi], np.int64)
    if plan["signed"]:
        offsets = (0.5 * r + kc + dh, 0.5 * r + kc - dh)
    else:
        offsets = (kc,)
    ends = [x * r + c for x in (lo, hi) for c in offsets]
    n = np.arange(np.floor(min(ends) - err) - 1, np.ceil(max(ends) + err) + 2)
    width = int(np.ceil(2 * err / r)) + 4
    if n.size * width * len(offsets) > _F32_CHECK:
        return None
    parts = [np.array([lo, hi], np.int64)]
    for c in offsets:
        first = np.floor((n - c - err) / r).astype(np.int64) - 1
        parts.append((first[:, None] + np.arange(width)).reshape(-1))
    xs = np.unique(np.concatenate(parts))
    return xs[(xs >= lo) & (xs <= hi)]
