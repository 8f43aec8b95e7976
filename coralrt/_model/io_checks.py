"""Operators whose LiteRT kernel writes the output with the input's type.

Many of LiteRT's kernels check that an output has its input's type (TRANSPOSE,
SLICE, PAD, CONCATENATION, TILE: "input->type != output->type" while
preparing) or give the output the input's type themselves (EXPAND_DIMS,
GATHER: the spec field ``output_type_from``).  The kernels below do neither:
they pick their arithmetic by the *input's* type and write the output through
a pointer of that type, into a buffer the interpreter sized by the *output's*
declared type.  Measured with ai-edge-litert 2.3 on single-operator models
(both kernel sets):

- a wider input type overflows the output buffer: RESHAPE (``memcpy`` of
  ``input->bytes``; in a real MobileNet, a RESHAPE rewired to an int32 bias
  writes four times its uint8 output's size and the process dies with
  SIGSEGV), UNSORTED_SEGMENT_MAX (SIGSEGV), SEGMENT_SUM (SIGABRT);
- a narrower input type leaves part of the output unwritten (whatever the
  arena held before: a different answer from run to run);
- an equally wide type reinterprets the bits: a float32 SUM read as int32,
  and where the kernel rescales, LiteRT's own two kernel sets disagree
  (an int8 SUM into a uint8 output: 128 from the default kernels, 0 from the
  reference ones), so there is no answer to reproduce.

So validation requires the output type these kernels write with, for every
operator in :data:`coralrt._ops.litert.IO_CHECKS`; SQUEEZE is among them
although LiteRT refuses a byte-size mismatch itself when it runs
("input->bytes != output->bytes"), because at equal sizes it reinterprets too.
Types are the ones LiteRT has given the tensors by then (``types``, see
:mod:`coralrt._model.kernel_view`).
"""

from __future__ import annotations

from coralrt.errors import ModelError
from coralrt._model.kernel_view import typed
from coralrt._model.types import Operator, Subgraph

__all__ = ["output_has_input_type", "embedding_lookup"]

# EMBEDDING_LOOKUP's hybrid kernel dequantizes 8-bit (and 4-bit) tables into a
# float32 output (embedding_lookup.cc, EvalHybrid): the one type change it makes.
_HYBRID_TABLES = ("UINT8", "INT8", "INT4")


def _refuse(op: Operator, where: str, source: str, out: str, k: int) -> None:
    raise ModelError(f"output type {out} differs from input {k}'s type {source}: LiteRT's "
                     f"{op.name} kernel writes the output with its input's type (past the "
                     f"output's buffer when the input type is wider: the process dies)",
                     where=where)


def _types(sg: Subgraph, op: Operator, k: int, types: dict[int, str]):
    if len(op.inputs) <= k or op.inputs[k] < 0 or not op.outputs or op.outputs[0] < 0:
        return None   # omitted operands: check_omitted_inputs has the say on these
    return typed(sg, op.inputs[k], types).type_name, sg.tensors[op.outputs[0]].type_name


def output_has_input_type(sg: Subgraph, op: Operator, where: str,
                          types: dict[int, str]) -> None:
    """Output 0 must have input 0's type (RESHAPE, SQUEEZE, the reductions, the
    segment operators, CUMSUM)."""
    pair = _types(sg, op, 0, types)
    if pair is not None and pair[0] != pair[1]:
        _refuse(op, where, *pair, 0)


def embedding_lookup(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    """Output 0 must have the table's type (input 1), or be FLOAT32 for an 8-bit
    or 4-bit table (the hybrid kernel)."""
    pair = _types(sg, op, 1, types)
    if pair is None:
        return
    table, out = pair
    if table != out and not (out == "FLOAT32" and table in _HYBRID_TABLES):
        _refuse(op, where, table, out, 1)
