"""Requantization of convolution accumulators, bit-exact with TFLite and fast.

TFLite turns an int32 accumulator ``acc`` (plus the bias) into an 8-bit
output with ``MultiplyByQuantizedMultiplier(acc + bias, m, shift)``, adds the
output zero point and clamps to the activation range.  :class:`Requantizer`
reproduces that; :class:`DoubleRequantizer` the double-precision rounding
LiteRT's reference FULLY_CONNECTED uses instead.

**The arithmetic.**  For ``shift = -e <= 0`` and ``m`` in [2^30, 2^31), with
``x = acc + bias`` and ``P = x * m``: SaturatingRoundingDoublingHighMul is
floor((P + 2^30) / 2^31); RoundingDivideByPOT by 2^e adds 2^(e-1), minus 1
for a negative value, and floors; nested floors by powers of two compose, so
with S = 31 + e::

    F(x) = floor((P + 2^30 + 2^(e-1) * 2^31 - [x < 0 and e > 0] * 2^31) / 2^S)

(``P + 2^30 < 0`` is ``x < 0`` because m >= 2^30).  F is non-decreasing and
rises by at most 1 per unit of x (the real multiplier m / 2^S is below 1).

**The fast path: float64, proven exact.**  The output is F clamped to an
8-bit range, so only the x between x_lo (the first x with F(x) >= lo) and
x_hi (the last with F(x) <= hi) matter: every x below x_lo gives lo, above
x_hi gives hi, and F(x_lo) = lo, F(x_hi) = hi because F never skips a value.
Clamping the accumulator to [x_lo - bias, x_hi - bias] first, the output
clamp becomes unnecessary and x stays small (about 256 / multiplier).  Then
everything is done in float64 on integers scaled by 2^-S (or 2^-(S+1)):

* unsigned form (no correction needed): ``y = acc * r + kc`` with r = m / 2^S
  and kc = (bias * m + 2^30 + 2^(e-1) * 2^31 + off * 2^S) / 2^S;
* signed form: ``t = acc + (bias + 0.5)`` (= x + 1/2, never 0),
  ``y = t * r + kc' + copysign(2^-(e+1), t)`` with kc' shifted by
  -m / 2^(S+1) - 2^-(e+1): for x >= 0 the sign term cancels the shift, for
  x < 0 it subtracts 2^-e, which is the -2^31 / 2^S above.

Every operand and every partial sum is an integer times 2^-S (2^-(S+1)) whose
integer part stays below 2^53 in magnitude - checked per channel at load time
from x_lo, x_hi and the bias - so each float64 multiply and add is exact, and
``y`` is exactly F(x) + off plus a fraction in [0, 1).  ``off`` (the zero
point, plus 128 for int8) makes floor(y) lie in [0, 255], where a cast to
uint8 truncates, which is the floor.  int8 outputs then flip their top bit
(u - 128 == u ^ 0x80 read as int8).  The accumulator itself is an integer
held exactly in float32 (|acc| <= 2^24) or float64, and the clamp bounds are
integers of at most 2^24 in magnitude, exact in both.  Channels where any
bound fails (huge biases, multipliers below about 2^-13, int16 outputs) take
the int64 path: the same formula with integer shifts.

tests/kernels/test_requant.py checks both paths against TFLite's two-step
fixed-point helpers (coralrt/sim/fixedpoint.py) on random and boundary
accumulators; the kernel tests compare whole operators with LiteRT.
"""

from __future__ import annotations

import numpy as np

try:                                   # the clip ufunc, without np.clip's Python checks
    from numpy._core.umath import clip as _clip
except ImportError:                    # numpy < 2
    from numpy.core.umath import clip as _clip

from coralrt.sim import fixedpoint
from coralrt.sim.parallel import for_bands
from coralrt.sim.scratch import TEMPORARIES

__all__ = ["Requantizer", "DoubleRequantizer"]

