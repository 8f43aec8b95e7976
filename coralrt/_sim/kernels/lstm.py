"""UNIDIRECTIONAL_SEQUENCE_LSTM, fully integer (TFLite's "8x8_16" LSTM).

int8 input, output and weights, int32 gate biases, an int8 output state
and an int16 cell state whose scale is a power of two.  Each gate is
``act(MBQM(W_x x) + MBQM(W_h h))`` saturated to int16 in Q3.12; sigmoid and
tanh are gemmlowp's int16 fixed-point functions, evaluated once for all
65536 inputs into lookup tables (:mod:`coralrt._ops.arith.int16_fixedpoint`).
The input zero point, the output-state zero point and the gate bias are
folded into one int32 bias per matrix row at load time, as TFLite's Prepare
does.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from coralrt.errors import ModelError
from coralrt._ops.arith.fixedpoint import multiply_by_quantized_multiplier, quantize_multiplier
from coralrt._ops.arith.int16_fixedpoint import (
    _I16_MAX, _I16_MIN, _clip, _rdbypot, _w16, sigmoid_q3_12, tanh_int16)
from coralrt._sim.kernels import OpContext

if TYPE_CHECKING:
    from coralrt._formats.segment import SegmentTensor

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


# -- the operator --------------------------------------------------------------------------


def _checked_log2(x: float) -> int | None:
    v = np.float32(math.log(x)) * (np.float32(1.0) / np.float32(math.log(2.0)))
    r = np.float32(math.copysign(math.floor(abs(float(v)) + 0.5), float(v)))
    return int(r) if abs(float(v - r)) < 1e-3 else None


def _multiplier(real) -> tuple[int, int]:
    return quantize_multiplier(float(np.float32(real)))


def _rdbypot32(x, exponent: int):
    return _rdbypot(x, exponent) if exponent > 0 else x


_WHERE = "UNIDIRECTIONAL_SEQUENCE_LSTM"


def _check_variant(ctx: OpContext, ins: list) -> None:
    """Reject the LSTM variants this kernel does not implement (see the module docstring)."""
    x_t, h_t, c_t = ins[_X], ins[_H_STATE], ins[_C_STATE]
    if ctx.dtype(x_t) != np.int8 or ctx.dtype(ins[_W_X[3]]) != np.int8:
        raise ModelError("only the fully integer LSTM (int8 input and weights) is supported",
                         where=_WHERE)
    if any(ins[k] is not None for k in _PEEPHOLE + _LAYER_NORM):
        raise ModelError("peephole connections and layer normalisation are not supported",
                         where=_WHERE)
    if len(ctx.intermediates) != 5:
        raise ModelError(f"the integer LSTM needs 5 intermediate tensors, got "
                         f"{len(ctx.intermediates)}", where=_WHERE)
    if ctx.dtype(h_t) != np.int8 or ctx.dtype(c_t) != np.int16:
        raise ModelError("the output state must be int8 and the cell state int16", where=_WHERE)
    if len(ins[_W_H[3]].shape) != 2:
        raise ModelError("diagonal recurrent weights are not supported", where=_WHERE)
    if len(x_t.shape) != 3:
        raise ModelError(f"input of rank {len(x_t.shape)}; expected 3", where=_WHERE)


def _cell_scale_log2(ctx: OpContext, c_t) -> int:
    """The cell state's scale as a power-of-two exponent."""
    cell_scale = _checked_log2(ctx.scale(c_t))
    if cell_scale is None:
        raise ModelError(f"cell state scale {ctx.scale(c_t)} is not a power of two",
                         where=_WHERE)
    return cell_scale


# -- load time: the gates, the projection, the clips, the tables ---------------------------

@dataclass
class _GateStack:
    """The gates' rows stacked, so one matrix product serves all of them."""
    count: int                # 3 with CIFG, else 4
    wx: np.ndarray            # input weights, transposed, as float64
    wh: np.ndarray            # recurrent weights, transposed, as float64
    bx: np.ndarray            # per-row biases with the zero points folded in
    bh: np.ndarray
    mx_m: np.ndarray          # per-row multipliers and shifts to Q3.12
    mx_s: np.ndarray
    mh_m: np.ndarray
    mh_s: np.ndarray


