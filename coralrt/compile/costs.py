"""Cost and memory model used by the partitioner.

All figures are estimates with their source noted; the partitioner uses them
to compare placements, never to promise a latency.

- Edge TPU: 4 TOPS peak (2 tera multiply-accumulates per second), 8 MiB of
  on-chip memory that caches parameters (coral.ai/docs/edgetpu/benchmarks and
  the Edge TPU data sheet; see reference/edgetpu-stack.md section 2.4).
- A TPU<->CPU transition (one delegate invocation) costs about 0.1 ms on a USB
  stick; boundary tensors cross USB 3 at about 320 MB/s in practice.
- The CPU fallback is a Raspberry Pi 4-class core running 8-bit XNNPACK
  kernels: about 4 GMAC/s (MobileNet v2, 300 M MACs, takes ~75 ms there).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coralrt.formats.memplan import EDGETPU_ONCHIP_BYTES
from coralrt.model.types import Operator, Subgraph

__all__ = ["CostModel", "macs_of", "op_macs", "ONCHIP_PARAMETER_BYTES"]

ONCHIP_PARAMETER_BYTES = EDGETPU_ONCHIP_BYTES


def macs_of(name: str, options: dict, inputs: list, outputs: list) -> int:
    """Multiply-accumulates of one operator (elementwise work counts 1 per element).

    ``inputs``: per input ``(shape, is_constant)`` or None when omitted;
    ``outputs``: output shapes.
    """
    out_elems = sum(math.prod(s) for s in outputs)
    w = inputs[1][0] if len(inputs) > 1 and inputs[1] is not None else None
    if name == "CONV_2D" and w is not None and len(w) == 4:
        return out_elems * w[1] * w[2] * w[3]
    if name == "DEPTHWISE_CONV_2D" and w is not None and len(w) == 4:
        return out_elems * w[1] * w[2]
    if name == "TRANSPOSE_CONV" and w is not None and len(w) == 4 and inputs[2] is not None:
        return math.prod(inputs[2][0]) * w[0] * w[1] * w[2]
    if name == "FULLY_CONNECTED" and w is not None and len(w) == 2:
        return out_elems * w[1]
    if name in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        return out_elems * options.get("filter_width", 1) * options.get("filter_height", 1)
    if name == "UNIDIRECTIONAL_SEQUENCE_LSTM" and w is not None and len(w) == 2 and outputs:
        steps = math.prod(outputs[0][:-1])
        return steps * 4 * w[0] * (w[1] + w[0])
    act = [math.prod(x[0]) for x in inputs if x is not None and not x[1]]
    return max(out_elems, max(act, default=0))


def op_macs(sg: Subgraph, op: Operator) -> int:
    """:func:`macs_of` for an operator of a model subgraph."""
    t = sg.tensors
    return macs_of(op.name, op.options,
                   [(t[i].shape, t[i].is_constant) if i >= 0 else None for i in op.inputs],
                   [t[i].shape for i in op.outputs])


@dataclass(frozen=True)
class CostModel:
    tpu_macs_per_second: float = 2e12 * 0.25  # peak x typical utilisation
    cpu_macs_per_second: float = 4e9
    transition_seconds: float = 1e-4
    usb_bytes_per_second: float = 320e6
    onchip_parameter_bytes: int = ONCHIP_PARAMETER_BYTES

    def cpu_seconds(self, macs: int) -> float:
        return macs / self.cpu_macs_per_second

    def tpu_seconds(self, macs: int, boundary_bytes: int, offchip_bytes: int = 0) -> float:
        return (macs / self.tpu_macs_per_second + self.transition_seconds
                + (boundary_bytes + offchip_bytes) / self.usb_bytes_per_second)

    def benefit(self, macs: int, boundary_bytes: int, offchip_bytes: int = 0) -> float:
        """Seconds saved by running this work on the TPU instead of the CPU."""
        return self.cpu_seconds(macs) - self.tpu_seconds(macs, boundary_bytes, offchip_bytes)
