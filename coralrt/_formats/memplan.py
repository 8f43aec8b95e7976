"""On-chip memory plan of a native Edge TPU segment.

The Edge TPU has 8 MiB of on-chip memory shared by activations and cached
parameters (``reference/edgetpu-stack.md`` §2.4, §4.3).  Activations must fit;
parameters fill what the activation peak leaves and the rest is streamed from
the host on every inference, which is what the cost model charges for.

Activations (every tensor that is not a parameter, segment inputs and outputs
included) get 64-byte aligned offsets by greedy first-fit over their
lifetimes: a tensor lives from the operator that writes it (operator 0 for
segment inputs) to the last operator that reads it (the last operator for
segment outputs).  Tensors are placed largest first, as TFLite's arena
planner does, each at the lowest aligned offset that does not collide with an
already placed tensor whose lifetime overlaps.  An operator's inputs and
outputs are live at the same time, so no operator works in place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from coralrt.errors import SegmentFormatError, SegmentTooLargeError

if TYPE_CHECKING:
    from coralrt._formats.segment import Segment

__all__ = [
    "EDGETPU_ONCHIP_BYTES", "ACTIVATION_ALIGNMENT", "WEIGHT_ALIGNMENT", "SMALL_PARAMETER_ALIGNMENT",
    "ActivationSlot", "MemoryPlan", "lifetimes", "plan_memory", "split_parameters", "check_plan",
]

EDGETPU_ONCHIP_BYTES = 8 * 1024 * 1024
ACTIVATION_ALIGNMENT = 64
WEIGHT_ALIGNMENT = 64            # parameters of rank >= 2 (weights)
SMALL_PARAMETER_ALIGNMENT = 4    # parameters of rank <= 1 (biases, scalars, shapes)


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


@dataclass(frozen=True)
class ActivationSlot:
    """Where one activation tensor lives in on-chip memory, and when."""

    tensor: int
    first_op: int
    last_op: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class MemoryPlan:
    activation_bytes: int            # peak: max(offset + nbytes) over all slots
    parameter_bytes: int             # size of the parameter section, padding included
    on_chip_parameter_bytes: int     # cached on chip: min(parameters, on_chip - activations)
    off_chip_parameter_bytes: int    # streamed from the host on every inference
    on_chip_bytes: int = EDGETPU_ONCHIP_BYTES
    slots: tuple[ActivationSlot, ...] = ()


def split_parameters(parameter_bytes: int, activation_bytes: int,
                     on_chip_bytes: int = EDGETPU_ONCHIP_BYTES) -> tuple[int, int]:
    """(on-chip, off-chip) parameter bytes once activations have taken their share."""
    on_chip = max(0, min(parameter_bytes, on_chip_bytes - activation_bytes))
    return on_chip, parameter_bytes - on_chip


def lifetimes(segment: Segment) -> dict[int, tuple[int, int]]:
    """(first op, last op) of every non-parameter tensor, checking the dataflow.

    Raises SegmentFormatError when an operator writes a parameter, a segment
    input or a variable, two operators write the same tensor, a tensor is read
    before it is written, an output is never produced, or an activation is
    never used.
    """
    n_ops = len(segment.ops)
    inputs, outputs = set(segment.inputs), set(segment.outputs)
    is_param = [t.kind == "parameter" for t in segment.tensors]
    # Variable tensors (LSTM state) keep their value between inferences, so they
    # live through the whole segment and no other tensor ever shares their bytes.
    variables = {t.id for t in segment.tensors if t.variable}
    first: dict[int, int] = dict.fromkeys((*inputs, *variables), 0)
    last: dict[int, int] = {t: 0 for t in inputs}
    last.update(dict.fromkeys(variables, max(n_ops - 1, 0)))
    for i, op in enumerate(segment.ops):
        where = f"operator {i} ({op.name})"
        for t in op.inputs:
            if t < 0 or is_param[t]:
                continue
            if t not in first:
                raise SegmentFormatError(f"reads tensor {t} before any operator writes it",
                                         where=where)
            last[t] = max(last[t], i)
        for t in (*op.outputs, *op.intermediates):
            if is_param[t] or t in inputs or t in variables:
                kind = ("a parameter" if is_param[t] else "a segment input" if t in inputs
                        else "a variable")
                raise SegmentFormatError(f"writes tensor {t}, which is {kind}", where=where)
            if t in first:
                raise SegmentFormatError(f"writes tensor {t}, which operator {first[t]} "
                                         f"already writes", where=where)
            first[t] = last[t] = i
    for t in outputs:
        if t not in first:
            raise SegmentFormatError(f"segment output {t} is neither a segment input nor "
                                     f"written by any operator")
        last[t] = max(n_ops - 1, 0)
    unused = [t for t, p in enumerate(is_param) if not p and t not in first]
    if unused:
        raise SegmentFormatError(f"activation tensors {unused[:8]} are used by no operator "
                                 f"and are not segment inputs or outputs")
    return {t: (first[t], last[t]) for t in sorted(first)}


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def plan_memory(segment: Segment, *, on_chip_bytes: int = EDGETPU_ONCHIP_BYTES) -> MemoryPlan:
    """Place every activation; sets ``tensor.offset`` and ``segment.memory``.

    Raises SegmentTooLargeError when the activation peak exceeds ``on_chip_bytes``.
    """
    life = lifetimes(segment)
    order = sorted(life, key=lambda t: (-segment.tensors[t].nbytes, life[t][0], t))
    placed: list[tuple[int, int, int]] = []   # (offset, end, tensor)
    offsets: dict[int, int] = {}
    for t in order:
        size = segment.tensors[t].nbytes
        offset = 0
        if size:
            busy = sorted((o, e) for o, e, u in placed if _overlaps(life[t], life[u]))
            for o, e in busy:
                if offset + size <= o:
                    break
                offset = max(offset, align_up(e, ACTIVATION_ALIGNMENT))
            placed.append((offset, offset + size, t))
        offsets[t] = offset
    peak = max((e for _, e, _ in placed), default=0)
    if peak > on_chip_bytes:
        raise SegmentTooLargeError(peak, on_chip_bytes, where=f"segment {segment.name!r}")
    slots = []
    for t, (first, last) in life.items():
        segment.tensors[t].offset = offsets[t]
        slots.append(ActivationSlot(t, first, last, offsets[t], segment.tensors[t].nbytes))
    param_bytes = len(segment.parameters)
    on_chip, off_chip = split_parameters(param_bytes, peak, on_chip_bytes)
    plan = MemoryPlan(peak, param_bytes, on_chip, off_chip, on_chip_bytes, tuple(slots))
    segment.memory = plan
    return plan


def check_plan(segment: Segment) -> None:
    """Raise SegmentFormatError unless ``segment.memory`` is a valid plan for the segment."""
    plan = segment.memory
    life = lifetimes(segment)
    placed = [s.tensor for s in plan.slots]
    if placed != list(life):
        raise SegmentFormatError(f"the plan places tensors {placed[:8]}... but the activations, "
                                 f"in id order, are {list(life)[:8]}...", where="memory plan")
    for s in plan.slots:
        t = segment.tensors[s.tensor]
        where = f"memory plan, tensor {s.tensor}"
        if (s.first_op, s.last_op) != life[s.tensor]:
            raise SegmentFormatError(f"lifetime {s.first_op}..{s.last_op} differs from the "
                                     f"operators' {life[s.tensor][0]}..{life[s.tensor][1]}",
                                     where=where)
        if s.offset < 0 or s.offset % ACTIVATION_ALIGNMENT:
            raise SegmentFormatError(f"offset {s.offset} is not a {ACTIVATION_ALIGNMENT}-byte "
                                     f"aligned offset", where=where)
        if (s.offset, s.nbytes) != (t.offset, t.nbytes):
            raise SegmentFormatError(f"slot {s.offset}+{s.nbytes} differs from the tensor's "
                                     f"{t.offset}+{t.nbytes}", where=where)
        if s.offset + s.nbytes > plan.activation_bytes:
            raise SegmentFormatError(f"slot {s.offset}+{s.nbytes} ends past the activation "
                                     f"peak {plan.activation_bytes}", where=where)
    peak = max((s.offset + s.nbytes for s in plan.slots if s.nbytes), default=0)
    if plan.activation_bytes != peak:
        raise SegmentFormatError(f"activation peak {plan.activation_bytes} differs from the "
                                 f"slots' end {peak}", where="memory plan")
    if plan.activation_bytes > plan.on_chip_bytes:
        raise SegmentFormatError(f"activation peak {plan.activation_bytes} exceeds the "
                                 f"on-chip memory {plan.on_chip_bytes}", where="memory plan")
    expected = (len(segment.parameters),
                *split_parameters(len(segment.parameters), peak, plan.on_chip_bytes))
    got = (plan.parameter_bytes, plan.on_chip_parameter_bytes, plan.off_chip_parameter_bytes)
    if got != expected:
        raise SegmentFormatError(f"parameter bytes total/on-chip/off-chip {got} should be "
                                 f"{expected}", where="memory plan")
    # Sweep in lifetime order so each slot is compared only with those still live.
    live: list[ActivationSlot] = []
    for s in sorted((s for s in plan.slots if s.nbytes), key=lambda s: (s.first_op, s.tensor)):
        live = [u for u in live if u.last_op >= s.first_op]
        for u in live:
            start, end = max(s.offset, u.offset), min(s.offset + s.nbytes, u.offset + u.nbytes)
            if start < end:
                raise SegmentFormatError(f"tensors {u.tensor} and {s.tensor} are live at the "
                                         f"same time but share bytes {start}..{end}",
                                         where="memory plan")
        live.append(s)
