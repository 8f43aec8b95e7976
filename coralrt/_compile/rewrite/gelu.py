"""The ``gelu`` rewrite: GELU becomes I-GELU, built from operators the Edge TPU maps.

When it applies
---------------
In 8-bit quantized graphs (int8 or uint8 activations, per-tensor quantization,
input and output of one type):

* every builtin ``GELU`` operator (``approximate`` or not);
* the tanh-form GELU converters emit,
  ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``, written with
  MUL/ADD/SUB/POW operators and scalar (or one-element) constants: the cube as
  ``POW(x, 3)`` or products of x, constants on either side, the 0.5 applied to
  x, to the bracket or to the product.  The pattern is recognised by value:
  each operator chain is evaluated as a polynomial in x (in front of the TANH)
  and in x and the TANH's output (behind it) and compared with the formula, so
  any arrangement of the same arithmetic matches.  It is replaced only when
  every intermediate tensor is read by the pattern alone and is no model
  output.

Float GELUs are left alone (the CPU runs them; nothing would map anyway).

The approximation
-----------------
The Transformers-on-Edge-TPU study's I-GELU (erf replaced by a clipped
second-order polynomial, the sign by a saturated tanh):

    I-GELU(x) = 0.5 x (1 + L(x / sqrt 2))
    L(u)      = tanh(1000 u) * (a * (min(u * tanh(1000 u), -b) + b)^2 + 1)
    a = -0.2888, b = -1.769

With ``c = -b sqrt 2`` (2.5017) and ``m = min(|x|, c)`` this is
``x * (0.5 + sgn(x) * (0.5 + a/4 * (m - c)^2))``, which the rewrite emits as
ten operators (x the GELU's input, y its output tensor, kept as it is)::

    t  = MUL(x, k)            k >= 1000/sqrt 2; saturates for every x code != 0
    s  = TANH(t)              s = sigma * sgn(x), sigma = 127/128
    ax = MUL(x, s)            sigma |x|, its range ends at sigma c: the MUL's
                              own saturation is the formula's min(., c)
    v  = ADD(ax, -sigma c)    sigma (m - c), in [-sigma c, 0]
    sq = MUL(v, v)
    q  = MUL(sq, a / (4 sigma^3))
    p  = ADD(q, 0.5 / sigma)  (0.5 + a/4 (m - c)^2) / sigma
    L  = MUL(s, p)            sgn(x) (0.5 + a/4 (m - c)^2), in [-0.5, 0.5]
    h  = ADD(L, 0.5)          in [0, 1]
    y  = MUL(x, h)

The MINIMUM of the formula costs no operator: ``ax``'s quantized range ends at
``sigma c``, so the MUL producing it clamps every larger value there, which is
what a MINIMUM with that constant (sharing the range, as TFLite's MINIMUM
requires) would do.  When the input never reaches ``c`` the range simply ends
at ``sigma max|x|`` and nothing is clamped.

Quantization choices
--------------------
From the input's range ``[x_min, x_max]`` (its scale and zero point over the
type's codes) and ``X = max(-x_min, x_max)``:

* ``t``: symmetric, scale 2.84/127 (zero point 0, or 128 for uint8), so its
  extreme codes are +2.84 and -2.862; TFLite's 8-bit TANH (output scale 1/128,
  zero point 0 for int8 and 128 for uint8) maps both to the codes +-127, i.e.
  +-127/128 exactly.  A wider ``t`` range would give the asymmetric pair
  +127/-128 (the int8 output cannot hold +1), a narrower one would leave
  tanh short of +-127/128.  The factor ``k`` is 1000/sqrt 2, raised to
  ``2 * 2.862 / x_scale`` if the input scale is so small that the lowest
  non-zero code would not saturate ``t``: every non-zero input then gets the
  exact sign +-sigma and x = 0 gets s = 0 (then ``L = 0``, ``h = 0.5`` and
  ``y = 0``).  sigma = 127/128 is divided out of the constants of ``q`` and
  ``p`` so ``L`` carries the plain sign.
* ``ax``: ``[0, sigma min(X, c)]``; ``v``: ``[-sigma c, 0]`` (when X >= c the
  constant is the top of ``ax``'s range as quantized, so clipped inputs give
  v = 0 exactly); ``sq``: ``[0, (sigma c)^2]``; ``q``: ``[a c^2 / (4 sigma), 0]``;
  ``p``: ``[0, 0.5/sigma]``; ``L``: symmetric 0.5/127 (0 and +-0.5 exact);
  ``h``: ``[0, 1]`` (0 and 1 exact, so large inputs give y = x and very
  negative ones y = 0).  Every range holds 0 and ends on a code.
* Scalar constants are stored at the extreme code (127 or 255, or 0 with zero
  point 255 for negative uint8 values) so they are represented exactly.
* Operator versions are those LiteRT's converter writes: 2 for int8, 1 for
  uint8.

Numerical cost (measured)
-------------------------
* Float: ``max |I-GELU(x) - GELU(x)| = 0.0182`` over [-10, 10] (at
  ``|x| = 2.35``; :data:`FLOAT_MAX_ERROR`, :func:`float_max_error`).
* Quantized, every input code, against exact GELU of the dequantized input,
  input scale 16/255 (int8 zero point 0, uint8 128: x in [-8, 8)), output
  quantized over [-0.17, 8] (scale 8.17/255), int8 and uint8 alike:

  ========================================  ===============  ========
  graph                                     output units     float
  ========================================  ===============  ========
  rewritten (I-GELU, ten operators)         0.842            0.0270
  LiteRT's 8-bit GELU (table, the original) 0.499            0.0160
  the tanh form as quantized operators      1.53             0.0490
  ========================================  ===============  ========

  The rewritten graph stays within 0.614 units of the float I-GELU: most of
  its error is the approximation's own (0.0182 at most), the rest the
  rounding of the intermediate tensors and of the output.  Over input ranges
  from [-1, 1] to [-40, 40] the error stays below the approximation's error
  on the range plus one output unit (measured up to 0.93 units over it, on
  [-1, 1]).
"""