def _gate_weights(ctx: OpContext, gates) -> tuple[dict, dict, dict]:
    """Each gate's input weights, recurrent weights and bias, as int64."""
    w_x = {g: ctx.const(_W_X[g]).astype(np.int64) for g in gates}
    w_h = {g: ctx.const(_W_H[g]).astype(np.int64) for g in gates}
    bias = {g: ctx.const(_BIAS[g]).astype(np.int64) for g in gates}
    return w_x, w_h, bias


def _stack_gates(ctx: OpContext, ins: list, gates, weights, x_q, h_q) -> _GateStack:
    """Fold and stack the gates; ``x_q``, ``h_q``: (scale, zero point) of the
    input and of the output state."""
    w_x, w_h, bias = weights
    (x_scale, x_zp), (h_scale, h_zp) = x_q, h_q
    n_cell = w_x[3].shape[0]
    gate_scale = np.float32(2.0 ** -12)     # Q3.12 gate pre-activations (no layer norm)

    # Effective scales in float32, in the order TFLite multiplies them.
    def eff(weight_t, act_scale):
        return _multiplier(np.float32(ctx.scale(weight_t)) * np.float32(act_scale) / gate_scale)

    mx = {g: eff(ins[_W_X[g]], x_scale) for g in gates}
    mh = {g: eff(ins[_W_H[g]], h_scale) for g in gates}
    # Zero points and biases folded per row: bias - zp * rowsum(W).
    bx = {g: bias[g] - x_zp * w_x[g].sum(axis=1) for g in gates}
    bh = {g: -h_zp * w_h[g].sum(axis=1) for g in gates}
    return _GateStack(
        count=len(gates),
        wx=np.concatenate([w_x[g] for g in gates]).T.astype(np.float64),
        wh=np.concatenate([w_h[g] for g in gates]).T.astype(np.float64),
        bx=np.concatenate([bx[g] for g in gates]),
        bh=np.concatenate([bh[g] for g in gates]),
        mx_m=np.repeat([mx[g][0] for g in gates], n_cell),
        mx_s=np.repeat([mx[g][1] for g in gates], n_cell),
        mh_m=np.repeat([mh[g][0] for g in gates], n_cell),
        mh_s=np.repeat([mh[g][1] for g in gates], n_cell))


def _hidden_multiplier(hidden_scale: float) -> tuple[int, int]:
    """Requantizes ``o * tanh(c)`` (Q0.15 times Q0.15) to the hidden intermediate."""
    eff_hidden = np.float32(np.float64(2.0 ** -15) / np.float64(hidden_scale) * 2.0 ** -15)
    return quantize_multiplier(float(eff_hidden))


@dataclass
class _Projection:
    """The projection layer: weights (transposed, as float64), folded bias, multiplier."""
    weights: np.ndarray
    bias: np.ndarray
    multiplier: int
    shift: int


def _projection(ctx: OpContext, ins: list, n_cell: int, n_output: int, hidden_q,
                h_scale: float) -> _Projection | None:
    """The projection, or None without one (then the output size must be the cell
    count); ``hidden_q``: the hidden intermediate's (scale, zero point)."""
    hidden_scale, hidden_zp = hidden_q
    if ins[_PROJ_W] is None:
        if n_output != n_cell:
            raise ModelError(f"without projection the output size {n_output} must equal the "
                             f"cell count {n_cell}", where=_WHERE)
        return None
    w_p = ctx.const(_PROJ_W).astype(np.int64)
    b_p = ctx.const(_PROJ_B)
    b_p = np.zeros(n_output, np.int64) if b_p is None else b_p.astype(np.int64)
    # With projection the hidden values are stored as q - zp (LiteRT negates
    # the zero point for this case), so the fold adds zp * rowsum(W) back.
    b_p = b_p + hidden_zp * w_p.sum(axis=1)
    wp_f = w_p.T.astype(np.float64)
    proj_m, proj_s = _multiplier(np.float32(ctx.scale(ins[_PROJ_W]))
                                 * np.float32(hidden_scale) / np.float32(h_scale))
    return _Projection(wp_f, b_p, proj_m, proj_s)


