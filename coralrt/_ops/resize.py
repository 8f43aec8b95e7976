"""Resizes: RESIZE_BILINEAR, RESIZE_NEAREST_NEIGHBOR.

Compat mode adds :func:`resize_output_extent`: edgetpu_compiler keeps resizes
to ``RESIZE_OUTPUT_EXTENT_LIMIT`` or more rows or columns on the CPU (the
final 33x33 -> 513x513 resize of the DeepLab pairs; an identity 33x33 ->
33x33 resize and 2x upsamplings to 12, 24 and 48 map; docs/partitioning.md).
"""

from __future__ import annotations

from coralrt._ops.checks import UNSPECIFIED_LIMITATION, OpView, constant_operands, \
    resize_precision
from coralrt._ops.spec import OpSpec, OpSupport

__all__ = ["RESIZE_OUTPUT_EXTENT_LIMIT", "resize_output_extent", "SPECS"]

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


SPECS = (
    OpSpec("RESIZE_BILINEAR", tpu=OpSupport(4, (constant_operands(1), resize_precision)),
           compat_checks=(resize_output_extent,),
           sim="coralrt._sim.kernels.resize:resize_bilinear"),
    OpSpec("RESIZE_NEAREST_NEIGHBOR",
           tpu=OpSupport(4, (constant_operands(1), resize_precision)),
           compat_checks=(resize_output_extent,),
           sim="coralrt._sim.kernels.resize:resize_nearest_neighbor"),
)