from __future__ import annotations

import math

import numpy as np

from coralrt._compile.rewrite.base import RewriteRecord
from coralrt._compile.rewrite.gelu_match import match_tanh_form

__all__ = ["GeluRewrite", "GELU_REWRITE", "gelu_exact", "igelu_float", "float_max_error",
           "FLOAT_MAX_ERROR", "A", "B"]

A = -0.2888                     # the polynomial's curvature
B = -1.769                      # where it is clipped (in u = x / sqrt 2)
SIGN_SLOPE = 1000.0             # tanh(1000 u) as the sign of u
CLIP = -B * math.sqrt(2.0)      # c: the clip in x
#: max |igelu_float - gelu_exact| over [-10, 10], measured by :func:`float_max_error`
FLOAT_MAX_ERROR = 0.0182

# t's positive extreme: tanh of it and of -(128/127) of it round to the codes +-127.
_SIGN_TOP = 2.84
_TANH_SCALE = 1.0 / 128.0
_TYPES = {np.dtype(np.int8): (-128, 127), np.dtype(np.uint8): (0, 255)}


# -- float reference --------------------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def gelu_exact(x) -> np.ndarray:
    """GELU with the error function, ``0.5 x (1 + erf(x / sqrt 2))``, in float64."""
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def igelu_float(x) -> np.ndarray:
    """I-GELU as the formula reads, in float64."""
    x = np.asarray(x, np.float64)
    u = x / math.sqrt(2.0)
    sgn = np.tanh(SIGN_SLOPE * u)
    return 0.5 * x * (1.0 + sgn * (A * (np.minimum(u * sgn, -B) + B) ** 2 + 1.0))


def float_max_error(lo: float = -10.0, hi: float = 10.0, n: int = 400_001
                    ) -> tuple[float, float]:
    """(max |igelu_float - gelu_exact|, where) on ``n`` evenly spaced points."""
    x = np.linspace(lo, hi, n)
    err = np.abs(igelu_float(x) - gelu_exact(x))
    k = int(np.argmax(err))
    return float(err[k]), float(x[k])


# -- quantization helpers ---------------------------------------------------------------

def _affine(lo: float, hi: float, dtype) -> tuple[float, int]:
    """(scale, zero point) spreading [lo, hi] (widened to hold 0) over the codes."""
    qmin, qmax = _TYPES[np.dtype(dtype)]
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = float(np.float32((hi - lo) / (qmax - qmin)))
    zp = int(np.clip(round(qmin - lo / scale), qmin, qmax))
    return scale, zp


def _symmetric(top: float, dtype) -> tuple[float, int]:
    """[-top, top] on the codes -127..127 (zero point 0, or 128 for uint8)."""
    return float(np.float32(top / 127.0)), 0 if np.dtype(dtype) == np.int8 else 128


def _top(scale: float, zp: int, dtype) -> float:
    """The value the highest code stands for."""
    return float(np.float32(scale) * np.float32(_TYPES[np.dtype(dtype)][1] - zp))


def _sigma(dtype) -> float:
    """The TANH output for the extreme codes of ``t``; checks both are +-127/128."""
    st, zt = _symmetric(_SIGN_TOP, dtype)
    qmin, qmax = _TYPES[np.dtype(dtype)]
    hi = round(math.tanh(st * (qmax - zt)) / _TANH_SCALE)
    lo = round(math.tanh(st * (qmin - zt)) / _TANH_SCALE)
    assert hi == -lo == 127, (hi, lo)
    return hi * _TANH_SCALE


def _eight_bit(editor, t: int):
    """The tensor's dtype if it is 8-bit with per-tensor quantization, else None."""
    if t < 0:
        return None
    dtype = editor.tensor(t).dtype
    q = editor.quant(t)
    if dtype not in _TYPES or q is None or not q[0] > 0:
        return None
    return dtype


# -- the rewrite ------------------------------------------------------------------------

