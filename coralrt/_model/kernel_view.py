"""How LiteRT's kernels see an operator's tensors when they prepare.

Shared by the validation rules of :mod:`coralrt._model.quant_checks` and
:mod:`coralrt._model.xnnpack_checks`: a tensor's quantization as
LiteRT leaves it (``InterpreterBuilder`` and
``GetLegacyQuantization`` in ``core/subgraph.cc``: no scales or per-channel
scales give scale 0 and zero point 0; zero points are truncated to 32 bits),
and the type a kernel gives its output while preparing.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import ModelError
from coralrt._model.types import Operator, Subgraph, Tensor

__all__ = ["F32", "EIGHT_BIT", "TYPE_RANGE", "Typed", "typed", "operands", "legacy",
           "quantized", "fail"]

F32 = np.float32
EIGHT_BIT = ("UINT8", "INT8")
TYPE_RANGE = {"UINT8": (0, 255), "INT8": (-128, 127), "INT16": (-32768, 32767)}


def _int32(v: int) -> int:
    return (int(v) + 2**31) % 2**32 - 2**31


def quantized(t: Tensor) -> bool:
    """True when LiteRT gives the tensor affine quantization (it has scales)."""
    return t.quantization is not None and t.quantization.scale.size > 0


def legacy(t: Tensor) -> tuple[np.float32, int]:
    """``tensor->params``: (scale, zero point) of a per-tensor quantization, else (0, 0)."""
    q = t.quantization
    if q is None or q.scale.size != 1:
        return F32(0.0), 0
    return F32(q.scale[0]), _int32(q.zero_point[0]) if q.zero_point.size else 0



def fail(op: Operator, where: str, detail: str, kernels: str = "LiteRT's") -> None:
    raise ModelError(f"{detail}: {kernels} {op.name} kernel aborts on these quantization "
                     f"parameters", where=where)


class Typed:
    """A tensor seen with the type LiteRT gives it when the kernel runs: many
    kernels set their output's type from an input's while preparing (add.cc:
    ``output->type = input2->type``), whatever the file declares."""

    __slots__ = ("tensor", "type_name")

    def __init__(self, tensor: Tensor, type_name: str):
        self.tensor, self.type_name = tensor, type_name

    def __getattr__(self, name):
        return getattr(self.tensor, name)


def typed(sg: Subgraph, i: int, types: dict[int, str]) -> Typed:
    t = sg.tensors[i]
    return Typed(t, types.get(i, t.type_name))


def operands(sg: Subgraph, op: Operator, n_in: int,
              types: dict[int, str]) -> list[Typed] | None:
    if len(op.inputs) < n_in or min(op.inputs[:n_in]) < 0 or not op.outputs:
        return None  # check_omitted_inputs has the say on these
    return [typed(sg, i, types) for i in (*op.inputs[:n_in], op.outputs[0])]
