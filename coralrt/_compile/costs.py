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

from coralrt._formats.memplan import EDGETPU_ONCHIP_BYTES
from coralrt._model.types import Operator, Subgraph
from coralrt._ops import operator_table

__all__ = ["CostModel", "macs_of", "op_macs", "ONCHIP_PARAMETER_BYTES"]

ONCHIP_PARAMETER_BYTES = EDGETPU_ONCHIP_BYTES


def macs_of(name: str, options: dict, inputs: list, outputs: list) -> int:
    """Multiply-accumulates of one operator: its spec's ``macs`` formula
    (:mod:`coralrt._ops`), or for operators without one (or when the formula
    cannot tell, e.g. a weight operand of another rank), elementwise work: one
    per element of the largest non-constant input or of the outputs.

    ``inputs``: per input ``(shape, is_constant)`` or None when omitted;
    ``outputs``: output shapes.
    """
    formula = _formulas().get(name)
    macs = formula(options, inputs, outputs) if formula is not None else None
    if macs is not None:
        return macs
    out_elems = sum(math.prod(s) for s in outputs)
    act = [math.prod(x[0]) for x in inputs if x is not None and not x[1]]
    return max(out_elems, max(act, default=0))


def _formulas() -> dict:
    return operator_table("macs")


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
