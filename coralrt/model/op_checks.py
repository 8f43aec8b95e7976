"""Per-operator structural checks for builtin operators whose native kernels
trust their operands (found by fuzzing LiteRT with damaged real models).

Each check takes the subgraph, the operator and a place name, and raises
:class:`~coralrt.errors.ModelError` when the operator cannot be prepared
safely.
"""

from __future__ import annotations

import math

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


_CHECKS = {"RESHAPE": _reshape, "FULLY_CONNECTED": _fully_connected}


def check_builtin_op(sg: Subgraph, op: Operator, where: str) -> None:
    check = _CHECKS.get(op.name)
    if check is not None:
        check(sg, op, where)
