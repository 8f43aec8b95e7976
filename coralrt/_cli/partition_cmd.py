"""``coralrt partition MODEL``: which operators would run on the Edge TPU, and why not.

The summary follows edgetpu_compiler's log (operation counts, subgraphs,
parameter memory); the per-operator table gives each operator's status and
the reason it stayed on the CPU.

``--html OUT.html`` / ``--svg OUT.svg`` also write a picture of the plan
(:mod:`coralrt._cli.partition_html`).  For its per-segment latency estimate
the segments are compiled in memory with the native compiler and their
programs handed to the simulator's latency model (nothing is cached or run).
"""

from __future__ import annotations

from pathlib import Path

import logging

from coralrt._cli._progress import Progress
from coralrt._cli._text import dumps, size_str, table
from coralrt._compile.partition import MODES, PartitionPlan, partition, summary_lines
from coralrt.errors import CoralRTError
from coralrt._fileio import atomic_write
from coralrt._model import load_model
from coralrt._model.compiled import refuse_compiled
from coralrt._model.types import Model
from coralrt._sim.latency import USB_RATES

log = logging.getLogger("coralrt.cli")

__all__ = ["add_parser", "beyond_compat", "command", "format_plan", "rewritten"]


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
    p.add_argument("--rewrites", metavar="SPEC", default=None,
                   help="graph rewrites before partitioning: exact (default in multi mode: "
                        "those that keep the integer results), auto (approximations too), "
                        "none (default in compat mode) or comma-separated names; see "
                        "docs/rewrites.md")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--html", metavar="OUT.html",
                   help="also write a self-contained HTML page: the operator graph coloured "
                        "by segment and CPU, each CPU operator's reason, and a table of the "
                        "segments with their estimated Coral USB Accelerator time")
    p.add_argument("--svg", metavar="OUT.svg", help="also write the same picture as an SVG file")
    p.add_argument("--usb", choices=sorted(USB_RATES), default="usb3",
                   help="USB speed the pictures' latency estimate assumes (default usb3)")
    p.set_defaults(func=command)


def command(args) -> int:
    model = load_model(Path(args.model))
    refuse_compiled(model, args.model)
    model, records = rewritten(model, args.mode, args.rewrites)
    plan = partition(model, args.mode)
    plan.rewrites = [r.to_dict() for r in records]
    if args.html or args.svg:
        _pictures(args, model, plan)
    beyond = beyond_compat(model, plan)
    if args.json:
        out = plan.to_dict()
        for seg in out["segments"]:
            seg["beyond_compat"] = beyond.get(seg["index"]) if beyond else None
        print(dumps(out))
    else:
        print(format_plan(plan, args.model, beyond))
    return 0


def beyond_compat(model: Model, plan: PartitionPlan) -> dict[int, int]:
    """Per segment of a multi-mode ``plan``, how many of its operators compat mode
    (edgetpu_compiler's rules, one Edge TPU subgraph) keeps on the CPU: what
    multi mode maps beyond what edgetpu_compiler would.  Empty in compat mode."""
    if plan.mode != "multi" or not plan.segments:
        return {}
    compat_tpu = set(partition(model, "compat").tpu_ops)
    return {s.index: sum(1 for i in s.ops if i not in compat_tpu) for s in plan.segments}


def rewritten(model: Model, mode: str, spec) -> tuple[Model, list]:
    """``model`` after the rewrites ``spec`` chooses (None: the mode's default), and
    the records of what they replaced."""
    from coralrt._compile.rewrite import run_rewrites, select_rewrites
    from coralrt.plugins._host import plugin_host
    host = plugin_host()
    if spec is None:
        spec = "none" if mode == "compat" else "exact"
    result = run_rewrites(model, select_rewrites(spec, host.rewrites.rewrites),
                          rules=host.ops.rules())
    return result.model, result.records


