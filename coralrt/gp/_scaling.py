"""8-bit quantization of the operands and the output scale of every tile model.

Everything here runs on the host (numpy).  The Edge TPU only ever sees int8
tensors whose real value is ``scale * (q - zero_point)``; scales are float32
because TFLite stores them so, and the host uses the same float32 values.

Inputs (asymmetric, from the data's min and max, the range widened to hold 0 so
the zero point is an int8)::

    lo = min(min x, 0),  hi = max(max x, 0),  s = (hi - lo) / 255,
    z = round(-128 - lo / s),  q = clip(round(x / s) + z, -128, 127)

so ``|x - s (q - z)| <= s / 2``; ``s`` is then rounded up to the grid
``2^(k/8)`` (:func:`snap`), so that operands whose ranges differ by a few
percent reuse one tile model.  Constant operands of FULLY_CONNECTED and
CONV_2D (the B of A @ B, the conv kernel) are symmetric, as TFLite's int8
kernels require: ``s = max|x| / 127``, ``z = 0``.

Output ranges.  Every output range below is computed from the *dequantized*
operands, i.e. exactly the values the integer kernel multiplies and adds, so
the result of the integer arithmetic lies inside it and never saturates (up to
half a step of the kernel's fixed-point rounding, covered by a 1/256 margin).
Two rule sets (``Context(scaling=...)``):

``"study"`` -- the GPTPU study's rules, ``S = 1 / R`` with the symmetric output
range ``[-R, R]`` and ``w = hi - lo`` (the zero-including range, which bounds
``|x|``, so the rules hold for data not starting at 0 too)::

    conv2D, FullyConnected:  R = w_a w_b N     (N: the dot product's length)
    add, sub:                R = 2 max(w_a, w_b)
    mul:                     R = w_a w_b
    others (tanh, relu, mean, max):  R = w
                             (met by keeping the input's quantization, whose
                             range is w wide; tanh's output is fixed, below)

``"bound"`` (the default) -- tighter ranges that are still proofs:

* add ``[lo_a + lo_b, hi_a + hi_b]``, sub ``[lo_a - hi_b, hi_a - lo_b]``, mul the
  hull of the four endpoint products (interval arithmetic);
* GEMM ``|c_ij| <= R = min(max_i |a_i|_1 max|B|, max|A| max_j |b_j|_1,
  max_i |a_i|_2 max_j |b_j|_2)`` (Hoelder and Cauchy-Schwarz on the rows a_i
  of A and columns b_j of B), with the range ``[0, R]`` when every product
  ``a_ik b_kj`` is >= 0 (A and B of one sign) and ``[-R, 0]`` when every one is
  <= 0; otherwise ``[-R, R]``;
* conv2d ``|y| <= max|x| |w|_1``;
* relu, mean and max keep the input's quantization (exact for relu and max;
  mean's result lies in the input's range); tanh's output is TFLite's fixed
  ``s = 1/128, z = 0``.

``"sample"`` -- as ``"bound"``, except that a GEMM tile's ``R`` is lowered to
1.25 times the largest ``|c_ij|`` of 32 evenly spaced rows of A computed exactly
on the host (the study's "sampling suffices").  Not a proof: an unsampled row
may exceed it and saturate at the int8 limit; in exchange the output step
shrinks by about ``sqrt(K) / 4`` for zero-mean data.

Error model.  Each input element carries at most half an input step of error
and each tile result at most half an output step (plus the kernel's rounding of
the requantization multiplier, below 2^-31 relative).  A GEMM output is the sum
of ``ceil(K / k_tile)`` tile results accumulated in float64, so its error is at
most ``sum_t (step_t / 2) + sum_k (|a_ik| e_b + |b_kj| e_a + e_a e_b)`` and
typically (independent roundings) ``sqrt(n_tiles) step / sqrt(12)``.  The output
step ``R / 127.5`` dominates: smaller K tiles and tighter ranges lower it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Quant", "quantize", "quantize_symmetric", "range_quant", "snap", "RULES",
           "elementwise_range", "gemm_range", "conv_range"]

RULES = ("bound", "study", "sample")
_MARGIN = 1.0 + 1.0 / 256
_GRID = 8                       # steps per octave of snap()
_SAMPLE_ROWS, _SAMPLE_MARGIN = 32, 1.25


@dataclass(frozen=True)
class Quant:
    """Per-tensor int8 quantization: real = scale * (q - zero_point)."""

    scale: float
    zero_point: int

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        return self.scale * (q.astype(np.float64) - self.zero_point)

    @property
    def lo(self) -> float:
        return self.scale * (-128 - self.zero_point)

    @property
    def hi(self) -> float:
        return self.scale * (127 - self.zero_point)


def _f32(x: float) -> float:
    return float(np.float32(x))


def snap(step: float) -> float:
    """``step`` rounded up to the grid 2^(k/8) (float32).

    A tile model's quantization is part of the model, so data whose range
    moves a little from call to call (an iteration's vector) would make a new
    model, and on ``coral`` a new compile, every time; on the grid, ranges
    within 9 % of each other share one.  The price: steps up to 9 % coarser."""
    if not step > 0 or not np.isfinite(step):
        return step
    return _f32(2.0 ** (np.ceil(np.log2(step) * _GRID) / _GRID))


def range_quant(lo: float, hi: float) -> Quant:
    """The asymmetric int8 quantization of ``[lo, hi]`` widened to hold 0, its step
    on the :func:`snap` grid (a range with 0 at one end keeps 0 at that end)."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if hi - lo <= 0 or not np.isfinite(hi - lo):
        hi = lo + 1.0 if np.isfinite(lo) else 1.0
    scale = snap(_f32((hi - lo) / 255.0))
    if scale <= 0:       # a range below float32's resolution
        scale = float(np.finfo(np.float32).tiny)
    if lo == 0.0:
        zp = -128
    elif hi == 0.0:
        zp = 127
    else:
        zp = int(np.clip(np.round(-128 - lo / scale), -128, 127))
    return Quant(scale, zp)


def quantize(x: np.ndarray, quant: Quant | None = None) -> tuple[np.ndarray, Quant]:
    """int8 values of ``x`` and their quantization (from x's range unless given)."""
    if quant is None:
        quant = range_quant(np.min(x), np.max(x))
    q = np.clip(np.round(x / quant.scale) + quant.zero_point, -128, 127)
    return q.astype(np.int8), quant


def quantize_symmetric(x: np.ndarray) -> tuple[np.ndarray, Quant]:
    """Symmetric int8 (zero point 0, values in [-127, 127]) for weights."""
    m = float(np.max(np.abs(x))) if x.size else 0.0
    scale = _f32(m / 127.0) if m > 0 else 1.0
    if scale <= 0:
        scale = float(np.finfo(np.float32).tiny)
    q = np.clip(np.round(x / scale), -127, 127)
    return q.astype(np.int8), Quant(scale, 0)


def _symmetric_out(r: float) -> Quant:
    """Output quantization for ``[-r, r]``: zero point 0, 127 steps each way, the
    step on the :func:`snap` grid."""
    r = float(r) * _MARGIN
    scale = snap(_f32(r / 127.0)) if r > 0 else 1.0
    return Quant(max(scale, float(np.finfo(np.float32).tiny)), 0)


def _width(lo: float, hi: float) -> float:
    return max(hi, 0.0) - min(lo, 0.0)


def elementwise_range(op: str, rule: str, a: tuple[float, float],
                      b: tuple[float, float] | None = None) -> Quant:
    """Output quantization of ``add``/``sub``/``mul`` given the operands' real
    (dequantized) ranges ``(lo, hi)``."""
    (alo, ahi), (blo, bhi) = a, b
    if rule == "study":
        wa, wb = _width(alo, ahi), _width(blo, bhi)
        r = 2 * max(wa, wb) if op in ("add", "sub") else wa * wb
        return _symmetric_out(r)
    if op == "add":
        lo, hi = alo + blo, ahi + bhi
    elif op == "sub":
        lo, hi = alo - bhi, ahi - blo
    else:
        p = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
        lo, hi = min(p), max(p)
    pad = (hi - lo) * (_MARGIN - 1)
    return range_quant(lo - pad, hi + pad)


def gemm_range(rule: str, a: np.ndarray, b: np.ndarray) -> Quant:
    """Output quantization of the tile product ``a @ b`` (dequantized operands,
    a: rows x k, b: k x cols); see the module docstring."""
    amax, bmax = float(np.max(np.abs(a))), float(np.max(np.abs(b)))
    if rule == "study":
        wa = _width(float(a.min()), float(a.max()))
        wb = _width(float(b.min()), float(b.max()))
        return _symmetric_out(wa * wb * a.shape[1])
    r = min(float(np.abs(a).sum(axis=1).max()) * bmax,
            amax * float(np.abs(b).sum(axis=0).max()),
            float(np.sqrt((a * a).sum(axis=1).max() * (b * b).sum(axis=0).max())))
    if rule == "sample":
        rows = a[np.linspace(0, a.shape[0] - 1, min(a.shape[0], _SAMPLE_ROWS)).astype(int)]
        r = min(r, _SAMPLE_MARGIN * float(np.max(np.abs(rows @ b))))
    q = _symmetric_out(r)
    a_pos, a_neg = a.min() >= 0, a.max() <= 0
    b_pos, b_neg = b.min() >= 0, b.max() <= 0
    if (a_pos and b_pos) or (a_neg and b_neg):
        return range_quant(0.0, r * _MARGIN)
    if (a_pos and b_neg) or (a_neg and b_pos):
        return range_quant(-r * _MARGIN, 0.0)
    return q


def conv_range(rule: str, x: np.ndarray, w: np.ndarray) -> Quant:
    """Output quantization of a single-channel 2-D convolution of ``x`` by ``w``."""
    if rule == "study":
        wx = _width(float(x.min()), float(x.max()))
        ww = _width(float(w.min()), float(w.max()))
        return _symmetric_out(wx * ww * w.size)
    return _symmetric_out(float(np.max(np.abs(x))) * float(np.abs(w).sum()))
