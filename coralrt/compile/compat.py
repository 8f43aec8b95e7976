"""Compat-mode rules: what edgetpu_compiler does beyond the published operator table.

:func:`compat_rules` extends a :class:`~coralrt.compile.rules.RuleRegistry`
with behaviour observed on plain/compiled model pairs (``docs/partitioning.md``
lists each rule with the pairs that support it).  Only compat mode applies
them: multi mode compiles for coralrt's simulated Edge TPU, whose kernels and
precision differ from the real compiler's choices, so these observations are
not rules of its own.

- TILE maps, under the checks every operator gets (the image-pooling branch
  of DeepLab with a MobileNet EdgeTPU backbone tiles a 1x1 feature map to
  33x33 on the Edge TPU).
- RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR that change a spatial size stay on
  the CPU when that output height or width is ``RESIZE_OUTPUT_EXTENT_LIMIT`` or
  more (the final 33x33 -> 513x513 resize of the DeepLab pairs; an identity
  33x33 -> 33x33 resize and 2x upsamplings to 12, 24 and 48 map).
"""

from __future__ import annotations

from dataclasses import replace

from coralrt.compile.rules import UNSPECIFIED_LIMITATION, OpSupport, OpView, RuleRegistry

__all__ = ["RESIZE_OUTPUT_EXTENT_LIMIT", "COMPAT_OPS", "COMPAT_CHECKS", "compat_rules",
           "resize_output_extent"]

# Smallest resized output height/width that stays on the CPU.  The compiled
# pairs bound it to (48, 513]; public compiler reports narrow it to (128, 256]
# (a 2x bilinear upsampling to 128x128 maps, one to 512x512 does not; a U-Net
# whose last resize outputs 256x256 does not map whole).  256 is the upper end
# of that window.
RESIZE_OUTPUT_EXTENT_LIMIT = 256


def resize_output_extent(v: OpView) -> str | None:
    src, dst = v.inputs[0].shape, v.outputs[0].shape
    if len(src) != 4 or len(dst) != 4:
        return None  # the table's rule reports the rank
    for axis, a, b in (("height", src[1], dst[1]), ("width", src[2], dst[2])):
        if a != b and b >= RESIZE_OUTPUT_EXTENT_LIMIT:
            return (f"{UNSPECIFIED_LIMITATION}: resizing {axis} {a} -> {b}; edgetpu_compiler "
                    f"keeps resizes to {RESIZE_OUTPUT_EXTENT_LIMIT} or more rows or columns "
                    f"on the CPU")
    return None


# Operators edgetpu_compiler maps that the published table does not list.
# TILE: version 1 for uint8; TFLite's converter emits version 3 for int8.  The
# generic checks already keep the multiples constant (a non-constant operand
# must be 8-bit; multiples are int32) and the batch untiled (batch size 1).
COMPAT_OPS: dict[str, OpSupport] = {
    "TILE": OpSupport(max_version=3),
}
# Checks added to operators the table already has.
COMPAT_CHECKS = {
    "RESIZE_BILINEAR": (resize_output_extent,),
    "RESIZE_NEAREST_NEIGHBOR": (resize_output_extent,),
}


def compat_rules(base: RuleRegistry) -> RuleRegistry:
    """A copy of ``base`` with the compat-mode operators and checks.

    An operator of :data:`COMPAT_OPS` that ``base`` already has (from a
    plugin) keeps that rule; the checks are added to whatever rule ``base``
    has for their operator.
    """
    rules = base.copy()
    for name, support in COMPAT_OPS.items():
        if name not in rules:
            rules.add_op(name, replace(support))
    for name, checks in COMPAT_CHECKS.items():
        if name in rules:
            for check in checks:
                rules.add_check(name, check)
    return rules
