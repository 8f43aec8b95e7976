"""The checks behind the Edge TPU operator-support rules, and what they see.

A check takes an :class:`OpView` (an operator with its tensors resolved) and
returns ``None`` when the operator passes, or a reason string.  Reasons start
with the status edgetpu_compiler prints in its operation log (the constants
below, so a user can search for it) and add what exactly failed.  The
generic checks apply to every operator; the others are named in the Edge TPU
rule of each operator's spec (:mod:`coralrt._ops`).  :mod:`coralrt._compile.rules`
(and the old name :mod:`coralrt._compile.checks`) re-export the statuses and
:class:`OpView`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from coralrt._model.types import Operator, Subgraph, Tensor

__all__ = [
    "UNSUPPORTED_OP", "UNSUPPORTED_TYPE", "UNSUPPORTED_VERSION", "UNSPECIFIED_LIMITATION",
    "SECOND_SUBGRAPH", "MAPPED", "EIGHT_BIT", "SOFTMAX_MAX_ELEMENTS", "Check", "OpView",
    "GENERIC_CHECKS", "eight_bit", "static_shapes", "innermost_three", "constant_operands",
    "same_dilation", "fc_default_weights", "concat_constants", "not_on_batch",
    "mean_depth_multiple_of_4", "pad_not_on_batch", "prelu_alpha", "resize_precision",
    "softmax_vector", "unit_strides", "requantize_only", "int8_only", "lstm_types",
    "batch_matmul_refusal", "gelu_refusal", "table_lookup_refusal",
]

# Status strings of edgetpu_compiler's operation log.
UNSUPPORTED_OP = "Operation not supported"
UNSUPPORTED_TYPE = "Operation is working on an unsupported data type"
UNSUPPORTED_VERSION = "Operation version not supported"
UNSPECIFIED_LIMITATION = ("Operation is otherwise supported, but not mapped due to some "
                          "unspecified limitation")
SECOND_SUBGRAPH = "More than one subgraph is not supported"
MAPPED = "Mapped to Edge TPU"

EIGHT_BIT = ("UINT8", "INT8")
SOFTMAX_MAX_ELEMENTS = 16000

Check = Callable[["OpView"], "str | None"]


@dataclass
class OpView:
    """An operator with its tensors resolved, as the checks see it."""

    sg: Subgraph
    op: Operator
    index: int

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def options(self) -> dict:
        return self.op.options

    def input(self, k: int) -> Tensor | None:
        i = self.op.inputs[k] if k < len(self.op.inputs) else -1
        return self.sg.tensors[i] if i >= 0 else None

    @property
    def inputs(self) -> list[Tensor]:
        return [self.sg.tensors[i] for i in self.op.inputs if i >= 0]

    @property
    def outputs(self) -> list[Tensor]:
        return [self.sg.tensors[i] for i in self.op.outputs]

    @property
    def activations(self) -> list[tuple[str, Tensor]]:
        """Non-constant inputs and all outputs, labelled for messages."""
        ins = [(f"input {k}", t) for k, t in enumerate(self.inputs) if not t.is_constant]
        outs = [(f"output {k}", t) for k, t in enumerate(self.outputs)]
        return ins + outs

    def const(self, k: int) -> np.ndarray | None:
        t = self.input(k)
        return None if t is None or not t.is_constant else t.data


def _fmt(shape) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


# -- generic checks (every operator) ------------------------------------------


def eight_bit(v: OpView) -> str | None:
    for label, t in v.activations:
        if t.type_name not in EIGHT_BIT:
            return f"{UNSUPPORTED_TYPE}: {label} is {t.type_name}"
        if t.quantization is None or not t.quantization.scale.size:
            return f"{UNSUPPORTED_TYPE}: {label} is {t.type_name} without quantization"
    return None


def static_shapes(v: OpView) -> str | None:
    for label, t in v.activations:
        if t.shape_signature and -1 in t.shape_signature:
            return (f"{UNSPECIFIED_LIMITATION}: {label} has a dynamic shape "
                    f"{list(t.shape_signature)}; the Edge TPU needs static shapes")
    return None


def innermost_three(v: OpView) -> str | None:
    for label, t in v.activations:
        if len(t.shape) > 3 and any(d != 1 for d in t.shape[:-3]):
            return (f"{UNSPECIFIED_LIMITATION}: {label} has shape {_fmt(t.shape)}; only the "
                    f"innermost 3 dimensions may exceed 1 (batch size must be 1)")
    return None


GENERIC_CHECKS: tuple[Check, ...] = (eight_bit, static_shapes, innermost_three)


# -- per-operator checks ------------------------------------------------------


def constant_operands(*positions: int) -> Check:
    def check(v: OpView) -> str | None:
        for k in positions:
            t = v.input(k)
            if t is not None and not t.is_constant:
                return (f"{UNSPECIFIED_LIMITATION}: input {k} must be a compile-time constant "
                        f"(weights, biases and shape operands)")
        return None
    check.__name__ = f"constant_operands{positions}"
    return check


def same_dilation(v: OpView) -> str | None:
    w, h = v.options.get("dilation_w_factor", 1), v.options.get("dilation_h_factor", 1)
    if w != h:
        return f"{UNSPECIFIED_LIMITATION}: dilation differs in x ({w}) and y ({h})"
    return None


def fc_default_weights(v: OpView) -> str | None:
    if v.options.get("weights_format", 0) != 0:
        return f"{UNSPECIFIED_LIMITATION}: only the default weight format is supported"
    out = v.outputs[0]
    if sum(d != 1 for d in out.shape) > 1:
        return (f"{UNSPECIFIED_LIMITATION}: output shape {_fmt(out.shape)} is not 1-D "
                f"(FULLY_CONNECTED must produce a vector)")
    return None


def concat_constants(v: OpView) -> str | None:
    consts = [t for t in v.inputs if t.is_constant]
    if not consts:
        return None
    if len(v.inputs) != 2:
        return (f"{UNSPECIFIED_LIMITATION}: a constant input is only supported with exactly "
                f"2 inputs")
    data = consts[0].data
    if data is None:
        return f"{UNSPECIFIED_LIMITATION}: constant input is not a dense tensor"
    q = consts[0].quantization
    zp = int(q.zero_point[0]) if q is not None and q.zero_point.size else 0
    if np.any(data.astype(np.int64) != zp):
        return (f"{UNSPECIFIED_LIMITATION}: a constant input must be all zeros "
                f"(it acts as zero padding)")
    return None


def _axes(v: OpView, k: int, rank: int) -> list[int] | None:
    data = v.const(k)
    if data is None:
        return None
    # LiteRT reads an axis operand of any shape as a flat list of axes.
    return [int(a) % rank for a in np.asarray(data).reshape(-1)]


def not_on_batch(axis_input: int | None = None, option: str | None = None) -> Check:
    def check(v: OpView) -> str | None:
        rank = len(v.inputs[0].shape) if v.inputs else 0
        if option is not None:
            axes = [v.options.get(option, 0) % max(rank, 1)]
        else:
            axes = _axes(v, axis_input, max(rank, 1))
            if axes is None:
                return f"{UNSPECIFIED_LIMITATION}: the axis operand must be a constant"
        if rank >= 2 and 0 in axes:
            return f"{UNSPECIFIED_LIMITATION}: operates along the batch dimension"
        return None
    check.__name__ = "not_on_batch"
    return check


def mean_depth_multiple_of_4(v: OpView) -> str | None:
    rank = len(v.inputs[0].shape)
    axes = _axes(v, 1, max(rank, 1)) or []
    if rank and (rank - 1) in axes and v.inputs[0].shape[-1] % 4:
        return (f"{UNSPECIFIED_LIMITATION}: reducing over the innermost dimension needs it to "
                f"be a multiple of 4, got {v.inputs[0].shape[-1]}")
    return None


def pad_not_on_batch(v: OpView) -> str | None:
    pads = v.const(1)
    if pads is None:
        return f"{UNSPECIFIED_LIMITATION}: paddings must be a constant"
    if pads.ndim == 2 and pads.shape[0] >= 2 and np.any(pads[0] != 0):
        return f"{UNSPECIFIED_LIMITATION}: padding along the batch dimension"
    return None


def prelu_alpha(v: OpView) -> str | None:
    alpha = v.input(1)
    if alpha is None or not alpha.is_constant:
        return f"{UNSPECIFIED_LIMITATION}: alpha must be a constant"
    if sum(d != 1 for d in alpha.shape) > 1:
        return f"{UNSPECIFIED_LIMITATION}: alpha of shape {_fmt(alpha.shape)} is not 1-D"
    return None


def resize_precision(v: OpView) -> str | None:
    src, dst = v.inputs[0].shape, v.outputs[0].shape
    if len(src) != 4 or len(dst) != 4:
        return f"{UNSPECIFIED_LIMITATION}: resize needs 4-D (batch 1) input and output"
    align = bool(v.options.get("align_corners", False))
    for axis, (a, b) in (("height", (src[1], dst[1])), ("width", (src[2], dst[2]))):
        if a == b:
            continue
        if align:
            ok = a > 1 and b > 1 and (b - 1) % (a - 1) == 0
        else:
            ok = b % a == 0 if b > a else a % b == 0
        if not ok:
            return (f"{UNSPECIFIED_LIMITATION}: resizing {axis} {a} -> {b}"
                    f"{' with align_corners' if align else ''} has no exact integer ratio, so "
                    f"the Edge TPU would lose precision")
    return None


def softmax_vector(v: OpView) -> str | None:
    t = v.inputs[0]
    if sum(d != 1 for d in t.shape[:-1]):
        return f"{UNSPECIFIED_LIMITATION}: input {_fmt(t.shape)} is not 1-D"
    if t.shape and t.shape[-1] > SOFTMAX_MAX_ELEMENTS:
        return (f"{UNSPECIFIED_LIMITATION}: {t.shape[-1]} elements exceed the "
                f"{SOFTMAX_MAX_ELEMENTS} the Edge TPU softmax handles")
    return None


def unit_strides(v: OpView) -> str | None:
    strides = v.const(3)
    if strides is None or np.any(strides != 1):
        return f"{UNSPECIFIED_LIMITATION}: all strides must be constant 1"
    if v.options.get("ellipsis_mask", 0) or v.options.get("new_axis_mask", 0):
        return f"{UNSPECIFIED_LIMITATION}: ellipsis and new-axis masks must be 0"
    return None


def requantize_only(v: OpView) -> str | None:
    # QUANTIZE from float is the CPU's job at the graph edge; 8-bit -> 8-bit maps.
    if v.inputs and v.inputs[0].type_name not in EIGHT_BIT:
        return f"{UNSUPPORTED_TYPE}: input 0 is {v.inputs[0].type_name}"
    return None


def int8_only(v: OpView) -> str | None:
    for label, t in v.activations:
        if t.type_name != "INT8":
            return f"{UNSUPPORTED_TYPE}: {label} is {t.type_name}; {v.name} needs int8"
    return None


def lstm_types(v: OpView) -> str | None:
    # The LSTM carries 16-bit cell state; its input and output must be 8-bit.
    for label, t in (("input 0", v.inputs[0]), *((f"output {k}", t)
                                                  for k, t in enumerate(v.outputs))):
        if t.type_name not in EIGHT_BIT:
            return f"{UNSUPPORTED_TYPE}: {label} is {t.type_name}"
    return None


# -- why an operator the Edge TPU lacks stays on the CPU -----------------------
# (what a spec's ``tpu_refusal`` adds to "Operation not supported")


def batch_matmul_refusal(v: OpView) -> str:
    if all(not t.is_constant for t in v.inputs[:2]):
        return ("both operands are activations, and the Edge TPU multiplies activations only "
                "by constant weights (FULLY_CONNECTED, CONV_2D), so attention's products run "
                "on the CPU")
    return "the Edge TPU multiplies by constant weights in FULLY_CONNECTED and CONV_2D only"


def gelu_refusal(v: OpView) -> str:
    return ("the gelu rewrite (rewrites='auto') replaces it with I-GELU, an approximation "
            "built from operators the Edge TPU maps")


def table_lookup_refusal(v: OpView) -> str:
    return "table lookups run on the CPU; their output is an Edge TPU input"
