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

UNIDIRECTIONAL_SEQUENCE_LSTM checks none of its output and state types either
(unidirectional_sequence_lstm.cc): it picks float, hybrid or integer
arithmetic from its input-to-output weights and its input, and writes its
output and both states with that arithmetic's types (float32; or int8 output
and output state, int16 cell state), into buffers sized by their declared
types.  Measured with ai-edge-litert 2.3 on both kernel sets: a STRING output
(no buffer) dies with SIGSEGV; a narrower one (INT4, half a byte per value)
is written past its end; a wider one (UINT32, FLOAT32, FLOAT64 for int8
values) is returned with most of its bytes never written; a cell state
narrower than int16 (INT8, UINT8, BOOL, INT4) is written past its end, and
with 4 x 256 cells the process dies (SIGABRT, heap corruption).  So the
output must have the arithmetic's type, and each state at least its bytes
(a wider state is read back only by the kernel, with its own type, and
changes nothing: LiteRT runs it, and the simulator and the NumPy backend
decline it).

CONV_2D and DEPTHWISE_CONV_2D do check their types while preparing (conv.cc,
depthwise_conv.cc: the input is float32, uint8, int8 or int16 and the output
has its type), so LiteRT refuses what :func:`convolution` refuses; the rule is
here so that the simulated Edge TPU and the NumPy backend, whose kernels
would run such a convolution, refuse the same model.
"""

from __future__ import annotations

from coralrt.errors import ModelError
from coralrt._model.kernel_view import EIGHT_BIT, typed
from coralrt._model.types import TENSOR_TYPES, Operator, Subgraph, packed_size

__all__ = ["output_has_input_type", "embedding_lookup", "sequence_lstm", "convolution",
           "weights", "concatenation"]

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


# The types UNIDIRECTIONAL_SEQUENCE_LSTM writes its output, output state and
# cell state with, per arithmetic.
_FLOAT_LSTM = ("FLOAT32", "FLOAT32", "FLOAT32")
_INTEGER_LSTM = ("INT8", "INT8", "INT16")


def _lstm_arithmetic(x: str, w: str) -> tuple[str, tuple[str, str, str]] | None:
    """The arithmetic unidirectional_sequence_lstm.cc (Eval) picks from the
    input-to-output weights' type ``w`` and the input's type ``x``, and the
    types it writes; None where it writes nothing (it refuses the types)."""
    if w == "FLOAT32":
        return "float", _FLOAT_LSTM
    if w in EIGHT_BIT and x == "FLOAT32":
        return "hybrid", _FLOAT_LSTM
    if w in EIGHT_BIT and x == "INT8":
        return "integer", _INTEGER_LSTM
    return None


def sequence_lstm(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    """The output has the type the kernel's arithmetic writes; the output state
    (input 18) and the cell state (input 19) hold at least as many bytes."""
    ins = op.inputs
    if len(ins) < 20 or min(ins[0], ins[4], ins[18], ins[19]) < 0 or not op.outputs \
            or op.outputs[0] < 0:
        return   # check_omitted_inputs and the structural check have the say on these
    picked = _lstm_arithmetic(typed(sg, ins[0], types).type_name,
                              sg.tensors[ins[4]].type_name)
    if picked is None:
        return
    kind, (out_type, h_type, c_type) = picked
    out = sg.tensors[op.outputs[0]]
    if out.type_name != out_type:
        raise ModelError(f"output type {out.type_name} is not {out_type}, the type LiteRT's "
                         f"{kind} {op.name} kernel writes its output with (past the output's "
                         f"buffer when that is narrower: the process dies; else leaving "
                         f"bytes unwritten)", where=where)
    for k, role, want in ((18, "output state", h_type), (19, "cell state", c_type)):
        t = sg.tensors[ins[k]]
        if (packed_size(t.type, t.shape) or 0) < packed_size(TENSOR_TYPES[want], t.shape):
            raise ModelError(f"{role} (input {k}) of type {t.type_name} is narrower than "
                             f"the {want} values LiteRT's {kind} {op.name} kernel writes "
                             f"into it (past its buffer: the process dies)", where=where)


# The input types conv.cc and depthwise_conv.cc take.
_CONV_TYPES = ("FLOAT32", "UINT8", "INT8", "INT16")


def convolution(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    """CONV_2D, DEPTHWISE_CONV_2D: the input is one of the types the kernel
    takes, and the output has the input's type (LiteRT refuses too)."""
    pair = _types(sg, op, 0, types)
    if pair is None:
        return
    source, out = pair
    if source not in _CONV_TYPES:
        raise ModelError(f"input type {source} is not one LiteRT's {op.name} kernel takes "
                         f"({', '.join(_CONV_TYPES)}); LiteRT refuses the model too",
                         where=where)
    if out != source:
        raise ModelError(f"output type {out} differs from the input's type {source}, which "
                         f"LiteRT's {op.name} kernel requires; LiteRT refuses the model too",
                         where=where)
    weights(sg, op, where, types)


# Input type -> the weight types each kernel computes with (measured with
# ai-edge-litert 2.3, both kernel sets).  The others are refused by LiteRT while
# preparing or running (an int8 CONV_2D with uint8 weights: "Weight type ... not
# currently supported"), or read as the input's type whatever they are (a uint8
# CONV_2D reads int32 or bool weights as bytes, a float one reads int16 weights
# as floats, past their buffer): refused here on every target.
_WEIGHTS = {
    "CONV_2D": {"FLOAT32": ("FLOAT32", "UINT8", "INT8"), "UINT8": ("UINT8",),
                "INT8": ("INT8", "INT4"), "INT16": ("INT8", "INT4")},
    "DEPTHWISE_CONV_2D": {"FLOAT32": ("FLOAT32", "INT8"), "UINT8": ("UINT8",),
                          "INT8": ("INT8", "INT4"), "INT16": ("INT8", "INT4")},
    "FULLY_CONNECTED": {"FLOAT32": ("FLOAT32", "UINT8", "INT8", "INT4"),
                        "UINT8": ("UINT8", "INT8"), "INT8": ("UINT8", "INT8", "INT4"),
                        "INT16": ("UINT8", "INT8", "INT16", "INT4")},
}


def weights(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    """The weights (input 1) have a type the kernel computes with for its input's type."""
    pair = _types(sg, op, 1, types)
    if pair is None or op.inputs[0] < 0:
        return
    source = typed(sg, op.inputs[0], types).type_name
    allowed = _WEIGHTS[op.name].get(source)
    w = pair[0]
    if allowed is not None and w not in allowed:
        raise ModelError(f"weights of type {w} for a {source} input: LiteRT's {op.name} kernel "
                         f"computes with {' or '.join(allowed)} weights and refuses or "
                         f"misreads these", where=where)


def concatenation(sg: Subgraph, op: Operator, where: str, types: dict[int, str]) -> None:
    """CONCATENATION: every input and the output have input 0's type (the types
    LiteRT has given them; concatenation.cc refuses others while preparing)."""
    if not op.inputs or min(op.inputs) < 0 or not op.outputs or op.outputs[0] < 0:
        return
    first = typed(sg, op.inputs[0], types).type_name
    for k, i in enumerate(op.inputs[1:], 1):
        t = typed(sg, i, types).type_name
        if t != first:
            raise ModelError(f"input {k} is {t} but input 0 is {first}: LiteRT's CONCATENATION "
                             f"kernel refuses inputs of different types", where=where)
    out = sg.tensors[op.outputs[0]].type_name
    if out != first:
        raise ModelError(f"output type {out} differs from the inputs' type {first}: LiteRT's "
                         f"CONCATENATION kernel refuses such a model", where=where)