class GeluRewrite:
    """Replaces 8-bit GELUs (builtin or tanh form) by I-GELU; see the module doc."""

    name = "gelu"
    version = 1
    exact = False
    order = 100
    description = ("GELU (builtin or tanh form) as I-GELU from MUL/ADD/TANH, in 8-bit "
                   f"models (approximation, max float error {FLOAT_MAX_ERROR})")

    def apply(self, editor) -> list[RewriteRecord]:
        records: list[RewriteRecord] = []
        used: set[int] = set()
        for i, op in list(editor.each("GELU")):
            x, y = op.inputs[0], op.outputs[0]
            if len(op.outputs) != 1 or not _fits(editor, x, y):
                continue
            records.append(self._replace(editor, [i], x, y, "builtin GELU"))
            used.add(i)
        for i, _ in list(editor.each("TANH")):
            found = match_tanh_form(editor, i)
            if found is None:
                continue
            ops, x, y = found
            if used & set(ops) or not _fits(editor, x, y):
                continue
            records.append(self._replace(editor, ops, x, y, "tanh-form GELU"))
            used.update(ops)
        return records

    def _replace(self, editor, indices, x: int, y: int, what: str) -> RewriteRecord:
        new = _igelu_ops(editor, x, y)
        editor.replace(indices, new)
        sx, zx = editor.quant(x)
        return RewriteRecord(
            rewrite=self.name, before=tuple(editor.label(i) for i in sorted(indices)),
            after=tuple(op.name for op in new),
            detail=(f"{what} on {editor.tensor(x).name!r} ({editor.tensor(x).type_name}, "
                    f"scale {sx:.4g}, zero point {zx}) as I-GELU"),
            exact=False)


GELU_REWRITE = GeluRewrite()


def _fits(editor, x: int, y: int) -> bool:
    dtype = _eight_bit(editor, x)
    return (dtype is not None and _eight_bit(editor, y) == dtype
            and tuple(editor.tensor(x).shape) == tuple(editor.tensor(y).shape))


def _igelu_ops(editor, x: int, y: int) -> list:
    """The ten operators computing I-GELU of ``x`` into ``y`` (module doc)."""
    xt = editor.tensor(x)
    dtype, shape = xt.dtype, xt.shape
    qmin, qmax = _TYPES[dtype]
    sx, zx = editor.quant(x)
    big = max(sx * (zx - qmin), sx * (qmax - zx))          # X = max |x|
    version = 2 if dtype == np.int8 else 1
    base = editor.tensor(y).name + "/igelu"
    sigma = _sigma(dtype)
    ops = []

    def tensor(name, quant):
        return editor.add_tensor(f"{base}/{name}", shape, dtype, scale=quant[0],
                                 zero_point=quant[1])

    def scalar(name, value):
        """A constant holding ``value`` exactly, at the type's extreme code."""
        if dtype == np.int8:
            code, zp, scale = (127 if value > 0 else -127), 0, abs(value) / 127.0
        elif value > 0:
            code, zp, scale = 255, 0, value / 255.0
        else:
            code, zp, scale = 0, 255, -value / 255.0
        return editor.add_tensor(f"{base}/{name}", (1,), dtype, scale=scale, zero_point=zp,
                                 data=np.array([code], dtype))

    def emit(name, inputs, out):
        ops.append(editor.make_op(name, inputs, [out], version=version))
        return out

    def binary(name, a, b, label, quant):
        return emit(name, [a, b], tensor(label, quant))

    # sign: t saturates for every non-zero code; tanh of its extremes is +-sigma
    t_quant = _symmetric(_SIGN_TOP, dtype)
    t_low = t_quant[0] * (t_quant[1] - qmin)              # |t|'s negative extreme, 2.862
    gain = max(SIGN_SLOPE / math.sqrt(2.0), 2.0 * t_low / sx)
    t = binary("MUL", x, scalar("sign_gain", gain), "sign_in", t_quant)
    s = emit("TANH", [t], tensor("sign", (_TANH_SCALE, 0 if dtype == np.int8 else 128)))
    # sigma |x|, clipped at sigma c by its own range; v = sigma (min(|x|, c) - c)
    ax_quant = _affine(0.0, sigma * min(big, CLIP), dtype)
    clip = _top(*ax_quant, dtype) if big >= CLIP else sigma * CLIP
    ax = binary("MUL", x, s, "abs", ax_quant)
    v = binary("ADD", ax, scalar("clip", -clip), "clipped", _affine(-clip, 0.0, dtype))
    sq = binary("MUL", v, v, "square", _affine(0.0, clip * clip, dtype))
    curve = A / 4.0 / sigma ** 3
    poly = binary("MUL", sq, scalar("curve", curve), "poly",
                  _affine(curve * clip * clip, 0.0, dtype))
    half_erf = binary("ADD", poly, scalar("half_poly", 0.5 / sigma), "erf_half",
                      _affine(0.0, 0.5 / sigma, dtype))
    signed = binary("MUL", s, half_erf, "signed", _symmetric(0.5, dtype))
    gate = binary("ADD", signed, scalar("half", 0.5), "gate", _affine(0.0, 1.0, dtype))
    emit("MUL", [x, gate], y)
    return ops


# -- the tanh-form pattern --------------------------------------------------------------
# Polynomials are dicts {(power of x, power of the TANH output): coefficient}.