def _pictures(args, model: Model, plan: PartitionPlan) -> None:
    from coralrt._cli.partition_html import render_html, render_svg
    from coralrt.plugins._host import plugin_host

    estimates = segment_estimates(model, plan, usb=args.usb, progress=Progress.for_args(args))
    kernels = plugin_host().ops.kernels
    plugin_ops = {name: k.plugin for name, k in kernels.items() if not k.builtin}
    name = Path(args.model).name
    for path, render in ((args.html, render_html), (args.svg, render_svg)):
        if path:
            atomic_write(Path(path), render(model, plan, name, estimates=estimates,
                                            plugin_ops=plugin_ops).encode("utf-8"))
            log.info("wrote %s", path)


def segment_estimates(model: Model, plan: PartitionPlan, *, usb: str = "usb3",
                      progress: Progress | None = None) -> dict:
    """Per segment of ``plan``, the Coral USB Accelerator time coralrt's latency
    model estimates (``per_run_ms``, ``first_run_ms``), as the simulated stick
    estimates it: the segments compiled by the native compiler, loaded in order
    (each caches its parameters in what on-chip memory the ones before left)."""
    from coralrt._compile.segments import compile_model
    from coralrt._formats import segment_codec
    from coralrt._sim.latency import LatencyModel

    out: dict = {"usb": usb, "segments": {}, "note": None}
    if not plan.segments:
        return out
    progress = progress or Progress(disable=True)
    try:
        with progress.bar(total=plan.summary["tpu_ops"], desc="compiling Edge TPU segments",
                          unit="op") as bar:
            result = compile_model(model, mode=plan.mode, plan=plan,
                                   on_segment=lambda i, n, size, secs: bar.update(n))
            bar.finish()
    except CoralRTError as e:
        out["note"] = f"No estimate: the native compiler failed ({e})."
        return out
    latency, cached = LatencyModel(usb=usb), 0
    compiled = {tuple(sorted(s.ops)): blob for s, blob in zip(result.plan.segments,
                                                              result.segments)}
    for s in plan.segments:
        blob = compiled.get(tuple(sorted(s.ops)))
        if blob is None:
            out["note"] = ("The native compiler split or shrank a segment without an "
                           "estimate; 'coralrt compile' shows the segments it makes.")
            continue
        e = latency.estimate(segment_codec.decode(blob), cached_elsewhere=cached)
        cached += e.cached_bytes
        out["segments"][s.index] = {"per_run_ms": e.per_run * 1e3,
                                    "first_run_ms": (e.per_run + e.upload) * 1e3}
    return out


def format_plan(plan: PartitionPlan, name: str, beyond: dict[int, int] | None = None) -> str:
    """The text report; ``beyond`` (:func:`beyond_compat`) adds a column saying how
    many operators of each segment compat mode would keep on the CPU."""
    lines = [f"Partition of {name} (mode {plan.summary['mode']})",
             *summary_lines(plan.summary), ""]
    if plan.segments:
        head = ["#", "ops", "MACs", "parameters", "inputs", "outputs"]
        rows = [[seg.index, len(seg.ops), f"{seg.macs:,}", size_str(seg.parameter_bytes),
                 len(seg.inputs), len(seg.outputs)] for seg in plan.segments]
        if beyond:
            head.append("beyond compat")
            for row, seg in zip(rows, plan.segments):
                row.append(beyond.get(seg.index, 0))
        lines += ["segments", table(head, rows, right={0, 1, 2, 4, 5, 6}), ""]
        if beyond and any(beyond.values()):
            lines += ["(beyond compat: operators of the segment that compat mode, "
                      "edgetpu_compiler's rules with one Edge TPU subgraph, keeps on the "
                      "CPU; multi mode maps more than edgetpu_compiler by design)", ""]
    if plan.rewrites:
        lines += ["rewrites (operator numbers below are those of the rewritten model)",
                  *(f"  {r['line']}" for r in plan.rewrites), ""]
    rows = [[o.index, o.opcode, o.unit, "" if o.segment is None else o.segment, o.reason]
            for o in plan.ops]
    # The column keeps its documented heading "target" (docs/cli.md) for the unit.
    lines += ["operators", table(["#", "operator", "target", "segment", "status"], rows,
                                 right={0})]
    return "\n".join(lines)
