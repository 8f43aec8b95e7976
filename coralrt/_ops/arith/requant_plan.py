"""How the requantizer's fast paths are set up and proven exact (the arithmetic
is explained in coralrt/_ops/arith/requant.py): the range of accumulators
that can still change each channel's output, found by searching TFLite's
integer formula; the float64 constants with their exactness bounds; the
float32 constants with their proof; and whether the results fit int16.
"""

from __future__ import annotations

import numpy as np

__all__ = ["no_wrap", "float_plan", "float32_steps"]

_EXACT = 1 << 53                       # integers float64 holds exactly
_F32_HALVES = 1 << 23                  # halves of integers float32 holds exactly
_INT16 = 32000                         # |y| below this casts to int16 exactly (with margin)
_TILE = 2048                           # per-channel constants tiled to this length
_F32_NUDGES = 6                        # offsets tried per float32 multiplier
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
    """F(x) of requant.py's docstring, in int64 (|x| <= 2^31, m < 2^31: no overflow).
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


def _first_at_least(m, e, K, v: np.ndarray) -> np.ndarray | None:
    """For channels (axis 0) and targets ``v`` (axis 1): the smallest x in
    [-2^31, 2^31] with F(x) >= v, by exact integer division, checked; None if a
    check fails (it cannot, barring a slip in this formula).

    F(x) >= v  <=>  x m + K - c >= v 2^S, with c = 2^31 for x < 0 (and e > 0):
    the first x is the negative-side solution if that is negative, else the
    non-negative side's (at least 0)."""
    m, e, K = (np.asarray(a, np.int64)[:, None] for a in (m, e, K))
    need = v[None, :] * (np.int64(1) << (31 + e)) - K              # |.| < 2^61
    pos = -((-need) // m)
    neg = -((-(need + np.where(e > 0, np.int64(1) << 31, 0))) // m)
    x = np.clip(np.where(neg < 0, neg, np.maximum(pos, 0)), _INT32_MIN, _INT32_MAX + 1)
    inner = (x > _INT32_MIN) & (x <= _INT32_MAX)
    ok = (_exact_f(x - 1, m, e, K) < v) | ~inner
    ok &= (_exact_f(np.minimum(x, _INT32_MAX), m, e, K) >= v) | (x > _INT32_MAX)
    return x if ok.all() else None


def float_plan(m, e, bias, lo: int, hi: int, zp: int, dtype: np.dtype,
               acc_bound=None) -> dict | None:
    """Constants of the float paths, or None where the float64 path's exactness
    bounds fail.  ``acc_bound``: the largest |accumulator| (without the bias)
    per channel or for all, if known."""
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
    # Exact on [x_lo - 1, x_hi + 1]; beyond, every step is monotonic in x, so the
    # output stays clamped (requant.py's docstring).
    xl, xh = x_lo - 1, x_hi + 1
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
        "r": np.where(live, np.ldexp(m.astype(np.float64), -S), 0.0),
        "kc": np.where(live, np.ldexp(kc_int.astype(np.float64), -unit),
                       np.clip(f_min, lo, hi).astype(np.float64) + off),
        "dh": np.where(live & (e > 0), np.ldexp(1.0, -(e + 1)), 0.0) if signed
        else np.zeros(ch),
    }
    plan = {"signed": signed, "flip": dtype == np.dtype(np.int8),
            "tile": max(1, -(-_TILE // ch)), "L": lo + off, "H": hi + off}
    for k, v in cols.items():
        arr = np.asarray(v, np.float64)
        # Uniform values as float64 scalars: a Python float would let a float32
        # operand pick a float32 loop (NumPy's casting rules), losing exactness.
        plan[k] = arr[0] if (arr == arr[0]).all() else arr
    # |t| for every accumulator the operator can produce (t = acc + b (+ 1/2)).
    reach = None
    if acc_bound is not None:
        bound = np.asarray(acc_bound, np.float64).reshape(-1)
        if bound.size != ch:             # per-channel bounds of a per-tensor requantizer
            bound = np.full(ch, bound.max())
        reach = bound + np.abs(b) + 1
    plan["int16"] = reach is not None and bool(
        (reach * cols["r"] + np.abs(cols["kc"]) + cols["dh"]).max() < _INT16)
    exact = (m, e, K, off)
    plan["f32"] = _float32_constants(plan, cols, live, exact, reach)
    return plan


def float32_steps(t: np.ndarray, r, kc, dh, plan: dict, s: np.ndarray) -> np.ndarray:
    """The float32 form, in place on ``t`` (x, or x + 1/2 in the signed form):
    t * r + kc (+ copysign(dh, t)).  ``s``: a scratch array.  The one sequence of
    float32 operations both the proof and the kernels run."""
    np.multiply(t, r, out=t)
    if plan["signed"]:
        np.copysign(dh, t, out=s)        # t * r has the sign of t (r > 0, |t| >= 1/2)
    np.add(t, kc, out=t)
    if plan["signed"]:
        np.add(t, s, out=t)
    return t


def _float32_constants(plan: dict, cols: dict, live: np.ndarray, exact, reach) -> dict | None:
    """float32 (r, kc, dh), per channel or for all, for which the float32 form gives
    exactly the clamped F(x) + off for every x an accumulator can reach, or None if
    no candidate near the float64 constants does for some channel.

    **The proof.**  Every float32 step is monotonic in x (correctly rounded
    products and sums by positive or fixed operands; the sign term steps up at
    0), and so is the final clamp and cast; call the result g.  The exact
    output f is monotonic too, and constant on each run of x between the points
    x_n where F(x) + off first reaches n.  If g = f at both ends of every run
    (x_n - 1 and x_n, for n from L to H + 1), then on a run g is squeezed
    between two equal values, so g = f everywhere.  That is two points per
    output value and channel (:func:`check_points`), computed with the very
    float32 operations the kernels run (float32 arithmetic is deterministic:
    correctly rounded, never fused).  Where a channel's nearest constants fail,
    the offset is nudged a few units in the last place towards its misses, and
    the multiplier one unit either way.

    Small multipliers usually fail: float32 resolves y to about 2^-16 while
    consecutive x differ by r in y, so with r near 0.005 (typical of int8
    per-channel layers) a few of a channel's 516 points lie too close to an
    integer for any nearby constants."""
    r64, kc64, dh64 = (np.broadcast_to(cols[k], live.shape).astype(np.float64)
                       for k in ("r", "kc", "dh"))
    r32, kc32, dh32 = r64.astype(np.float32), kc64.astype(np.float32), dh64.astype(np.float32)
    if (kc32[~live] != kc64[~live]).any():
        return None                                  # constants: integers below 256
    idx = np.flatnonzero(live)
    if idx.size:
        # The constants depend on (m, e) only: one proof per distinct pair, over
        # the widest reach of its channels.
        m, e, K = (np.broadcast_to(a, live.shape)[idx] for a in exact[:3])
        _, first, inverse = np.unique(np.stack([m, e]), axis=1, return_index=True,
                                      return_inverse=True)
        inverse = inverse.reshape(-1)
        group_reach = None
        if reach is not None:
            group_reach = np.zeros(first.size)
            np.maximum.at(group_reach, inverse, reach[idx])
        rep = idx[first]
        found = _search_float32(plan, (m[first], e[first], K[first], exact[3]), group_reach,
                                r32[rep], kc32[rep], dh32[rep])
        if found is None:
            return None
        r32[idx], kc32[idx] = found[0][inverse], found[1][inverse]
    out = {}
    for k, v in (("r", r32), ("kc", kc32), ("dh", dh32)):
        out[k] = v[0] if (v == v[0]).all() else v
    return out


def _search_float32(plan: dict, exact, reach, r32, kc32, dh32):
    """(r, kc) per row (a distinct (m, e) pair) that pass :func:`check_points`, trying
    the nearest constants, then offsets nudged towards the misses and the
    multiplier one unit either way; None if some row finds none."""
    if r32.size > 64:
        # Rows fail together (small multipliers): a sample of 16 tells, cheaply.
        pick = np.linspace(0, r32.size - 1, 16).astype(np.int64)
        points = check_points(plan, tuple(a[pick] for a in exact[:3]) + (exact[3],),
                              None if reach is None else reach[pick])
        if points is None:
            return None
        got = float32_outputs(plan, points[0], r32[pick], kc32[pick], dh32[pick])
        if (got != points[1]).any(axis=1).sum() * 4 > pick.size:
            return None
    points = check_points(plan, exact, reach)
    if points is None:
        return None
    t, want = points
    r32, kc32 = r32.copy(), kc32.copy()
    todo = np.arange(r32.size)
    for dr in (0, 1, -1):
        r_try = r32[todo]
        if dr:
            r_try = np.nextafter(r_try, np.float32(dr * np.inf))
        kc_try = kc32[todo]
        for _ in range(_F32_NUDGES):
            got = float32_outputs(plan, t[todo], r_try, kc_try, dh32[todo])
            bad = got != want[todo]
            ok = ~bad.any(axis=1)
            r32[todo[ok]], kc32[todo[ok]] = r_try[ok], kc_try[ok]
            low = np.where(bad, got < want[todo], False).sum(axis=1)
            up = low * 2 >= bad.sum(axis=1)
            todo, r_try, kc_try, up = todo[~ok], r_try[~ok], kc_try[~ok], up[~ok]
            if not todo.size:
                return r32, kc32
            if todo.size * 4 > r32.size:
                return None          # nudges rescue a few rows, never most (load time)
            kc_try = np.nextafter(kc_try, np.where(up, np.float32(np.inf), np.float32(-np.inf)))
    return None


def check_points(plan: dict, exact, reach):
    """(t, want), one row per (m, e, K) of ``exact``: the float32 inputs t = x (+ 1/2)
    at both ends of every run of the exact output, and the exact clamped outputs
    there; None if the proof cannot cover the range.  ``reach``: per row, the
    largest |x| an accumulator can give (None: unknown).

    Points are clipped to the reachable x, below 2^23 in magnitude (where
    x + 1/2 is exact); if the reachable range is wider than that, or unknown,
    f must already be clamped at the ends (past them g is only known to be
    monotonic)."""
    L, H = plan["L"], plan["H"]
    m, e, K, off = exact
    rows = m.size
    cap = np.float64(_F32_HALVES - 2)
    xc = (np.full(rows, cap) if reach is None else np.minimum(reach, cap))
    xc = xc.astype(np.int64)[:, None]
    firsts = _first_at_least(m, e, K, np.arange(L, H + 2, dtype=np.int64) - off)
    if firsts is None:
        return None
    x = np.clip(np.concatenate([firsts - 1, firsts, -xc, xc], axis=1), -xc, xc)
    want = np.clip(_exact_f(x, m[:, None], e[:, None], K[:, None]) + off, L, H)
    wide = np.ones(rows, bool) if reach is None else reach > xc[:, 0]
    if (wide & ((want[:, -2] != L) | (want[:, -1] != H))).any():
        return None
    half = np.float32(0.5 if plan["signed"] else 0.0)
    return x.astype(np.float32) + half, want


def float32_outputs(plan: dict, t: np.ndarray, r, kc, dh) -> np.ndarray:
    """What the kernels output for float32 inputs ``t`` (rows: channels) with
    per-row constants: the float32 steps, then truncation and the clamp (the
    int16 cast and the float clamp then uint8 cast give the same for y >= 0 and
    for y < 0, where both give L)."""
    y = float32_steps(t.copy(), r[:, None], kc[:, None], dh[:, None], plan,
                      np.empty(t.shape, np.float32))
    return np.clip(np.trunc(y), plan["L"], plan["H"])