_EXACT = 1 << 53                       # integers float64 holds exactly
_F32_HALVES = 1 << 23                  # halves of integers float32 holds exactly
_TILE = 2048                           # per-channel constants tiled to this length
_F32_CHECK = 1 << 21                   # longest range of x the float32 check covers
_F32_NUDGES = 4                        # offsets tried per float32 multiplier
_F32_PIECE = 1 << 16                   # x values checked at a time
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


class Requantizer:
    """Accumulators (without bias) -> output integers, exactly as TFLite's
    ``MultiplyByQuantizedMultiplier(acc + bias, m, shift) + zero_point`` clamped to
    the activation range; multipliers broadcast along the last axis.

    ``path`` says which arithmetic runs: ``"float"`` (the proven-exact float64
    form), ``"int64"`` (the folded one-shift integer form) or ``"general"``
    (multipliers above 1, step by step).  Work goes in row blocks that stay in
    cache, spread over the simulator's threads.
    """

    BLOCK = 1 << 17      # elements per block

    def __init__(self, multipliers, shifts, zero_point: int, act_min: int, act_max: int,
                 dtype: np.dtype, bias: np.ndarray | None = None, acc_bound=None):
        """``acc_bound``: the largest |accumulator| the operator can produce (per
        channel or one for all), if known; it lets multipliers above 1 take the
        float path where it proves TFLite's int32 left shift cannot wrap."""
        m = np.asarray(multipliers, np.int64).reshape(-1)
        s = np.asarray(shifts, np.int64).reshape(-1)
        if m.size > 1 and (m == m[0]).all() and (s == s[0]).all():
            m, s = m[:1], s[:1]
        self.dtype = np.dtype(dtype)
        self.zp = int(zero_point)
        self.lo, self.hi = int(act_min) - self.zp, int(act_max) - self.zp
        self.bias = None if bias is None else np.asarray(bias, np.int64).reshape(-1)
        self._typed = {}
        self._channels = max(m.size, 1 if self.bias is None else self.bias.size)
        left = bool((s > 0).any())
        plan = None
        if not (s < -31).any() and (not left or _no_wrap(m, s, self.bias, acc_bound)):
            plan = _float_plan(m, -s, self.bias, self.lo, self.hi, self.zp, self.dtype)
        if plan is not None:
            self.path, self._plan = "float", plan
        elif left or (s < -31).any():
            # Left shifts that may wrap, and shifts past 31 (never produced by
            # QuantizeMultiplier): the step-by-step route.
            self.path = "general"
            self.m, self.s = m, s
        else:
            self.path = "int64"
            self._int_setup(m, -s)

    def _int_setup(self, m: np.ndarray, e: np.ndarray) -> None:
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

    def pre_add(self) -> np.ndarray | None:
        """What the float path adds to each channel's accumulators first (the bias,
        plus 1/2 in the signed form), for a caller that can fold it into its own
        sums (then ``pre_added=True``); None on the other paths."""
        if self.path != "float":
            return None
        return np.broadcast_to(np.asarray(self._plan["b"], np.float64), (self._channels,))

    def __call__(self, acc: np.ndarray, out: np.ndarray | None = None,
                 pre_added: bool = False) -> np.ndarray:
        """``acc``: integer-valued float or int array of shape (..., channels); it may
        be overwritten.  ``out``: where to write (a new array by default).
        ``pre_added``: ``acc`` already holds :meth:`pre_add`."""
        if out is None:
            out = np.empty(acc.shape, self.dtype)
        if self.path == "general":
            v = acc.astype(np.int64)
            if self.bias is not None:
                v += self.bias
            v = fixedpoint.multiply_by_quantized_multiplier(v, self.m, self.s)
            np.clip(v, self.lo, self.hi, out=v)
            np.add(v, self.zp, out=out, casting="unsafe")
            return out
        ch = acc.shape[-1] if acc.ndim else 1
        a2 = acc.reshape(-1, ch)
        o2 = out.reshape(a2.shape)
        if self.path == "int64":
            rows = max(1, self.BLOCK // max(ch, 1))
            for_bands(a2.shape[0], rows, lambda r0, r1: self._int_block(a2[r0:r1], o2[r0:r1]))
            return out
        if a2.dtype.kind != "f":
            a2 = a2.astype(np.float64)
        # Per-channel constants are tiled ``tile`` times, so that the block is seen
        # as rows of tile * channels values: long inner loops instead of one
        # short loop per position.  Leftover rows use the untiled constants.
        tile = self._plan["tile"]
        whole = a2.shape[0] - a2.shape[0] % tile
        if whole:
            wide, owide = a2[:whole].reshape(-1, tile * ch), o2[:whole].reshape(-1, tile * ch)
            rows = max(1, self.BLOCK // (tile * ch))
            consts = self._consts(a2.dtype, True)
            for_bands(wide.shape[0], rows,
                      lambda r0, r1: self._float_block(wide[r0:r1], owide[r0:r1], consts,
                                                       pre_added))
        if whole < a2.shape[0]:
            self._float_block(a2[whole:], o2[whole:], self._consts(a2.dtype, False), pre_added)
        return out

    def _consts(self, dtype: np.dtype, tiled: bool) -> dict:
        key = (np.dtype(dtype), tiled)
        consts = self._typed.get(key)
        if consts is None:
            consts = {}
            for k, v in self._plan.items():
                if isinstance(v, np.ndarray) and tiled:
                    v = np.tile(v, self._plan["tile"])
                if k in ("b", "xlo", "xhi", "dh"):
                    # Operands meeting the accumulators take their type, for
                    # loops of that type (exact: integers and halves below 2^23,
                    # powers of two).
                    v = v.astype(dtype) if isinstance(v, np.ndarray) else np.dtype(dtype).type(v)
                consts[k] = v
            self._typed[key] = consts
        return consts

    def _float_block(self, blk: np.ndarray, out: np.ndarray, c: dict,
                     pre_added: bool = False) -> None:
        t = TEMPORARIES.array("requant.t", blk.shape, blk.dtype)
        src = blk
        if not pre_added:
            np.add(blk, c["b"], out=t)              # x (+ 1/2 in the signed form)
            src = t
        if c["uniform_bounds"]:
            _clip(src, c["xlo"], c["xhi"], out=t)
        else:   # np.maximum/np.minimum: clip with array bounds is several times slower
            np.maximum(src, c["xlo"], out=t)
            np.minimum(t, c["xhi"], out=t)
        o8 = out.view(np.uint8)
        f32 = c["f32"]
        if f32 is not None and t.dtype == np.float32:
            s = TEMPORARIES.array("requant.s", t.shape, np.float32) if c["signed"] else None
            np.copyto(o8, _float32_steps(t, f32["r"], f32["kc"], f32["dh"], c, s),
                      casting="unsafe")
        else:
            y = TEMPORARIES.array("requant.y", t.shape, np.float64)
            np.multiply(t, c["r"], out=y, dtype=np.float64)
            np.add(y, c["kc"], out=y)
            if c["signed"]:
                np.copysign(c["dh"], t, out=t)
                np.add(y, t, out=y)
            if c["clamp_out"]:
                _clip(y, c["ylo"], c["yhi"], out=y)
            np.copyto(o8, y, casting="unsafe")      # truncation = floor: y >= 0
        if c["flip"]:
            np.bitwise_xor(o8, 0x80, out=o8)

    def _int_block(self, blk: np.ndarray, out: np.ndarray) -> None:
        v = TEMPORARIES.array("requant.v", blk.shape, np.int64)
        np.copyto(v, blk, casting="unsafe")       # exact: the values are integers
        v *= self.m
        v += self.k
        if self.signed:
            t = TEMPORARIES.array("requant.s", blk.shape, np.int64)
            np.right_shift(v, 63, out=t)           # -1 where P + 2^30 < 0
            t &= self.mask
            v += t
            v += self.k2
        v >>= self.shift
        _clip(v, self.lo, self.hi, out=v)
        np.add(v, self.zp, out=out, casting="unsafe")


def _no_wrap(m, s, bias, acc_bound) -> bool:
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


def _float_plan(m, e, bias, lo: int, hi: int, zp: int, dtype: np.dtype) -> dict | None:
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
    f_min = _exact_f(np.full(ch, _INT32_MIN, np.int64), m, e, K)
    f_max = _exact_f(np.full(ch, _INT32_MAX, np.int64), m, e, K)
    x_lo = _search(m, e, K, lo, True)
    x_hi = _search(m, e, K, hi, False)
    # A channel whose F misses the range, or is flat, is a constant.
    const = (m == 0) | (f_max < lo) | (f_min > hi) | (f_min == f_max)
    signed = lo < 0 and bool(((e > 0) & ~const).any())
    cols = {k: [] for k in ("b", "xlo", "xhi", "r", "kc", "dh")}
    half = 0.5 if signed else 0.0
    for c in range(ch):
        mc, ec, bc, Kc = int(m[c]), int(e[c]), int(b[c]), int(K[c])
        S = 31 + ec
        if abs(bc) >= _F32_HALVES:                  # bc + 1/2 exact in float32
            return None
        if const[c]:
            value = int(np.clip(f_min[c], lo, hi)) + off
            row = (bc + half, half, half, 0.0, float(value), 0.0)
        else:
            xl, xh = int(x_lo[c]) - wide, int(x_hi[c]) + wide
            if max(abs(xl), abs(xh)) >= _F32_HALVES:
                return None
            if signed:
                # Units of 2^-(S+1): (2x + 1) * m + kc2 (+-2^31 for e > 0).
                corr = (1 << 31) if ec > 0 else 0
                kc2 = 2 * Kc + off * (1 << (S + 1)) - mc - corr
                ends = [(2 * x + 1) * mc for x in (xl, xh)]
                if abs(kc2) >= _EXACT or any(abs(a) >= _EXACT or abs(a + kc2) + corr >= _EXACT
                                             for a in ends):
                    return None
                kc = np.ldexp(float(kc2), -(S + 1))
                dh = np.ldexp(1.0, -(ec + 1)) if ec > 0 else 0.0
            else:
                kc_int = Kc + off * (1 << S)
                ends = [x * mc for x in (xl, xh)]
                if abs(kc_int) >= _EXACT or any(abs(a) >= _EXACT or abs(a + kc_int) >= _EXACT
                                                for a in ends):
                    return None
                kc, dh = np.ldexp(float(kc_int), -S), 0.0
            row = (bc + half, xl + half, xh + half, np.ldexp(float(mc), -S), kc, dh)
        for k, v in zip(cols, row):
            cols[k].append(v)
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
        plan["f32"] = _float32_constants(plan, lambda x: _exact_f(x, m[0], e[0], K[0]) + off)
    return plan


def _float32_steps(t: np.ndarray, r, kc, dh, plan: dict, s: np.ndarray) -> np.ndarray:
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
    every x of the clamped range, checked one x at a time; None if no candidate
    near the float64 constants passes or the range is too long to check.

    float32 cannot hold the products exactly, so this is a proof by exhaustion
    instead of by bounds: float32 arithmetic is deterministic (every operation
    correctly rounded, none fused), so the kernels, which run the same
    operations on the same clamped x, produce what was checked.  The values
    must also stay in (-1, 256), where the cast to uint8 truncates.  The range
    is checked in pieces, so the check's memory stays small."""
    half = 0.5 if plan["signed"] else 0.0
    lo, hi = int(plan["xlo"] - half), int(plan["xhi"] - half)
    if hi - lo + 1 > _F32_CHECK:
        return None
    dh = np.float32(plan["dh"])
    r0, kc0 = np.float32(plan["r"]), np.float32(plan["kc"])

    def misses(r, kc):
        """None if (r, kc) is exact on the whole range, else the direction to nudge kc."""
        for start in range(lo, hi + 1, _F32_PIECE):
            xs = np.arange(start, min(start + _F32_PIECE, hi + 1), dtype=np.int64)
            t = xs.astype(np.float32) + np.float32(half)
            y = _float32_steps(t, r, kc, dh, plan, np.empty_like(t))
            if y.min(initial=0) <= -1 or y.max(initial=0) >= 256:
                return 0.0                                  # no nudge helps
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
