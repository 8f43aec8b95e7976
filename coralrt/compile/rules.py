"""Edge TPU operator-support rules, as data.

Every operator the Edge TPU can run has an :class:`OpSupport` entry: its
highest supported version, the fused activations it accepts and a tuple of
small named checks.  The checks, the :class:`OpView` they take and the
statuses their reasons start with live in :mod:`coralrt.compile.checks`
(re-exported here); this module holds the table and the registry that
applies it.

Sources: the Edge TPU operation table and model requirements published by
Coral (coral.ai/docs/edgetpu/models-intro), and what edgetpu_compiler did on
the compiled model pairs in the test data (for example, dilated depthwise
convolutions map, a bilinear resize of a 1x1 input with align_corners does
not).  See docs/partitioning.md.

Plugins add rules with ``RuleRegistry.add_op`` / ``add_check``; nothing here
is an if-chain over operator names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from coralrt.compile.checks import (
    GENERIC_CHECKS, MAPPED, SECOND_SUBGRAPH, UNSPECIFIED_LIMITATION, UNSUPPORTED_DETAILS,
    UNSUPPORTED_OP, UNSUPPORTED_TYPE, UNSUPPORTED_VERSION, Check, OpView, concat_constants,
    constant_operands,
    fc_default_weights, innermost_three, int8_only, layer_width, lstm_types,
    mean_depth_multiple_of_4, not_on_batch, pad_not_on_batch, prelu_alpha, requantize_only,
    resize_precision, same_dilation, softmax_vector, static_shapes, unit_strides)
from coralrt.model.types import ACTIVATIONS

__all__ = [
    "UNSUPPORTED_OP", "UNSUPPORTED_TYPE", "UNSUPPORTED_VERSION", "UNSPECIFIED_LIMITATION",
    "SECOND_SUBGRAPH", "MAPPED", "OpView", "OpSupport", "RuleRegistry", "default_rules",
]

# Bump when a rule changes what maps, so cached compilations are redone
# (3: compat mode's rules, compile/compat.py; 4: layer width limits).
RULES_VERSION = 4


# -- the table ----------------------------------------------------------------

DEFAULT_ACTIVATIONS = frozenset({"NONE", "RELU", "RELU6", "RELU_N1_TO_1"})


@dataclass
class OpSupport:
    max_version: int
    checks: tuple[Check, ...] = ()
    activations: frozenset = DEFAULT_ACTIVATIONS
    generic: tuple[Check, ...] = GENERIC_CHECKS


class RuleRegistry:
    """Operator name -> :class:`OpSupport`; :meth:`check` applies them."""

    def __init__(self) -> None:
        self._ops: dict[str, OpSupport] = {}

    def add_op(self, name: str, support: OpSupport) -> None:
        self._ops[name] = support

    def add_check(self, name: str, check: Check) -> None:
        self._ops[name].checks = (*self._ops[name].checks, check)

    def copy(self) -> RuleRegistry:
        """An independent registry: adding to it leaves this one unchanged."""
        new = RuleRegistry()
        new._ops = {name: replace(s) for name, s in self._ops.items()}
        return new

    def __contains__(self, name: str) -> bool:
        return name in self._ops

    def names(self) -> list[str]:
        return sorted(self._ops)

    def check(self, view: OpView) -> str | None:
        """None when the Edge TPU can run the operator, else the reason."""
        support = self._ops.get(view.name)
        if support is None:
            kind = "custom operator" if view.op.opcode.is_custom else "operator"
            detail = UNSUPPORTED_DETAILS.get(view.name)
            more = f"; {detail(view)}" if detail is not None else ""
            return f"{UNSUPPORTED_OP}: the Edge TPU has no {view.name} {kind}{more}"
        if view.op.version > support.max_version:
            return (f"{UNSUPPORTED_VERSION}: {view.name} version {view.op.version} (the Edge "
                    f"TPU supports up to {support.max_version})")
        for check in support.generic:
            reason = check(view)
            if reason:
                return reason
        for k in range(len(view.op.inputs)):
            t = view.input(k)
            # Segments carry dense constants only (formats/segment.py); LiteRT
            # densifies sparse ones on the CPU.
            if t is not None and t.extra.get("sparsity"):
                return (f"{UNSPECIFIED_LIMITATION}: input {k} is a sparse tensor; "
                        f"Edge TPU segments take dense constants only")
            # A segment keeps its state tensors to itself; one the model also
            # returns must stay where the CPU backend can hand it out.
            if t is not None and t.is_variable and view.op.inputs[k] in view.sg.outputs:
                return (f"{UNSPECIFIED_LIMITATION}: input {k} is state the model also "
                        f"returns as an output; an Edge TPU segment keeps its state inside")
        act = view.options.get("fused_activation_function")
        if act is not None and ACTIVATIONS.get(act, str(act)) not in support.activations:
            return (f"{UNSPECIFIED_LIMITATION}: fused activation "
                    f"{ACTIVATIONS.get(act, act)} is not supported on {view.name}")
        for check in support.checks:
            reason = check(view)
            if reason:
                return reason
        return None


_NONE = frozenset({"NONE"})


def default_rules() -> RuleRegistry:
    """The Edge TPU's operator table (fresh registry, safe to extend)."""
    r = RuleRegistry()
    for name in ("ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM"):
        r.add_op(name, OpSupport(max_version=4))
    # TFLite implements these two for int8 only.
    r.add_op("SQUARED_DIFFERENCE", OpSupport(2, (int8_only,)))
    r.add_op("RSQRT", OpSupport(3, (int8_only,)))
    for name in ("LOGISTIC", "TANH", "RELU", "RELU6", "RELU_N1_TO_1", "HARD_SWISH",
                 "L2_NORMALIZATION", "SQUEEZE", "EXPAND_DIMS", "RESHAPE",
                 "SPACE_TO_DEPTH", "TRANSPOSE"):
        r.add_op(name, OpSupport(max_version=3))
    r.add_op("CONV_2D", OpSupport(5, (constant_operands(1, 2), same_dilation, layer_width)))
    r.add_op("DEPTHWISE_CONV_2D", OpSupport(6, (constant_operands(1, 2), same_dilation)))
    r.add_op("TRANSPOSE_CONV", OpSupport(3, (constant_operands(0, 1, 3),)))
    r.add_op("FULLY_CONNECTED", OpSupport(9, (constant_operands(1, 2), fc_default_weights,
                                              layer_width)))
    r.add_op("AVERAGE_POOL_2D", OpSupport(3, activations=_NONE))
    r.add_op("MAX_POOL_2D", OpSupport(3, activations=_NONE))
    r.add_op("CONCATENATION", OpSupport(3, (concat_constants,), activations=_NONE))
    r.add_op("MEAN", OpSupport(3, (not_on_batch(axis_input=1), mean_depth_multiple_of_4)))
    r.add_op("SUM", OpSupport(3, (not_on_batch(axis_input=1),)))
    r.add_op("REDUCE_MAX", OpSupport(3, (not_on_batch(axis_input=1),)))
    r.add_op("REDUCE_MIN", OpSupport(3, (not_on_batch(axis_input=1),)))
    r.add_op("PACK", OpSupport(3, (not_on_batch(option="axis"),)))
    r.add_op("SPLIT", OpSupport(4, (not_on_batch(axis_input=0),)))
    r.add_op("SLICE", OpSupport(5, (constant_operands(1, 2),)))
    r.add_op("STRIDED_SLICE", OpSupport(6, (constant_operands(1, 2, 3), unit_strides)))
    r.add_op("PAD", OpSupport(4, (pad_not_on_batch,)))
    r.add_op("PRELU", OpSupport(2, (prelu_alpha,)))
    r.add_op("RESIZE_BILINEAR", OpSupport(4, (constant_operands(1), resize_precision)))
    r.add_op("RESIZE_NEAREST_NEIGHBOR", OpSupport(4, (constant_operands(1), resize_precision)))
    r.add_op("SOFTMAX", OpSupport(3, (softmax_vector,)))
    r.add_op("QUANTIZE", OpSupport(3, (requantize_only,), generic=(static_shapes, innermost_three)))
    r.add_op("UNIDIRECTIONAL_SEQUENCE_LSTM", OpSupport(
        4, (constant_operands(*range(1, 12)),),
        activations=frozenset({"NONE", "RELU", "RELU6", "TANH", "SIGN_BIT"}),
        generic=(static_shapes, innermost_three, lstm_types)))
    return r
