"""``coralrt partition MODEL``: which operators would run on the Edge TPU, and why not.

The summary follows edgetpu_compiler's log (operation counts, subgraphs,
parameter memory); the per-operator table gives each operator's status and
the reason it stayed on the CPU.
"""

from __future__ import annotations

from pathlib import Path

from coralrt.cli._text import dumps, size_str, table
from coralrt.compile.partition import MODES, PartitionPlan, partition, summary_lines
from coralrt.model import load_model
from coralrt.model.compiled import refuse_compiled

__all__ = ["add_parser", "command", "format_plan"]


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "partition", parents=parents, help="show which operators map to the Edge TPU",
        description="Decide which operators of a quantized model the Edge TPU can run and "
                    "print the reason for every operator that stays on the CPU. Nothing is "
                    "compiled or run.")
    p.add_argument("model", metavar="MODEL", help="path of a plain (not yet compiled) .tflite")
    p.add_argument("--mode", choices=MODES, default="multi",
                   help="compat: one Edge TPU segment, as edgetpu_compiler makes; multi "
                        "(default): every worthwhile supported region becomes a segment")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=command)


def command(args) -> int:
    model = load_model(Path(args.model))
    refuse_compiled(model, args.model)
    plan = partition(model, args.mode)
    print(dumps(plan.to_dict()) if args.json else format_plan(plan, args.model))
    return 0


def format_plan(plan: PartitionPlan, name: str) -> str:
    lines = [f"Partition of {name} (mode {plan.summary['mode']})",
             *summary_lines(plan.summary), ""]
    if plan.segments:
        rows = [[seg.index, len(seg.ops), f"{seg.macs:,}", size_str(seg.parameter_bytes),
                 len(seg.inputs), len(seg.outputs)] for seg in plan.segments]
        lines += ["segments", table(["#", "ops", "MACs", "parameters", "inputs", "outputs"],
                                    rows, right={0, 1, 2, 4, 5}), ""]
    rows = [[o.index, o.opcode, o.target, "" if o.segment is None else o.segment, o.reason]
            for o in plan.ops]
    lines += ["operators", table(["#", "operator", "target", "segment", "status"], rows,
                                 right={0})]
    return "\n".join(lines)