def _quantized_clips(ctx: OpContext, c_t, out_t) -> tuple[int, int]:
    """The cell and projection clips in their tensors' quantized units (0: no clip)."""
    cell_clip = np.float32(ctx.params.get("cell_clip", 0.0) or 0.0)
    proj_clip = np.float32(ctx.params.get("proj_clip", 0.0) or 0.0)
    q_cell_clip = (int(np.clip(cell_clip / np.float32(ctx.scale(c_t)), -32768.0, 32767.0))
                   if cell_clip > 0 else 0)
    q_proj_clip = (int(np.clip(proj_clip / np.float32(ctx.scale(out_t)), -128.0, 127.0))
                   if proj_clip > 0 else 0)
    return q_cell_clip, q_proj_clip


def _activation_tables(cell_scale: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Lookup tables: the gates' sigmoid and tanh (Q3.12 in) and the cell state's tanh."""
    sigmoid = sigmoid_q3_12()
    tanh_gate = tanh_int16(3)
    if not 0 <= 15 + cell_scale <= 6:
        raise ModelError(f"cell state scale 2^{cell_scale} is outside what the integer LSTM "
                         f"supports (2^-15 .. 2^-9)", where=_WHERE)
    return sigmoid, tanh_gate, tanh_int16(15 + cell_scale)


@dataclass
class _Prepared:
    """Everything a run needs, worked out once when the operator is loaded."""
    time_major: bool
    use_cifg: bool
    n_input: int
    n_cell: int
    n_output: int
    gates: _GateStack
    projection: _Projection | None
    hid_m: int                # o * tanh(c) to the hidden intermediate: multiplier, shift
    hid_s: int
    hid_zp: int               # and zero point (negated with a projection)
    h_zp: int                 # the output state's zero point
    q_cell_clip: int          # 0: no clip
    q_proj_clip: int
    sigmoid: np.ndarray
    tanh_gate: np.ndarray
    tanh_cell: np.ndarray
    cell_shift: int
    out_dtype: np.dtype
    out_t: SegmentTensor


def unidirectional_sequence_lstm(ctx: OpContext):
    ins = list(ctx.inputs) + [None] * (24 - len(ctx.inputs))
    x_t, out_t = ins[_X], ctx.outputs[0]
    h_t, c_t = ins[_H_STATE], ins[_C_STATE]
    _check_variant(ctx, ins)
    time_major = bool(ctx.params.get("time_major", False))

    use_cifg = ins[_W_X[0]] is None
    gates = (1, 2, 3) if use_cifg else (0, 1, 2, 3)
    weights = _gate_weights(ctx, gates)
    n_cell, n_input = weights[0][3].shape
    n_output = weights[1][3].shape[1]

    x_q = ctx.scale(x_t), ctx.zero_point(x_t)
    h_scale, h_zp = ctx.scale(h_t), ctx.zero_point(h_t)
    cell_scale = _cell_scale_log2(ctx, c_t)
    hidden = ctx.intermediates[4]
    hidden_scale, hidden_zp = ctx.scale(hidden), ctx.zero_point(hidden)
    stack = _stack_gates(ctx, ins, gates, weights, x_q, (h_scale, h_zp))
    hid_m, hid_s = _hidden_multiplier(hidden_scale)
    projection = _projection(ctx, ins, n_cell, n_output, (hidden_scale, hidden_zp), h_scale)
    q_cell_clip, q_proj_clip = _quantized_clips(ctx, c_t, out_t)
    sigmoid, tanh_gate, tanh_cell = _activation_tables(cell_scale)
    p = _Prepared(
        time_major=time_major, use_cifg=use_cifg, n_input=n_input, n_cell=n_cell,
        n_output=n_output, gates=stack, projection=projection, hid_m=hid_m, hid_s=hid_s,
        hid_zp=-hidden_zp if projection is not None else hidden_zp, h_zp=h_zp,
        q_cell_clip=q_cell_clip, q_proj_clip=q_proj_clip, sigmoid=sigmoid,
        tanh_gate=tanh_gate, tanh_cell=tanh_cell, cell_shift=30 + cell_scale,
        out_dtype=ctx.dtype(out_t), out_t=out_t)

    def run(inputs):
        return _run_sequence(p, inputs)

    return run


# -- run time ------------------------------------------------------------------------------

def _run_sequence(p: _Prepared, inputs):
    """Every time step; the state tensors are overwritten in place with the final states."""
    x = np.asarray(inputs[_X])
    h_state, c_state = inputs[_H_STATE], inputs[_C_STATE]
    xs = x if p.time_major else x.transpose(1, 0, 2)          # (T, B, n_input)
    steps, batch = xs.shape[0], xs.shape[1]
    gx = _input_gates(p, xs).reshape(steps, batch, p.gates.count * p.n_cell)

    h = h_state.reshape(batch, p.n_output).astype(np.int64)
    c = c_state.reshape(batch, p.n_cell).astype(np.int64)
    out = np.empty((steps, batch, p.n_output), np.int64)
    for t in range(steps):
        h, c = _step(p, gx[t], h, c, batch)
        out[t] = h
    h_state[...] = h.reshape(h_state.shape)
    c_state[...] = c.reshape(c_state.shape)
    result = out if p.time_major else out.transpose(1, 0, 2)
    return [np.ascontiguousarray(result, dtype=p.out_dtype).reshape(p.out_t.shape)]


def _input_gates(p: _Prepared, xs):
    """The input's contribution to every gate: it does not depend on the state, so
    all steps at once.  Sums of int8 products are exact in float64 (K * 2^14 << 2^53)."""
    s = p.gates
    acc = (xs.reshape(-1, p.n_input).astype(np.float64) @ s.wx).astype(np.int64) + s.bx
    return _clip(multiply_by_quantized_multiplier(acc, s.mx_m, s.mx_s), _I16_MIN, _I16_MAX)


def _step(p: _Prepared, gx_t, h, c, batch: int):
    """One time step: the new output state and cell state from the previous ones."""
    s = p.gates
    acc = (h.astype(np.float64) @ s.wh).astype(np.int64) + s.bh
    g = _clip(gx_t + multiply_by_quantized_multiplier(acc, s.mh_m, s.mh_s),
              _I16_MIN, _I16_MAX).reshape(batch, s.count, p.n_cell)
    i_gate, f_gate, c_gate, o_gate = _activate_gates(p, g)
    c = _update_cell(p, c, i_gate, f_gate, c_gate)
    hid = o_gate * p.tanh_cell[c + 32768]
    hid = _clip(multiply_by_quantized_multiplier(hid, p.hid_m, p.hid_s) + p.hid_zp,
                -128, 127)
    h = hid if p.projection is None else _project(p, hid)
    return h, c


def _activate_gates(p: _Prepared, g):
    """The input, forget, cell and output gates (with CIFG the input gate is 1 - forget)."""
    k = 0
    if not p.use_cifg:
        i_gate = p.sigmoid[g[:, 0] + 32768].astype(np.int64)
        k = 1
    f_gate = p.sigmoid[g[:, k] + 32768].astype(np.int64)
    c_gate = p.tanh_gate[g[:, k + 1] + 32768].astype(np.int64)
    o_gate = p.sigmoid[g[:, k + 2] + 32768].astype(np.int64)
    if p.use_cifg:
        i_gate = _I16_MAX - f_gate
    return i_gate, f_gate, c_gate, o_gate


def _update_cell(p: _Prepared, c, i_gate, f_gate, c_gate):
    """The new cell state: forget * c + input * cell gate, saturated, then clipped."""
    c = _w16(_rdbypot(f_gate * c, 15))
    c = _clip(c + _w16(_rdbypot32(i_gate * c_gate, p.cell_shift)), _I16_MIN, _I16_MAX)
    if p.q_cell_clip > 0:
        c = _clip(c, -p.q_cell_clip, p.q_cell_clip)
    return c


def _project(p: _Prepared, hid):
    """The projection of the hidden values to the output state, then its clip."""
    pr = p.projection
    acc = (hid.astype(np.float64) @ pr.weights).astype(np.int64) + pr.bias
    h = _clip(multiply_by_quantized_multiplier(acc, pr.multiplier, pr.shift) + p.h_zp,
              -128, 127)
    if p.q_proj_clip > 0:
        h = _clip(h, -p.q_proj_clip, p.q_proj_clip)
    return h
