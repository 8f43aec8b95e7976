"""Per-operator structural checks for builtin operators whose native kernels
trust their operands (found by fuzzing LiteRT with damaged real models).

Each check takes the subgraph, the operator and a place name, and raises
:class:`~coralrt.errors.ModelError` when the operator cannot be prepared
safely.
"""

from __future__ import annotations

import math

import numpy as np

from coralrt.errors import ModelError
from coralrt.model.types import Operator, Subgraph

__all__ = ["check_builtin_op"]

_MAX_RANK = 6  # the most dimensions TFLite's reshape kernels handle


def _reshape(sg: Subgraph, op: Operator, where: str) -> None:
    if not op.inputs or op.inputs[0] < 0 or not op.outputs:
        raise ModelError("RESHAPE needs an input and an output", where=where)
    if len(op.inputs) > 1 and op.inputs[1] >= 0:
        shape_t = sg.tensors[op.inputs[1]]
        if not shape_t.is_constant:
            return  # computed at run time; the kernel checks it then
        if shape_t.dtype is None or shape_t.dtype.kind != "i" or len(shape_t.shape) > 1:
            raise ModelError(f"RESHAPE shape operand must be a 1-D integer tensor, got "
                             f"{shape_t.type_name} of shape {list(shape_t.shape)}", where=where)
        new_shape = [int(d) for d in shape_t.data.reshape(-1)]
    else:
        new_shape = list(op.options.get("new_shape") or [])
        if not new_shape:
            return
    if len(new_shape) > _MAX_RANK:
        raise ModelError(f"RESHAPE to rank {len(new_shape)} exceeds {_MAX_RANK}", where=where)
    if sum(d == -1 for d in new_shape) > 1 or any(d < -1 for d in new_shape):
        raise ModelError(f"RESHAPE target shape {new_shape} is invalid", where=where)
    n_in = math.prod(sg.tensors[op.inputs[0]].shape)
    known = math.prod(d for d in new_shape if d != -1)
    if -1 in new_shape:
        ok = known > 0 and n_in % known == 0
    else:
        ok = known == n_in
    if not ok:
        raise ModelError(f"RESHAPE of {n_in} elements to {new_shape}", where=where)


def _fully_connected(sg: Subgraph, op: Operator, where: str) -> None:
    if len(op.inputs) < 2 or min(op.inputs[:2]) < 0 or not op.outputs:
        raise ModelError("FULLY_CONNECTED needs an input, weights and an output", where=where)
    x, w = sg.tensors[op.inputs[0]], sg.tensors[op.inputs[1]]
    if len(w.shape) != 2 or w.shape[1] == 0:
        raise ModelError(f"FULLY_CONNECTED weights of shape {list(w.shape)} are not 2-D",
                         where=where)
    n_in, (units, depth) = math.prod(x.shape), w.shape
    if n_in % depth:
        raise ModelError(f"FULLY_CONNECTED input of {n_in} elements is not a multiple of the "
                         f"weights' depth {depth}", where=where)
    # The kernel sizes its output from the input batch; a declared output that
    # disagrees means the file is inconsistent (and the kernel would write past it).
    n_out = math.prod(sg.tensors[op.outputs[0]].shape)
    if n_out != n_in // depth * units:
        raise ModelError(f"FULLY_CONNECTED output of {n_out} elements, but {n_in} inputs and "
                         f"{units}x{depth} weights give {n_in // depth * units}", where=where)


def _sequence_lstm(sg: Subgraph, op: Operator, where: str) -> None:
    if len(op.inputs) < 20 or op.inputs[0] < 0 or op.inputs[18] < 0 or not op.outputs:
        raise ModelError("UNIDIRECTIONAL_SEQUENCE_LSTM needs 20+ inputs with an input and an "
                         "output state", where=where)
    x, state = sg.tensors[op.inputs[0]], sg.tensors[op.inputs[18]]
    out = sg.tensors[op.outputs[0]]
    if len(x.shape) != 3 or len(out.shape) != 3 or out.shape[:2] != x.shape[:2] \
            or not state.shape or out.shape[2] != state.shape[-1]:
        raise ModelError(f"UNIDIRECTIONAL_SEQUENCE_LSTM input {list(x.shape)}, output "
                         f"{list(out.shape)} and state {list(state.shape)} disagree", where=where)
    qs, qo = state.quantization, out.quantization
    if x.type_name == "INT8" and qs is not None and qo is not None and (
            qs.params != qo.params):
        raise ModelError("UNIDIRECTIONAL_SEQUENCE_LSTM output state and output must share "
                         "their quantization", where=where)


def _same_shape(sg: Subgraph, op: Operator, where: str) -> None:
    # Kernels size their output from the input at prepare time; a declared
    # output shape that disagrees means every later operator was planned on
    # sizes the kernels will not produce.
    if not op.inputs or op.inputs[0] < 0 or not op.outputs:
        raise ModelError(f"{op.name} needs an input and an output", where=where)
    a, b = sg.tensors[op.inputs[0]].shape, sg.tensors[op.outputs[0]].shape
    if a != b:
        raise ModelError(f"{op.name} output shape {list(b)} differs from its input shape "
                         f"{list(a)}", where=where)


def _broadcast(sg: Subgraph, op: Operator, where: str) -> None:
    if len(op.inputs) != 2 or min(op.inputs) < 0 or not op.outputs:
        raise ModelError(f"{op.name} needs two inputs and an output", where=where)
    a, b = (sg.tensors[i].shape for i in op.inputs)
    try:
        want = tuple(int(d) for d in np.broadcast_shapes(a, b))
    except ValueError:
        raise ModelError(f"{op.name} input shapes {list(a)} and {list(b)} do not broadcast",
                         where=where) from None
    out = sg.tensors[op.outputs[0]].shape
    if out != want:
        raise ModelError(f"{op.name} output shape {list(out)} is not the broadcast shape "
                         f"{list(want)} of its inputs", where=where)


_SAME_SHAPE = ("QUANTIZE", "DEQUANTIZE", "RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1",
               "LOGISTIC", "TANH", "HARD_SWISH", "SOFTMAX", "LOG_SOFTMAX", "L2_NORMALIZATION",
               "ABS", "NEG", "RSQRT", "SQRT", "EXP", "LOG", "ELU", "LEAKY_RELU", "GELU",
               "FLOOR", "CEIL", "ROUND", "SIN", "COS", "SQUARE", "SIGN", "CAST")
_BROADCAST = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE",
              "FLOOR_DIV", "FLOOR_MOD", "POW")

_CHECKS = {"RESHAPE": _reshape, "FULLY_CONNECTED": _fully_connected,
           "UNIDIRECTIONAL_SEQUENCE_LSTM": _sequence_lstm,
           **dict.fromkeys(_SAME_SHAPE, _same_shape), **dict.fromkeys(_BROADCAST, _broadcast)}


def check_builtin_op(sg: Subgraph, op: Operator, where: str) -> None:
    check = _CHECKS.get(op.name)
    if check is not None:
        check(sg, op, where)
