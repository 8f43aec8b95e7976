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
x_hi (the last with F(x) <= hi) need exact arithmetic: every x below x_lo
gives lo, above x_hi gives hi.  In float64, on integers scaled by 2^-S
(or 2^-(S+1)), with ``t = acc + bias``:

* unsigned form (no correction needed): ``y = t * r + kc`` with r = m / 2^S
  and kc = (2^30 + 2^(e-1) * 2^31 + off * 2^S) / 2^S;
* signed form: ``t = acc + (bias + 0.5)`` (= x + 1/2, never 0),
  ``y = t * r + kc' + copysign(2^-(e+1), t)`` with kc' shifted by
  -m / 2^(S+1) - 2^-(e+1): for x >= 0 the sign term cancels the shift, for
  x < 0 it subtracts 2^-e, which is the -2^31 / 2^S above.

For x in [x_lo - 1, x_hi + 1] every operand and every partial sum is an
integer times 2^-S (2^-(S+1)) whose integer part stays below 2^53 in
magnitude - checked per channel at load time - so each float64 multiply and
add is exact, and ``y`` is exactly F(x) + off plus a fraction in [0, 1).
``off`` (the zero point, plus 128 for int8) puts the output range [L, H] in
[0, 255], where truncation is the floor.  Outside that interval no clamp of
x is needed: every step (rounded products and sums by fixed operands, the
sign term, truncation, the clamp of y to [L, H]) is monotonic in x, so an x
below x_lo - 1 gives at most what x_lo - 1 gives, which is already clamped
to L (likewise above).  int8 outputs then flip their top bit (u - 128 ==
u ^ 0x80 read as int8).  Multipliers above 1 (a left shift, e < 0) step F by
more than 1, which changes nothing here; the float path is taken only when
the kernel's bound on its accumulators proves TFLite's int32 left shift
cannot wrap.  Where a bound fails (biases of 2^23 or more, multipliers below
about 2^-13, int16 outputs) the int64 path runs the same formula with integer
shifts.

**The last steps in int16.**  When the kernel's accumulator bound shows
|y| < 2^15 for every accumulator it can produce, y is cast to int16
(truncation), clamped there and narrowed to 8 bits: NumPy's int16 casts and
clamp are several times faster than its float clamp.  Otherwise y is clamped
in float and cast.

