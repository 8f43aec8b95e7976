"""The XNNPACK delegate's operator selection: quantization it crashes on.

LiteRT's default (optimized) kernels apply the XNNPACK delegate.  While it
chooses the operators it takes, it logs an unusable scale or zero point of a
QUANTIZE operand or of BATCH_MATMUL's first input through a null context
(``delegates/xnnpack/xnnpack_delegate.cc``: ``GetXNNPackDatatype`` ->
``TF_LITE_KERNEL_LOG``): SIGSEGV.  Measured with ai-edge-litert 2.3
(tests/test_validation_bounds.py).

The checks have the form of :mod:`coralrt._model.quant_checks`'; the specs of
QUANTIZE and BATCH_MATMUL name them (their ``quant_check`` field).
"""

from __future__ import annotations

import math

import numpy as np

from coralrt.errors import ModelError
from coralrt._model.kernel_view import EIGHT_BIT, F32, TYPE_RANGE, Typed, legacy, typed
from coralrt._model.types import Operator, Subgraph

__all__ = ["quantize", "batch_matmul"]


def _xnnpack_takes(t: Typed) -> bool:
    """CheckTensorFloatOrQUInt8Type: the tensor's type passes the delegate's first look."""
    if t.type_name in ("FLOAT32", "FLOAT16"):
        return True
    q = t.quantization
    if t.type_name not in EIGHT_BIT or q is None or q.scale.size != 1:
        return False
    return q.quantized_dimension == 0 and (t.type_name == "INT8" or q.zero_point.size == 1)


def _xnnpack_datatype_fails(t: Typed) -> str | None:
    """Why GetXNNPackDatatype would log (and so crash) for a tensor that passed
    _xnnpack_takes, or None."""
    if t.type_name not in EIGHT_BIT:
        return None
    scale, zp = legacy(t)
    if not (math.isfinite(scale) and scale > 0 and abs(scale) >= np.finfo(F32).tiny):
        return f"scale {scale:g} is not a positive normal float"
    lo, hi = TYPE_RANGE[t.type_name]
    if not lo <= zp <= hi:
        return f"zero point {zp} is outside [{lo}, {hi}]"
    return None


def _xnnpack_operands(sg: Subgraph, op: Operator, where: str, types: dict[int, str],
                      checked: tuple[int, ...], gated: tuple[int, ...]) -> None:
    # The delegate looks at operands ``gated`` (input positions; -1: output 0)
    # with quiet type checks, then asks GetXNNPackDatatype about ``checked``.
    def tensor(k: int) -> Typed | None:
        if k == -1:
            return typed(sg, op.outputs[0], types) if op.outputs else None
        return (typed(sg, op.inputs[k], types) if k < len(op.inputs) and op.inputs[k] >= 0
                else None)

    looked = [tensor(k) for k in gated]
    if any(t is None or not _xnnpack_takes(t) for t in looked):
        return
    for k in checked:
        problem = _xnnpack_datatype_fails(tensor(k))
        if problem:
            what = "output" if k == -1 else f"input {k}"
            raise ModelError(f"{op.name} {what}: {problem}; LiteRT's XNNPACK delegate (the "
                             f"default kernels) crashes on it", where=where)


def quantize(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    _xnnpack_operands(sg, op, where, types, checked=(0, -1), gated=(0, -1))


def batch_matmul(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    _xnnpack_operands(sg, op, where, types, checked=(0,), gated=(0,))
