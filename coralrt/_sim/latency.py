"""Estimated latency of a segment on a real Coral USB Accelerator.

    t = invoke + n_ops * per_op
        + (input + output + instruction bytes) / usb_rate
        + sum over operators of MACs / (peak * efficiency[operator type])
        + streamed parameter bytes / usb_rate            (parameters beyond the 8 MiB cache)

and, once per loaded segment, the parameter upload (cached bytes / usb_rate).

Fixed figures: 4 TOPS peak = 2e12 multiply-accumulates per second (Coral's
data sheet); USB 3 bulk transfers at about 350 MB/s and USB 2 at about 35
MB/s in practice; about 2 KiB of instructions per operator sent with every
invocation (execution-only programs carry their instruction stream each run,
reference/edgetpu-stack.md section 2); 0.15 ms fixed cost per invocation and
5 us per operator.

Fitted figures: the convolution and depthwise efficiencies solve the two
published USB 3, max-clock latencies exactly (coral.ai/docs/edgetpu/benchmarks:
MobileNet v1 224 = 2.4 ms with 551.5 M convolution and 17.3 M depthwise MACs
in 31 operators; MobileNet v2 224 = 2.6 ms with 280.1 M and 20.7 M in 66
operators): convolutions run at about 40 % of peak, depthwise convolutions at
about 1.1 % (a 3x3 depthwise filter keeps little of the systolic array busy).
Everything else counts its elements at the depthwise rate.  Which operator is
which is its spec's ``latency_class`` (:mod:`coralrt._ops`).  These are
estimates for planning and for comparing placements, not measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from coralrt._compile.costs import macs_of
from coralrt._formats.memplan import EDGETPU_ONCHIP_BYTES
from coralrt._formats.segment import Segment
from coralrt._ops import operator_table

__all__ = ["USB_RATES", "LATENCY_CLASS_EFFICIENCY", "LatencyModel", "SegmentEstimate"]

USB_RATES = {"usb3": 350e6, "usb2": 35e6}

#: Fraction of peak by an operator spec's ``latency_class`` (coralrt._ops);
#: "other" is ``LatencyModel.other_efficiency``.
LATENCY_CLASS_EFFICIENCY = {"conv": 0.403, "depthwise": 0.0109}


@dataclass(frozen=True)
class SegmentEstimate:
    """Estimated seconds for one invocation of a loaded segment, by part."""

    compute: float
    transfer: float
    streamed: float
    overhead: float
    upload: float  # once, when the segment's parameters are first cached
    cached_bytes: int = 0  # parameter bytes held on chip

    @property
    def per_run(self) -> float:
        return self.compute + self.transfer + self.streamed + self.overhead


@dataclass(frozen=True)
class LatencyModel:
    usb: str = "usb3"
    peak_macs_per_second: float = 2e12
    efficiency: dict = field(default_factory=lambda: {
        name: LATENCY_CLASS_EFFICIENCY[cls]
        for name, cls in operator_table("latency_class").items() if cls != "other"})
    other_efficiency: float = 0.0109
    invoke_seconds: float = 0.15e-3
    per_op_seconds: float = 5e-6
    instruction_bytes_per_op: int = 2048
    onchip_bytes: int = EDGETPU_ONCHIP_BYTES

    @property
    def usb_rate(self) -> float:
        return USB_RATES[self.usb]

    def estimate(self, segment: Segment, *, cached_elsewhere: int = 0) -> SegmentEstimate:
        """``cached_elsewhere``: on-chip bytes other loaded segments already hold."""
        t = segment.tensors
        compute = 0.0
        for op in segment.ops:
            macs = macs_of(op.name, op.params,
                           [(t[i].shape, t[i].kind == "parameter") if i >= 0 else None
                            for i in op.inputs], [t[i].shape for i in op.outputs])
            eff = self.efficiency.get(op.name, self.other_efficiency)
            compute += macs / (self.peak_macs_per_second * eff)
        io = sum(t[i].nbytes for i in (*segment.inputs, *segment.outputs))
        instructions = self.instruction_bytes_per_op * len(segment.ops)
        params = int(segment.parameters.size)
        activations = segment.memory.activation_bytes if segment.memory else 0
        room = max(0, self.onchip_bytes - activations - cached_elsewhere)
        streamed = max(0, params - room)
        return SegmentEstimate(
            compute=compute,
            transfer=(io + instructions) / self.usb_rate,
            streamed=streamed / self.usb_rate,
            overhead=self.invoke_seconds + self.per_op_seconds * len(segment.ops),
            upload=(params - streamed) / self.usb_rate,
            cached_bytes=params - streamed,
        )