**float32.**  The same steps run in float32 with float32 constants (per
channel or for all) where ``requant_plan._float32_constants`` proves them
exact over every reachable x, by the monotonicity above and a check of both
ends of every run of equal outputs.  That holds for most per-tensor
multipliers (50 of MobileNet v2's 53 requantizers) and few small per-channel
ones.  A caller that can add :meth:`Requantizer.pre_add` inside its own sums
(a convolution's GEMM) skips the first step.

The constants and their proofs are in coralrt/_ops/arith/requant_plan.py.
tests/kernels/test_requant.py checks both paths against TFLite's two-step
fixed-point helpers (coralrt/_ops/arith/fixedpoint.py) on random and boundary
accumulators; the kernel tests compare whole operators with LiteRT.
"""

from __future__ import annotations

import numpy as np

try:                                   # the clip ufunc, without np.clip's Python checks
    from numpy._core.umath import clip as _clip
except ImportError:                    # numpy < 2
    from numpy.core.umath import clip as _clip

from coralrt._ops.arith import fixedpoint
from coralrt._ops.arith.parallel import for_bands
from coralrt._ops.arith.requant_plan import float32_steps, float_plan, no_wrap
from coralrt._ops.arith.scratch import TEMPORARIES

__all__ = ["Requantizer", "DoubleRequantizer", "may_wrap"]


def may_wrap(bias, acc_bound) -> bool:
    """True when an accumulator of at most ``acc_bound`` (per channel or one for
    all; None: unknown, taken as fitting) plus ``bias`` can leave int32."""
    if acc_bound is None:
        return False
    b = 0 if bias is None or not np.size(bias) else int(np.abs(np.asarray(bias, np.int64)).max())
    return int(np.max(acc_bound)) + b >= 2**31


class Requantizer:
    """Accumulators (without bias) -> output integers, exactly as TFLite's
    ``MultiplyByQuantizedMultiplier(acc + bias, m, shift) + zero_point`` clamped to
    the activation range; multipliers broadcast along the last axis.

    ``path`` says which arithmetic runs: ``"float"`` (the proven-exact float64
    form, or float32 where constants for it were proven), ``"int64"`` (the
    folded one-shift integer form) or ``"general"`` (multipliers above 1 that
    may wrap, step by step).  Work goes in row blocks that stay in
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
        if may_wrap(self.bias, acc_bound):
            # TFLite adds the bias to an int32 accumulator, which wraps around
            # past 2^31 (a bias near INT32_MIN plus a negative sum becomes a
            # large positive value); the step-by-step route wraps like it.
            self.path = "general"
            self.m, self.s = m, s
            return
        if not (s < -31).any() and (not left or no_wrap(m, s, self.bias, acc_bound)):
            plan = float_plan(m, -s, self.bias, self.lo, self.hi, self.zp, self.dtype,
                              acc_bound)
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
            # multiply_by_quantized_multiplier wraps v to int32 first, as the
            # int32 accumulator does.
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
            consts = {"L16": np.int16(self._plan["L"]), "H16": np.int16(self._plan["H"])}
            for k, v in self._plan.items():
                if isinstance(v, np.ndarray) and tiled:
                    v = np.tile(v, self._plan["tile"])
                if k == "f32" and v is not None and tiled:
                    v = {fk: np.tile(fv, self._plan["tile"]) if isinstance(fv, np.ndarray)
                         else fv for fk, fv in v.items()}
                if k in ("b", "dh"):
                    # Operands meeting the accumulators take their type, for
                    # loops of that type (exact: integers and halves below 2^23,
                    # powers of two).
                    v = v.astype(dtype) if isinstance(v, np.ndarray) else np.dtype(dtype).type(v)
                consts[k] = v
            self._typed[key] = consts
        return consts

    def _float_block(self, blk: np.ndarray, out: np.ndarray, c: dict,
                     pre_added: bool = False) -> None:
        if pre_added:
            t = blk
        else:
            t = TEMPORARIES.array("requant.t", blk.shape, blk.dtype)
            np.add(blk, c["b"], out=t)              # x (+ 1/2 in the signed form)
        f32 = c["f32"]
        if f32 is not None and t.dtype == np.float32:
            s = TEMPORARIES.array("requant.s", t.shape, np.float32) if c["signed"] else None
            y = float32_steps(t, f32["r"], f32["kc"], f32["dh"], c, s)
        else:
            y = TEMPORARIES.array("requant.y", t.shape, np.float64)
            if isinstance(c["r"], np.ndarray):     # a widening copy, then float64 by float64:
                np.copyto(y, t)                    # a quarter faster than one mixed multiply
                np.multiply(y, c["r"], out=y)
            else:
                np.multiply(t, c["r"], out=y, dtype=np.float64)
            np.add(y, c["kc"], out=y)
            if c["signed"]:
                np.copysign(c["dh"], t, out=t)
                np.add(y, t, out=y)
        o8 = out.view(np.uint8)
        if c["int16"]:          # casts and clamps of int16 run several times faster
            i = TEMPORARIES.array("requant.i16", y.shape, np.int16)
            np.copyto(i, y, casting="unsafe")       # truncation: floor for y >= 0
            _clip(i, c["L16"], c["H16"], out=i)
            np.copyto(o8, i, casting="unsafe")
        else:
            _clip(y, y.dtype.type(c["L"]), y.dtype.type(c["H"]), out=y)
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


class DoubleRequantizer:
    """Requantization as ``round((acc + bias) * (in_scale * w_scale / out_scale))`` in
    double, which TFLite's reference FULLY_CONNECTED uses instead of the fixed-point
    multiplier."""

    def __init__(self, effective_scales, zero_point: int, act_min: int, act_max: int,
                 dtype: np.dtype, bias: np.ndarray | None = None, acc_bound=None):
        eff = np.asarray(effective_scales, np.float64).reshape(-1)
        self.wrap = may_wrap(bias, acc_bound)
        self.eff = float(eff[0]) if eff.size == 1 or (eff == eff[0]).all() else eff
        self.dtype = np.dtype(dtype)
        self.zp = int(zero_point)
        self.lo, self.hi = int(act_min) - self.zp, int(act_max) - self.zp
        self.bias = None if bias is None else np.asarray(bias, np.float64)

    def __call__(self, acc: np.ndarray) -> np.ndarray:
        x = acc.astype(np.float64)
        if self.bias is not None:
            x += self.bias
        if self.wrap:   # the int32 accumulator wraps around (see Requantizer)
            x = fixedpoint.wrap_int32(x.astype(np.int64)).astype(np.float64)
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
