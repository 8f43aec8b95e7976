"""The Edge TPU's layer-width rule (on-chip memory): the ``layer_width`` check of
CONV_2D and FULLY_CONNECTED, and the limits the ``split_wide`` and
``split_embedding`` rewrites cut layers to.

Apart from :mod:`coralrt._ops.checks` because it reads the specs (which
operators lie on the way to a GELU: ``gelu_path``), and the specs import the
checks.
"""

from __future__ import annotations

from coralrt._ops import operators_with
from coralrt._ops.checks import UNSPECIFIED_LIMITATION, OpView

__all__ = ["WIDTH_LIMIT", "WIDTH_LIMIT_GELU", "INPUT_WIDTH_LIMIT", "feeds_gelu", "width_limit",
           "layer_width"]

# The widest FULLY_CONNECTED (or 1x1 CONV_2D) layer edgetpu_compiler maps, found
# by binary search in the Transformers-on-Edge-TPU study
# (../shared/reference/transformers-on-edge-tpu.md): 5376 outputs with no
# activation or ReLU/sigmoid/tanh after it, 2728 when GELU (as I-GELU, whose
# larger graph needs more on-chip memory) follows.  Wider layers do not compile;
# the split_wide rewrite cuts them into equal parts.
WIDTH_LIMIT = 5376
WIDTH_LIMIT_GELU = 2728
# The widest Edge TPU input the study's embedding outputs passed as (BERT-Small
# and Medium, hidden 512, compiled; BERT-Base's 768 had to be split in two).
INPUT_WIDTH_LIMIT = 512


def feeds_gelu(sg, t: int, depth: int = 4) -> bool:
    """True if tensor ``t`` goes into a GELU: a GELU operator reads it, or a TANH
    is reached through at most ``depth`` element-wise or reshaping steps (the
    tanh form of GELU that converters emit, and the I-GELU the gelu rewrite
    builds).  The steps are the operators whose spec sets ``gelu_path``:
    element-wise arithmetic (the tanh form's and I-GELU's first operators) and
    pure shape changes (the RESHAPE fc_as_conv puts after the convolution)."""
    path = operators_with("gelu_path")
    frontier, seen = {t}, set()
    for _ in range(depth + 1):
        nxt = set()
        for op in sg.operators:
            if not frontier & set(op.inputs) or id(op) in seen:
                continue
            seen.add(id(op))
            if op.name in ("GELU", "TANH"):
                return True
            if op.name in path:
                nxt.update(op.outputs)
        if not nxt:
            return False
        frontier = nxt
    return False


def width_limit(sg, op) -> int:
    """The widest output the Edge TPU compiler maps for this layer."""
    return WIDTH_LIMIT_GELU if feeds_gelu(sg, op.outputs[0]) else WIDTH_LIMIT


def layer_width(v: OpView) -> str | None:
    """FULLY_CONNECTED and CONV_2D layers wider than the compiler's on-chip limit."""
    out = v.outputs[0]
    width = out.shape[-1] if out.shape else 1
    limit = width_limit(v.sg, v.op)
    if width > limit:
        after = "followed by GELU" if limit == WIDTH_LIMIT_GELU else \
            "with no activation or ReLU, sigmoid or tanh"
        return (f"{UNSPECIFIED_LIMITATION}: {width} outputs exceed the {limit} the Edge TPU "
                f"compiler fits on chip for a layer {after} (the split_wide rewrite "
                f"splits it)")
    return None
