"""UNIDIRECTIONAL_SEQUENCE_LSTM, fully integer (TFLite's "8x8_16" LSTM).

int8 input, output and weights, int32 gate biases, an int8 output state
and an int16 cell state whose scale is a power of two.  Each gate is
``act(MBQM(W_x x) + MBQM(W_h h))`` saturated to int16 in Q3.12; sigmoid and
tanh are gemmlowp's int16 fixed-point functions, evaluated here once for all
65536 inputs into lookup tables.  The input zero point, the output-state zero
point and the gate bias are folded into one int32 bias per matrix row at load
time, as TFLite's Prepare does.

The two state tensors are variable: the runner hands in arrays that persist
across runs, and ``run`` overwrites them in place with the final states.

One LiteRT detail matters for bit exactness: the hidden values
``o * tanh(c)`` are requantized with ``+ hidden_zp`` when there is no
projection but with ``- hidden_zp`` when there is one (the projection's
folded bias adds ``hidden_zp * rowsum(W)`` back).

Supported: with or without CIFG (coupled input/forget gate), with or
without projection (and projection/cell clipping), batch-major or
time-major input.  Peephole connections and layer normalisation (which
change the intermediates' meaning) are rejected.
"""

from __future__ import annotations

import math

import numpy as np

try:                                   # the clip ufunc, without np.clip's Python checks
    from numpy._core.umath import clip as _clip
except ImportError:                    # numpy < 2
    from numpy.core.umath import clip as _clip

from coralrt.errors import ModelError
from coralrt.sim.fixedpoint import multiply_by_quantized_multiplier, quantize_multiplier
from coralrt.sim.kernels import OpContext, register

__all__ = ["sigmoid_q3_12", "tanh_int16"]

# Input positions of the 24-input LSTM.
_X = 0
_W_X = (1, 2, 3, 4)           # input-to-{input, forget, cell, output} weights
_W_H = (5, 6, 7, 8)           # recurrent-to-{input, forget, cell, output} weights
_PEEPHOLE = (9, 10, 11)
_BIAS = (12, 13, 14, 15)
_PROJ_W, _PROJ_B = 16, 17
_H_STATE, _C_STATE = 18, 19
_LAYER_NORM = (20, 21, 22, 23)

_I16_MIN, _I16_MAX = -32768, 32767


# -- gemmlowp int16 fixed point ------------------------------------------------------------
#
# All values are int64 arrays holding int16 values; ``_w16`` reproduces the
# truncation C++ applies when a wider intermediate is stored back as int16.

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


# -- the operator --------------------------------------------------------------------------


def _checked_log2(x: float) -> int | None:
    v = np.float32(math.log(x)) * (np.float32(1.0) / np.float32(math.log(2.0)))
    r = np.float32(math.copysign(math.floor(abs(float(v)) + 0.5), float(v)))
    return int(r) if abs(float(v - r)) < 1e-3 else None


def _multiplier(real) -> tuple[int, int]:
    return quantize_multiplier(float(np.float32(real)))


def _rdbypot32(x, exponent: int):
    return _rdbypot(x, exponent) if exponent > 0 else x


