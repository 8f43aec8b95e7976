"""Which inputs of each builtin operator a model may omit (tensor index -1).

The native crash this prevents: LiteRT hands an omitted input to a kernel as
a null tensor.  Kernels that fetch an input with ``GetOptionalInputTensor``
(or test it for null) skip it; every other access dereferences it, and so
does the XNNPACK delegate, which indexes ``tensors[-1]`` while it decides
what to delegate.  The process dies with SIGSEGV: a MobileNet whose CONV_2D
filter is -1, a RESHAPE whose shape is -1, a CONCATENATION or SPLIT with a -1
operand, an LSTM that drops its input-gate bias but keeps the input gate.

Source: LiteRT's kernels (``tflite/kernels/*.cc``: ``GetOptionalInputTensor``
calls and null checks mark optional inputs; ``GetInput``/``GetInputSafe``
required ones), the XNNPACK delegate, and the converter's operator
definitions (``tflite/converter/ir/tfl_ops.td``: ``TFL_TensorOfOrNone``
operands), read in LiteRT's sources; the optional inputs and every operator
of the shared test models were checked against ai-edge-litert 2.3.  Where the converter and the kernel disagree (CONV_2D and
DEPTHWISE_CONV_2D bias: the converter allows none, the kernel refuses it with
an error, not a crash) the input stays optional: never a false rejection.

Operators absent from :data:`OPTIONAL_INPUTS` (custom operators, builtins
LiteRT has no kernel for, and STABLEHLO_CASE/STABLEHLO_COMPOSITE, whose
omissions depend on their branch subgraphs) are not checked.
:data:`MIN_INPUTS` holds the fewest inputs each kernel takes.
"""

from __future__ import annotations

from collections.abc import Sequence

from coralrt.errors import ModelError
from coralrt._model.types import Operator, Subgraph
from coralrt._ops import builtin_specs, operator_table

__all__ = ["OPTIONAL_INPUTS", "ONLY_WITH", "MIN_INPUTS", "check_omitted_inputs"]

# The tables are derived from the operator specs (coralrt._ops), which hold
# LiteRT's facts about each builtin's inputs (coralrt/_ops/litert.py); they are
# built on first use, not at import.
#
# OPTIONAL_INPUTS: builtin operator name -> input positions that may be -1.
# ONLY_WITH: operator -> {position: alternatives}: the input may be -1 only
#   when, for one alternative, every position it lists is -1 too.
# MIN_INPUTS: operator -> fewest inputs it may have (its LiteRT kernel's
#   NumInputs check).
_TABLES = {"OPTIONAL_INPUTS": "optional_inputs", "ONLY_WITH": "only_with",
           "MIN_INPUTS": "min_inputs"}


def __getattr__(name: str):
    field = _TABLES.get(name)
    if field is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return operator_table(field)


def _unused_input(sg: Subgraph, position: int) -> bool:
    # LiteRT drops branch inputs no operator reads and that are not outputs
    # (Subgraph::RemoveUnusedInputs) and skips them when copying IF inputs.
    if position >= len(sg.inputs):
        return True  # a count mismatch, which the IF kernel reports as an error
    t = sg.inputs[position]
    return t not in sg.outputs and all(t not in op.inputs for op in sg.operators)


def _if_branch_unused(op: Operator, position: int, subgraphs: Sequence[Subgraph]) -> bool:
    branches = [op.options.get("then_subgraph_index"), op.options.get("else_subgraph_index")]
    return all(isinstance(b, int) and 0 <= b < len(subgraphs)
               and _unused_input(subgraphs[b], position - 1) for b in branches)


def check_omitted_inputs(op: Operator, where: str, subgraphs: Sequence[Subgraph] = ()) -> None:
    """Raise ModelError when ``op`` omits (-1) an input its LiteRT kernel needs,
    or has fewer inputs than its kernel can run with.  ``subgraphs``: the
    model's subgraphs, for IF (its branches decide which inputs may be -1)."""
    if op.opcode.is_custom:
        return
    spec = builtin_specs().get(op.name)
    optional = None if spec is None else spec.optional_inputs
    if optional is None:
        return
    need = spec.min_inputs or 0
    if len(op.inputs) < need:
        raise ModelError(f"{op.name} has {len(op.inputs)} input(s) but needs at least {need}",
                         where=where)
    omitted = {k for k, i in enumerate(op.inputs) if i < 0}
    for k in sorted(omitted):
        if op.name == "IF" and k > 0 and _if_branch_unused(op, k, subgraphs):
            continue
        ok = k in optional and any(
            omitted.issuperset(alt) for alt in spec.only_with.get(k, ((),)))
        if not ok:
            raise ModelError(f"input {k} of {op.name} is -1 (omitted), but {op.name} cannot "
                             f"run without it", where=where)
