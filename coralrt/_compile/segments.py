"""The segment loop: a plain model -> a compiled ``.tflite``.

Each TPU segment of the partition is cut out as a standalone model, handed
to a segment compiler (coralrt's native compiler, :mod:`coralrt._compile.native`,
by default) and put back as one CUSTOM operator carrying the compiled program
in its ``custom_options``.  CPU operators stay as they were, so the compiled
model is a valid ``.tflite`` that LiteRT loads (it only fails on the custom
op, which the coralrt executor runs).

``compile_model`` drives any segment compiler through the contract of
:class:`coralrt._compile.base.Compiler` (an object that only has its
attributes is wrapped by :func:`~coralrt._compile.base.as_compiler`): the
segment operator's custom code is the compiler's ``op_name``
(``edgetpu-custom-op`` for :mod:`coralrt._compile.edgetpu_compiler`), and
when a compiler leaves operators of a segment on the CPU
(:class:`~coralrt.errors.SegmentNotMapped`) they move to the CPU with the
compiler's reasons and the rest of the segment is cut into convex groups and
compiled again, up to ``max_compiles`` compiler runs.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from coralrt._compile.base import Compiler, as_compiler
from coralrt._compile.native import NativeCompiler
from coralrt._compile.partition import (
    PartitionPlan, mib, partition, plan_from_groups, summary_lines,
)
from coralrt._compile.rules import UNSPECIFIED_LIMITATION
from coralrt.errors import ModelError, SegmentNotMapped, SegmentTooLargeError
from coralrt._model.compiled import (
    AlreadyCompiled, compiled_by, operator_origin, with_operator_origin,
)
from coralrt._model.extract import extract
from coralrt._model.types import CUSTOM, Model, Operator, OperatorCode, Subgraph

__all__ = ["CompileResult", "compile_model", "compile_log"]

log = logging.getLogger("coralrt.compile")

OUT_OF_BUDGET = (f"{UNSPECIFIED_LIMITATION}: the compiler did not map its segment whole and "
                 f"the budget of compiler runs for re-splitting is spent")


@dataclass
class CompileResult:
    model: Model                     # the compiled model
    plan: PartitionPlan
    segments: list[bytes] = field(default_factory=list)
    seconds: float = 0.0
    compiler: str = ""
    # Per operator of the compiled model: the index of the operator it is in the
    # model as the user gave it (None for a segment's operator, which stands
    # for several); recorded in the compiled model's metadata too.
    origin: list[int | None] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        return self.model.to_bytes()


def _remapped(sig, remap: dict[int, int]):
    """A signature of subgraph 0 with its tensors renumbered as the compiled model's."""
    def one(kind: str, tensors: dict[str, int]) -> dict[str, int]:
        out = {}
        for name, t in tensors.items():
            if t not in remap:
                # A tensor inside an Edge TPU segment has no place in the
                # compiled model, so the signature cannot name it.
                raise ModelError(f"signature {sig.key!r}: {kind} {name!r} (tensor {t}) is "
                                 f"neither an input nor an output of the model's main "
                                 f"subgraph, and does not survive compilation")
            out[name] = remap[t]
        return out
    return dataclasses.replace(sig, inputs=one("input", sig.inputs),
                               outputs=one("output", sig.outputs))