@register("UNIDIRECTIONAL_SEQUENCE_LSTM")
def unidirectional_sequence_lstm(ctx: OpContext):
    where = "UNIDIRECTIONAL_SEQUENCE_LSTM"
    ins = list(ctx.inputs) + [None] * (24 - len(ctx.inputs))
    x_t, out_t = ins[_X], ctx.outputs[0]
    h_t, c_t = ins[_H_STATE], ins[_C_STATE]
    if ctx.dtype(x_t) != np.int8 or ctx.dtype(ins[_W_X[3]]) != np.int8:
        raise ModelError("only the fully integer LSTM (int8 input and weights) is supported",
                         where=where)
    if any(ins[k] is not None for k in _PEEPHOLE + _LAYER_NORM):
        raise ModelError("peephole connections and layer normalisation are not supported",
                         where=where)
    if len(ctx.intermediates) != 5:
        raise ModelError(f"the integer LSTM needs 5 intermediate tensors, got "
                         f"{len(ctx.intermediates)}", where=where)
    if ctx.dtype(h_t) != np.int8 or ctx.dtype(c_t) != np.int16:
        raise ModelError("the output state must be int8 and the cell state int16", where=where)
    if len(ins[_W_H[3]].shape) != 2:
        raise ModelError("diagonal recurrent weights are not supported", where=where)
    if len(x_t.shape) != 3:
        raise ModelError(f"input of rank {len(x_t.shape)}; expected 3", where=where)
    time_major = bool(ctx.params.get("time_major", False))

    use_cifg = ins[_W_X[0]] is None
    gates = (1, 2, 3) if use_cifg else (0, 1, 2, 3)
    w_x = {g: ctx.const(_W_X[g]).astype(np.int64) for g in gates}
    w_h = {g: ctx.const(_W_H[g]).astype(np.int64) for g in gates}
    bias = {g: ctx.const(_BIAS[g]).astype(np.int64) for g in gates}
    n_cell, n_input = w_x[3].shape
    n_output = w_h[3].shape[1]

    x_scale, x_zp = ctx.scale(x_t), ctx.zero_point(x_t)
    h_scale, h_zp = ctx.scale(h_t), ctx.zero_point(h_t)
    cell_scale = _checked_log2(ctx.scale(c_t))
    if cell_scale is None:
        raise ModelError(f"cell state scale {ctx.scale(c_t)} is not a power of two",
                         where=where)
    hidden = ctx.intermediates[4]
    hidden_scale, hidden_zp = ctx.scale(hidden), ctx.zero_point(hidden)
    gate_scale = np.float32(2.0 ** -12)     # Q3.12 gate pre-activations (no layer norm)

    # Effective scales in float32, in the order TFLite multiplies them.
    def eff(weight_t, act_scale):
        return _multiplier(np.float32(ctx.scale(weight_t)) * np.float32(act_scale) / gate_scale)

    mx = {g: eff(ins[_W_X[g]], x_scale) for g in gates}
    mh = {g: eff(ins[_W_H[g]], h_scale) for g in gates}
    # Zero points and biases folded per row: bias - zp * rowsum(W).
    bx = {g: bias[g] - x_zp * w_x[g].sum(axis=1) for g in gates}
    bh = {g: -h_zp * w_h[g].sum(axis=1) for g in gates}

    # Stack the gates so one matrix product serves all of them.
    wx_all = np.concatenate([w_x[g] for g in gates]).T.astype(np.float64)
    wh_all = np.concatenate([w_h[g] for g in gates]).T.astype(np.float64)
    bx_all = np.concatenate([bx[g] for g in gates])
    bh_all = np.concatenate([bh[g] for g in gates])
    mx_m = np.repeat([mx[g][0] for g in gates], n_cell)
    mx_s = np.repeat([mx[g][1] for g in gates], n_cell)
    mh_m = np.repeat([mh[g][0] for g in gates], n_cell)
    mh_s = np.repeat([mh[g][1] for g in gates], n_cell)

    eff_hidden = np.float32(np.float64(2.0 ** -15) / np.float64(hidden_scale) * 2.0 ** -15)
    hid_m, hid_s = quantize_multiplier(float(eff_hidden))

    use_projection = ins[_PROJ_W] is not None
    if use_projection:
        w_p = ctx.const(_PROJ_W).astype(np.int64)
        b_p = ctx.const(_PROJ_B)
        b_p = np.zeros(n_output, np.int64) if b_p is None else b_p.astype(np.int64)
        # With projection the hidden values are stored as q - zp (LiteRT negates
        # the zero point for this case), so the fold adds zp * rowsum(W) back.
        b_p = b_p + hidden_zp * w_p.sum(axis=1)
        wp_f = w_p.T.astype(np.float64)
        proj_m, proj_s = _multiplier(np.float32(ctx.scale(ins[_PROJ_W]))
                                     * np.float32(hidden_scale) / np.float32(h_scale))
    elif n_output != n_cell:
        raise ModelError(f"without projection the output size {n_output} must equal the "
                         f"cell count {n_cell}", where=where)

    hid_zp = -hidden_zp if use_projection else hidden_zp

    cell_clip = np.float32(ctx.params.get("cell_clip", 0.0) or 0.0)
    proj_clip = np.float32(ctx.params.get("proj_clip", 0.0) or 0.0)
    q_cell_clip = (int(np.clip(cell_clip / np.float32(ctx.scale(c_t)), -32768.0, 32767.0))
                   if cell_clip > 0 else 0)
    q_proj_clip = (int(np.clip(proj_clip / np.float32(ctx.scale(out_t)), -128.0, 127.0))
                   if proj_clip > 0 else 0)

    sigmoid = sigmoid_q3_12()
    tanh_gate = tanh_int16(3)
    if not 0 <= 15 + cell_scale <= 6:
        raise ModelError(f"cell state scale 2^{cell_scale} is outside what the integer LSTM "
                         f"supports (2^-15 .. 2^-9)", where=where)
    tanh_cell = tanh_int16(15 + cell_scale)
    cell_shift = 30 + cell_scale
    out_dtype = ctx.dtype(out_t)
    n_gates = len(gates)

    def run(inputs):
        x = np.asarray(inputs[_X])
        h_state, c_state = inputs[_H_STATE], inputs[_C_STATE]
        xs = x if time_major else x.transpose(1, 0, 2)          # (T, B, n_input)
        steps, batch = xs.shape[0], xs.shape[1]
        # The input contribution does not depend on the state: all steps at once.
        # Sums of int8 products are exact in float64 (K * 2^14 << 2^53).
        acc = (xs.reshape(-1, n_input).astype(np.float64) @ wx_all).astype(np.int64) + bx_all
        gx = _clip(multiply_by_quantized_multiplier(acc, mx_m, mx_s), _I16_MIN, _I16_MAX)
        gx = gx.reshape(steps, batch, n_gates * n_cell)

        h = h_state.reshape(batch, n_output).astype(np.int64)
        c = c_state.reshape(batch, n_cell).astype(np.int64)
        out = np.empty((steps, batch, n_output), np.int64)
        for t in range(steps):
            acc = (h.astype(np.float64) @ wh_all).astype(np.int64) + bh_all
            g = _clip(gx[t] + multiply_by_quantized_multiplier(acc, mh_m, mh_s),
                        _I16_MIN, _I16_MAX).reshape(batch, n_gates, n_cell)
            k = 0
            if not use_cifg:
                i_gate = sigmoid[g[:, 0] + 32768].astype(np.int64)
                k = 1
            f_gate = sigmoid[g[:, k] + 32768].astype(np.int64)
            c_gate = tanh_gate[g[:, k + 1] + 32768].astype(np.int64)
            o_gate = sigmoid[g[:, k + 2] + 32768].astype(np.int64)
            if use_cifg:
                i_gate = _I16_MAX - f_gate
            c = _w16(_rdbypot(f_gate * c, 15))
            c = _clip(c + _w16(_rdbypot32(i_gate * c_gate, cell_shift)), _I16_MIN, _I16_MAX)
            if q_cell_clip > 0:
                c = _clip(c, -q_cell_clip, q_cell_clip)
            hid = o_gate * tanh_cell[c + 32768]
            hid = _clip(multiply_by_quantized_multiplier(hid, hid_m, hid_s) + hid_zp,
                          -128, 127)
            if use_projection:
                acc = (hid.astype(np.float64) @ wp_f).astype(np.int64) + b_p
                h = _clip(multiply_by_quantized_multiplier(acc, proj_m, proj_s) + h_zp,
                            -128, 127)
                if q_proj_clip > 0:
                    h = _clip(h, -q_proj_clip, q_proj_clip)
            else:
                h = hid
            out[t] = h
        h_state[...] = h.reshape(h_state.shape)
        c_state[...] = c.reshape(c_state.shape)
        result = out if time_major else out.transpose(1, 0, 2)
        return [np.ascontiguousarray(result, dtype=out_dtype).reshape(out_t.shape)]

    return run
