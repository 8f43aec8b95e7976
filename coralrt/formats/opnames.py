"""The custom-operator names that carry Edge TPU programs inside a ``.tflite``.

One constant per name; every layer that needs one imports it from here.  This
module imports nothing, so the model layer (below ``formats``) may use it.
"""

from __future__ import annotations

__all__ = ["EDGETPU_OP", "SEGMENT_OP", "DEVICE_OPS"]

#: edgetpu_compiler's operator; its ``custom_options`` hold a DWN1 package.
EDGETPU_OP = "edgetpu-custom-op"
#: coralrt's native compiler's operator; its ``custom_options`` hold a segment.
SEGMENT_OP = "coralrt-segment"
#: Operators that run on an Edge TPU device rather than on the CPU.
DEVICE_OPS = (SEGMENT_OP, EDGETPU_OP)
