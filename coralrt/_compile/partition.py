"""Partition a model into Edge TPU segments and CPU operators, with reasons.

Two modes:

``compat`` reproduces edgetpu_compiler: one Edge TPU segment holding every
supported operator (the rules plus :mod:`coralrt._compile.compat_rules`') that can
run before the CPU takes over.  A supported
operator downstream of a CPU operator that itself follows TPU work stays on
the CPU ("More than one subgraph is not supported").  CPU operators that
only depend on the model inputs (a QUANTIZE from float at the input edge)
run before the segment and do not cut it.

``multi`` (the default for coralrt's own compilers) turns every maximal
connected region of supported operators into a segment, merges independent
regions that can run in the same invocation, drops segments whose estimated
gain does not pay for the USB round trip (:mod:`coralrt._compile.costs`), and
splits segments whose parameters overflow the 8 MiB on-chip cache.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from coralrt._compile.compat_rules import compat_rules
from coralrt._compile.costs import CostModel, op_macs
from coralrt.errors import ConfigError
from coralrt._compile.rules import MAPPED, SECOND_SUBGRAPH, OpView, RuleRegistry, default_rules
from coralrt._model.extract import boundary
from coralrt._model.types import Model, Subgraph

__all__ = ["MODES", "OpPlacement", "SegmentPlan", "PartitionPlan", "partition",
           "plan_from_groups", "summary_lines", "mib"]

MODES = ("compat", "multi")
NOT_WORTH = "Not offloaded: the estimated gain does not cover the USB round trip"


@dataclass
class OpPlacement:
    index: int
    opcode: str
    unit: str  # the processing unit that runs it: "tpu" | "cpu"
    segment: int | None
    reason: str

    def to_dict(self) -> dict:
        # The documented JSON (``coralrt partition --json``, docs/cli.md) names
        # the unit "target", as it always has: the key stays.
        return {"index": self.index, "opcode": self.opcode, "target": self.unit,
                "segment": self.segment, "reason": self.reason}


@dataclass
class SegmentPlan:
    index: int
    ops: list[int]
    inputs: list[int]   # tensor indices in the model's main subgraph
    outputs: list[int]
    macs: int
    parameter_bytes: int
    on_chip_bytes: int = 0
    off_chip_bytes: int = 0


@dataclass
class PartitionPlan:
    mode: str
    ops: list[OpPlacement]
    segments: list[SegmentPlan]
    summary: dict = field(default_factory=dict)
    # What the rewrite stage replaced before this plan was made (RewriteRecord
    # dicts; operator indices above are those of the rewritten model).
    rewrites: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"ops": [o.to_dict() for o in self.ops],
                "segments": [asdict(s) for s in self.segments], "summary": dict(self.summary),
                "rewrites": [dict(r) for r in self.rewrites]}

    @property
    def tpu_ops(self) -> list[int]:
        return [o.index for o in self.ops if o.unit == "tpu"]


def _producers(sg: Subgraph) -> dict[int, int]:
    return {t: i for i, op in enumerate(sg.operators) for t in op.outputs}


def _parameter_bytes(sg: Subgraph, ops) -> int:
    seen: dict[int, int] = {}
    for i in ops:
        for t in sg.operators[i].inputs:
            if t >= 0 and sg.tensors[t].is_constant:
                seen[t] = sg.tensors[t].buffer.nbytes
    return sum(seen.values())


def partition(model: Model, mode: str = "multi", *, rules: RuleRegistry | None = None,
              costs: CostModel | None = None) -> PartitionPlan:
    if mode not in MODES:
        raise ConfigError(f"unknown partition mode {mode!r}; choose one of {', '.join(MODES)}")
    rules = rules or default_rules()
    if mode == "compat":
        rules = compat_rules(rules)
    costs = costs or CostModel()
    sg = model.main
    reasons = [rules.check(OpView(sg, op, i)) for i, op in enumerate(sg.operators)]
    if mode == "compat":
        tpu = _compat(sg, reasons)
        groups = [sorted(tpu)] if tpu else []
    else:
        groups = _multi(sg, reasons, costs)
    groups = _split_oversized(sg, groups, costs.onchip_parameter_bytes) if mode == "multi" \
        else groups
    return _plan(model, mode, reasons, groups, costs)


def _compat(sg: Subgraph, reasons: list[str | None]) -> set[int]:
    prod = _producers(sg)
    tpu: set[int] = set()
    after_tpu: list[bool] = []      # has a TPU op among its ancestors
    blocked: list[bool] = []        # has a CPU op that follows TPU work among its ancestors
    for i, op in enumerate(sg.operators):
        parents = [prod[t] for t in op.inputs if t >= 0 and t in prod]
        after = any(p in tpu or after_tpu[p] for p in parents)
        block = any(blocked[p] or (p not in tpu and after_tpu[p]) for p in parents)
        if reasons[i] is None and not block:
            tpu.add(i)
        elif reasons[i] is None:
            reasons[i] = SECOND_SUBGRAPH
        after_tpu.append(after)
        blocked.append(block)
    return tpu


def _stages(sg: Subgraph, on_tpu: list[bool]) -> list[int]:
    # Stage numbers grow at every TPU<->CPU switch along any path, so a group
    # of TPU ops with one stage never needs a CPU result computed from itself.
    prod = _producers(sg)
    stage: list[int] = []
    for i, op in enumerate(sg.operators):
        s = 0
        for t in op.inputs:
            p = prod.get(t) if t >= 0 else None
            if p is not None:
                s = max(s, stage[p] + (on_tpu[p] != on_tpu[i]))
        stage.append(s)
    return stage


def _multi(sg: Subgraph, reasons: list[str | None], costs: CostModel) -> list[list[int]]:
    on_tpu = [r is None for r in reasons]
    while True:
        stage = _stages(sg, on_tpu)
        groups: dict[int, list[int]] = {}
        for i, s in enumerate(stage):
            if on_tpu[i]:
                groups.setdefault(s, []).append(i)
        dropped = False
        for ops in groups.values():
            ins, outs = boundary(sg, ops)
            io = sum(sg.tensors[t].nbytes for t in (*ins, *outs))
            macs = sum(op_macs(sg, sg.operators[i]) for i in ops)
            # A segment holding the whole model stays: the caller asked for the
            # Edge TPU and no CPU work would be saved by a round trip anyway.
            if len(ops) < len(sg.operators) and costs.benefit(macs, io) <= 0:
                for i in ops:
                    on_tpu[i] = False
                    reasons[i] = f"{NOT_WORTH} ({macs} MACs, {io} bytes across USB)"
                dropped = True
        if not dropped:
            return [groups[s] for s in sorted(groups)]


def _split_oversized(sg: Subgraph, groups: list[list[int]], budget: int) -> list[list[int]]:
    out = []
    for ops in groups:
        chunk: list[int] = []
        for i in ops:
            if chunk and _parameter_bytes(sg, [*chunk, i]) > budget:
                out.append(chunk)
                chunk = []
            chunk.append(i)
        out.append(chunk)
    return out


def _plan(model: Model, mode: str, reasons, groups: list[list[int]], costs: CostModel
          ) -> PartitionPlan:
    sg = model.main
    seg_of = {i: k for k, ops in enumerate(groups) for i in ops}
    placements = [
        OpPlacement(i, op.name, "tpu" if i in seg_of else "cpu", seg_of.get(i),
                    MAPPED if i in seg_of else (reasons[i] or SECOND_SUBGRAPH))
        for i, op in enumerate(sg.operators)
    ]
    segments = []
    remaining = costs.onchip_parameter_bytes
    for k, ops in enumerate(groups):
        ins, outs = boundary(sg, ops)
        params = _parameter_bytes(sg, ops)
        on_chip = min(params, remaining)
        remaining -= on_chip
        segments.append(SegmentPlan(k, ops, ins, outs,
                                    sum(op_macs(sg, sg.operators[i]) for i in ops),
                                    params, on_chip, params - on_chip))
    n_tpu = len(seg_of)
    summary = {
        "mode": mode, "total_ops": len(sg.operators), "tpu_ops": n_tpu,
        "cpu_ops": len(sg.operators) - n_tpu, "segments": len(segments),
        "on_chip_parameter_bytes": sum(s.on_chip_bytes for s in segments),
        "off_chip_parameter_bytes": sum(s.off_chip_bytes for s in segments),
    }
    return PartitionPlan(mode, placements, segments, summary)


def plan_from_groups(model: Model, plan: PartitionPlan, groups: list[list[int]],
                     costs: CostModel | None = None,
                     cpu_reasons: dict[int, str] | None = None) -> PartitionPlan:
    """``plan`` with its segments replaced by ``groups``; operators in
    ``cpu_reasons`` move to the CPU with that reason."""
    reasons = [None if o.unit == "tpu" else o.reason for o in plan.ops]
    for i, reason in (cpu_reasons or {}).items():
        reasons[i] = reason
    return _plan(model, plan.mode, reasons, groups, costs or CostModel())


def mib(n: int) -> str:
    return f"{n / (1024 * 1024):.2f}MiB"


def summary_lines(summary: dict, *, remaining: bool = False) -> list[str]:
    """The summary in edgetpu_compiler's log wording (``coralrt partition`` and
    ``coralrt compile`` print it)."""
    on_chip = summary["on_chip_parameter_bytes"]
    lines = [f"On-chip memory used for caching model parameters: {mib(on_chip)}"]
    if remaining:
        lines.append(f"On-chip memory remaining for caching model parameters: "
                     f"{mib(max(0, CostModel().onchip_parameter_bytes - on_chip))}")
    return lines + [
        f"Off-chip memory used for streaming uncached model parameters: "
        f"{mib(summary['off_chip_parameter_bytes'])}",
        f"Number of Edge TPU subgraphs: {summary['segments']}",
        f"Total number of operations: {summary['total_ops']}",
        f"Number of operations that will run on Edge TPU: {summary['tpu_ops']}",
        f"Number of operations that will run on CPU: {summary['cpu_ops']}",
    ]