def compile_model(model: Model, *, mode: str = "multi", compiler: Compiler | None = None,
                  plan: PartitionPlan | None = None, rules=None, on_plan=None,
                  on_segment=None, max_compiles: int | None = None,
                  origin: list[int | None] | None = None) -> CompileResult:
    """Partition ``model`` and compile every TPU segment into a compiled model.

    ``max_compiles`` bounds the compiler runs spent on the pieces of segments
    the compiler did not map whole (default 32), beyond one run per planned
    segment; pieces left when it is spent stay on the CPU.

    Progress, for callers that show it (this function never prints):
    ``on_plan(plan)`` is called once with the partition before the first
    compiler run (``plan.summary["tpu_ops"]`` operators in
    ``len(plan.segments)`` segments are to be compiled), ``on_segment(index,
    operators, size, seconds)`` after each segment compiled.  A segment the
    compiler does not map whole is compiled again in pieces, so the segments
    reported may be more, and their operators fewer, than planned.

    ``origin``: per operator of ``model``, its index in the model the user gave
    (when rewrites made ``model``); the compiled model records, per operator,
    that index (:data:`coralrt._model.compiled.ORIGIN_METADATA`), so that a
    message about one of its CPU operators names it as the user knows it.
    """
    # A coralrt-compiled model passes (its segments stay as they are, for
    # target='sim'); the CLI's compile and partition refuse both kinds.
    if compiled_by(model) == "edgetpu_compiler":
        raise AlreadyCompiled(model)
    start = time.perf_counter()
    compiler = as_compiler(compiler or NativeCompiler())
    plan = plan or partition(model, mode, rules=rules)
    if on_plan is not None:
        on_plan(plan)
    sg = model.main
    groups, blobs = [], []
    cpu_reasons: dict[int, str] = {}
    # (operators, counts against the budget): planned segments and halves of
    # oversized ones are free; pieces of segments the compiler did not map are not.
    todo = [(sorted(s.ops), False) for s in plan.segments]
    budget = 32 if max_compiles is None else max_compiles
    while todo:
        ops, costs = todo.pop(0)
        t0 = time.perf_counter()
        if costs and budget <= 0:
            cpu_reasons.update(dict.fromkeys(ops, OUT_OF_BUDGET))
            continue
        budget -= costs
        try:
            blob = compiler.compile_segment(extract(model, ops).model)
        except SegmentNotMapped as e:
            todo[:0] = [(g, True) for g in _not_mapped(sg, ops, e, cpu_reasons, budget <= 0)]
            continue
        except SegmentTooLargeError as e:
            if len(ops) < 2:
                # One operator whose tensors alone overflow the chip stays on the CPU.
                cpu_reasons[ops[0]] = (f"{UNSPECIFIED_LIMITATION}: its tensors need "
                                       f"{e.required_bytes} bytes, more than the Edge TPU's "
                                       f"{e.limit_bytes} bytes of on-chip memory")
                continue
            # Activations overflow on-chip memory: cut the segment in execution
            # order (a prefix of a convex segment is convex) and try each half.
            log.info("segment of %d operators needs %d bytes of activations; splitting",
                     len(ops), e.required_bytes)
            todo[:0] = [(ops[:len(ops) // 2], costs), (ops[len(ops) // 2:], costs)]
            continue
        groups.append(ops)
        blobs.append(blob)
        if on_segment is not None:
            on_segment(len(groups) - 1, len(ops), len(blob), time.perf_counter() - t0)
        log.debug("segment %d: %d operators, %d bytes, %.1f ms", len(groups) - 1, len(ops),
                  len(blob), 1e3 * (time.perf_counter() - t0))
    if groups != [sorted(s.ops) for s in plan.segments] or cpu_reasons:
        plan = plan_from_groups(model, plan, groups, cpu_reasons=cpu_reasons)
    plan = _with_reports(plan, blobs)
    compiled, origin = _assembled(model, plan, blobs, compiler.op_name, origin)
    seconds = time.perf_counter() - start
    return CompileResult(compiled, plan, blobs, seconds, f"{compiler.id} {compiler.version}",
                         origin)


def _assembled(model: Model, plan: PartitionPlan, blobs: list, op_name: str,
               origin: list[int | None] | None) -> tuple[Model, list[int | None]]:
    """The compiled model: each segment of ``plan`` replaced by one ``op_name``
    operator holding its program, in a topological order; and, per operator of
    it, its index in the user's model (None for a segment)."""
    sg = model.main
    code = OperatorCode(CUSTOM, op_name, 1)
    nodes: dict[int, Operator] = {}  # first op index of a node -> the operator that replaces it
    seg_of = {i: s for s in plan.segments for i in s.ops}
    for i, op in enumerate(sg.operators):
        s = seg_of.get(i)
        if s is None:
            nodes[i] = op
        elif i == s.ops[0]:
            ins, outs = _segment_io(sg, s, blobs[s.index])
            nodes[i] = Operator(code, ins, outs, custom_options=bytes(blobs[s.index]))
    keys = _topological(sg, nodes, seg_of)
    ordered = [nodes[k] for k in keys]
    given = origin if origin is not None else operator_origin(model)
    origin = [None if k in seg_of else (k if given is None else
                                         given[k] if k < len(given) else None)
              for k in keys]
    main, remap = _prune(Subgraph(sg.tensors, ordered, list(sg.inputs), list(sg.outputs),
                                  sg.name))
    signatures = [_remapped(sig, remap) if sig.subgraph_index == 0 else sig
                  for sig in model.signatures]
    compiled = Model(subgraphs=[main, *model.subgraphs[1:]], description=model.description,
                     version=model.version,
                     metadata=with_operator_origin(list(model.metadata), origin),
                     signatures=signatures)
    return compiled, origin


def _not_mapped(sg: Subgraph, ops: list[int], e: SegmentNotMapped, cpu_reasons: dict,
                out_of_budget: bool) -> list[list[int]]:
    """The groups to compile next after the compiler did not map ``ops`` whole.

    The operators it left on the CPU move there with its reasons (piece-local
    indices: ``ops`` is sorted, as in the extracted piece); the rest are cut
    into convex groups.  Mapped but as several programs (no CPU operators):
    the segment is cut in two halves in execution order.
    """
    moved = [ops[k] for k in e.cpu_ops if 0 <= k < len(ops)]
    for k in e.cpu_ops:
        if 0 <= k < len(ops):
            cpu_reasons[ops[k]] = e.reasons.get(k) or UNSPECIFIED_LIMITATION
    gone = set(moved)
    rest = [i for i in ops if i not in gone]
    if not moved and len(ops) > 1 and not out_of_budget:
        return [ops[:len(ops) // 2], ops[len(ops) // 2:]]
    if rest and (out_of_budget or not moved):
        for i in rest:
            cpu_reasons[i] = OUT_OF_BUDGET
        return []
    if not rest:
        log.info("the compiler mapped none of the %d operators of a segment; they stay on "
                 "the CPU", len(ops))
        return []
    groups = _convex_groups(sg, rest)
    log.info("the compiler left %d of %d operators of a segment on the CPU; compiling the "
             "remaining %d as %d segment(s)", len(moved), len(ops), len(rest), len(groups))
    return groups


def _convex_groups(sg: Subgraph, ops: list[int]) -> list[list[int]]:
    # Stage numbers grow whenever a path enters or leaves ``ops``, so the
    # operators of one stage never need a result computed outside from them.
    inside = set(ops)
    producer = {t: i for i, op in enumerate(sg.operators) for t in op.outputs}
    stage: dict[int, int] = {}
    for i, op in enumerate(sg.operators):
        s = 0
        for t in op.inputs:
            p = producer.get(t) if t >= 0 else None
            if p is not None:
                s = max(s, stage[p] + ((p in inside) != (i in inside)))
        stage[i] = s
    groups: dict[int, list[int]] = {}
    for i in sorted(inside):
        groups.setdefault(stage[i], []).append(i)
    return [groups[s] for s in sorted(groups)]


def _segment_io(sg: Subgraph, s, blob) -> tuple[list[int], list[int]]:
    """The segment operator's tensors: the plan's, or the compiled program's own
    order (its layers bind to the operator's tensors by position)."""
    in_names = getattr(blob, "input_names", None)
    out_names = getattr(blob, "output_names", None)
    if not in_names and not out_names:
        return list(s.inputs), list(s.outputs)
    local: dict[str, int] = {}
    for t in (*s.inputs, *s.outputs):
        local.setdefault(sg.tensors[t].name, t)
    for i in s.ops:
        for t in sg.operators[i].tensor_indices():
            if t >= 0:
                local.setdefault(sg.tensors[t].name, t)
    try:
        ins = [local[n] for n in in_names]
        outs = [local[n] for n in out_names]
    except KeyError as e:
        raise ModelError(f"the compiled segment {s.index} names tensor {e.args[0]!r}, which "
                         f"its operators do not use") from None
    missing = [sg.tensors[t].name for t in s.outputs if t not in outs]
    if missing:
        raise ModelError(f"the compiled segment {s.index} does not produce {missing[:4]}, "
                         f"which the rest of the model reads")
    return ins, outs


def _with_reports(plan: PartitionPlan, blobs) -> PartitionPlan:
    """``plan`` with the on-/off-chip parameter sizes the compiler's log reports."""
    reports = [getattr(b, "report", None) or {} for b in blobs]
    if not any(r.get("on_chip_bytes") is not None for r in reports):
        return plan
    segments = []
    for s, r in zip(plan.segments, reports):
        if r.get("on_chip_bytes") is not None:
            s = dataclasses.replace(s, on_chip_bytes=r["on_chip_bytes"],
                                    off_chip_bytes=r.get("off_chip_bytes") or 0)
        segments.append(s)
    summary = dict(plan.summary,
                   on_chip_parameter_bytes=sum(s.on_chip_bytes for s in segments),
                   off_chip_parameter_bytes=sum(s.off_chip_bytes for s in segments))
    return dataclasses.replace(plan, segments=segments, summary=summary)


def _topological(sg: Subgraph, nodes: dict[int, Operator], seg_of) -> list[int]:
    # A segment becomes one node; order nodes so every input is produced
    # first, keeping the original order wherever the graph allows.  Returns
    # the nodes' keys (a node's first operator index) in that order.
    key = {i: seg_of[i].ops[0] if i in seg_of else i for i in range(len(sg.operators))}
    producer = {t: key[i] for i, op in enumerate(sg.operators) for t in op.outputs}
    deps: dict[int, set[int]] = {n: set() for n in nodes}
    for i, op in enumerate(sg.operators):
        for t in op.inputs:
            p = producer.get(t)
            if p is not None and p != key[i]:
                deps[key[i]].add(p)
    users: dict[int, list[int]] = {n: [] for n in nodes}
    for n, ds in deps.items():
        for d in ds:
            users[d].append(n)
    waiting = {n: len(ds) for n, ds in deps.items()}
    ready = [n for n, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        n = heapq.heappop(ready)
        out.append(n)
        for u in users[n]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(out) != len(nodes):  # a partition with a cycle through the CPU: a bug upstream
        raise RuntimeError("segment graph has a cycle; the partition is not convex")
    return out


def _prune(sg: Subgraph) -> tuple[Subgraph, dict[int, int]]:
    """Drop tensors nothing references any more (segment internals and weights)."""
    used: dict[int, None] = dict.fromkeys(sg.inputs)
    for op in sg.operators:
        used.update(dict.fromkeys(op.tensor_indices()))
    used.update(dict.fromkeys(sg.outputs))
    remap = {old: new for new, old in enumerate(used)}

    def m(idxs):
        return [remap[t] if t >= 0 else -1 for t in idxs]

    ops = [dataclasses.replace(op, inputs=m(op.inputs), outputs=m(op.outputs),
                               intermediates=m(op.intermediates)) for op in sg.operators]
    return (Subgraph([sg.tensors[t] for t in used], ops, m(sg.inputs), m(sg.outputs), sg.name),
            remap)


def compile_log(result: CompileResult, *, input_name: str, input_size: int,
                output_name: str, output_size: int) -> str:
    """A log in the layout of edgetpu_compiler's, for ``coralrt compile``."""
    s = result.plan.summary
    lines = [
        f"coralrt compile with {result.compiler}",
        f"Model compiled successfully in {result.seconds * 1e3:.0f} ms.",
        "",
        f"Input model: {input_name}",
        f"Input size: {mib(input_size)}",
        f"Output model: {output_name}",
        f"Output size: {mib(output_size)}",
        *summary_lines(s, remaining=True),
        "",
    ]
    counts = Counter((o.opcode, o.reason) for o in result.plan.ops)
    width = max([len("Operator")] + [len(op) for op, _ in counts])
    lines.append(f"{'Operator':<{width}}  {'Count':>5}  Status")
    for (op, reason), n in sorted(counts.items(), key=lambda kv: (kv[0][1] != "Mapped to Edge TPU",
                                                                 kv[0][0])):
        lines.append(f"{op:<{width}}  {n:>5}  {reason}")
    return "\n".join(lines) + "\n"
