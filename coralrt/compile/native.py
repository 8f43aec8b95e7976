"""coralrt's native compiler: a plain model -> a compiled ``.tflite``.

Each TPU segment of the partition is cut out as a standalone model, built
into a coralrt segment (``docs/segment-format.md``) and put back as one
CUSTOM operator ``coralrt-segment`` carrying the segment in its
``custom_options``.  CPU operators stay as they were, so the compiled model
is a valid ``.tflite`` that LiteRT loads (it only fails on the custom op,
which the coralrt executor runs).
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from coralrt.compile import segment as seg_format
from coralrt.compile.partition import (
    PartitionPlan, mib, partition, plan_from_groups, summary_lines,
)
from coralrt.compile.rules import UNSPECIFIED_LIMITATION
from coralrt.errors import ModelError, SegmentTooLargeError
from coralrt.model.extract import extract
from coralrt.model.types import CUSTOM, Model, Operator, OperatorCode, Subgraph

__all__ = ["SEGMENT_OP", "NativeCompiler", "CompileResult", "compile_model", "compile_log"]

log = logging.getLogger("coralrt.compile")

SEGMENT_OP = "coralrt-segment"


class NativeCompiler:
    """Builds coralrt segments; their programs run on the simulated Edge TPU."""

    id = seg_format.COMPILER_ID
    runs_on = ("sim",)

    @property
    def version(self) -> str:
        return f"{seg_format._compiler_version()}+seg{seg_format.FORMAT_VERSION}"

    def compile_segment(self, piece: Model) -> bytes:
        return seg_format.encode(seg_format.build_segment(
            piece, compiler_id=self.id, compiler_version=self.version))


@dataclass
class CompileResult:
    model: Model                     # the compiled model
    plan: PartitionPlan
    segments: list[bytes] = field(default_factory=list)
    seconds: float = 0.0
    compiler: str = ""

    def to_bytes(self) -> bytes:
        return self.model.to_bytes()


def compile_model(model: Model, *, mode: str = "multi", compiler: NativeCompiler | None = None,
                  plan: PartitionPlan | None = None, rules=None,
                  on_segment=None) -> CompileResult:
    """Partition ``model`` and compile every TPU segment into a compiled model."""
    if model.is_edgetpu_compiled:
        raise ModelError("this model was already compiled by edgetpu_compiler (it contains "
                         "edgetpu-custom-op); its Edge TPU programs only run with "
                         "target='coral'. Compile the plain .tflite instead")
    start = time.perf_counter()
    compiler = compiler or NativeCompiler()
    plan = plan or partition(model, mode, rules=rules)
    sg = model.main
    groups, blobs = [], []
    too_big: dict[int, str] = {}
    todo = [list(s.ops) for s in plan.segments]
    while todo:
        ops = todo.pop(0)
        t0 = time.perf_counter()
        try:
            blob = compiler.compile_segment(extract(model, ops).model)
        except SegmentTooLargeError as e:
            if len(ops) < 2:
                # One operator whose tensors alone overflow the chip stays on the CPU.
                too_big[ops[0]] = (f"{UNSPECIFIED_LIMITATION}: its tensors need "
                                   f"{e.required_bytes} bytes, more than the Edge TPU's "
                                   f"{e.limit_bytes} bytes of on-chip memory")
                continue
            # Activations overflow on-chip memory: cut the segment in execution
            # order (a prefix of a convex segment is convex) and try each half.
            log.info("segment of %d operators needs %d bytes of activations; splitting",
                     len(ops), e.required_bytes)
            todo[:0] = [ops[:len(ops) // 2], ops[len(ops) // 2:]]
            continue
        groups.append(ops)
        blobs.append(blob)
        if on_segment is not None:
            on_segment(len(groups) - 1, len(ops), len(blob), time.perf_counter() - t0)
        log.debug("segment %d: %d operators, %d bytes, %.1f ms", len(groups) - 1, len(ops),
                  len(blob), 1e3 * (time.perf_counter() - t0))
    if len(groups) != len(plan.segments) or too_big:
        plan = plan_from_groups(model, plan, groups, cpu_reasons=too_big)
    code = OperatorCode(CUSTOM, SEGMENT_OP, 1)
    nodes: dict[int, Operator] = {}  # first op index of a node -> the operator that replaces it
    seg_of = {i: s for s in plan.segments for i in s.ops}
    for i, op in enumerate(sg.operators):
        s = seg_of.get(i)
        if s is None:
            nodes[i] = op
        elif i == s.ops[0]:
            nodes[i] = Operator(code, list(s.inputs), list(s.outputs),
                                custom_options=blobs[s.index])
    ordered = _topological(sg, nodes, seg_of)
    main, remap = _prune(Subgraph(sg.tensors, ordered, list(sg.inputs), list(sg.outputs),
                                  sg.name))
    signatures = [
        dataclasses.replace(sig, inputs={k: remap[v] for k, v in sig.inputs.items()},
                            outputs={k: remap[v] for k, v in sig.outputs.items()})
        if sig.subgraph_index == 0 else sig
        for sig in model.signatures
    ]
    compiled = Model(subgraphs=[main, *model.subgraphs[1:]], description=model.description,
                     version=model.version, metadata=list(model.metadata),
                     signatures=signatures)
    seconds = time.perf_counter() - start
    return CompileResult(compiled, plan, blobs, seconds, f"{compiler.id} {compiler.version}")


def _topological(sg: Subgraph, nodes: dict[int, Operator], seg_of) -> list[Operator]:
    # A segment becomes one node; order nodes so every input is produced
    # first, keeping the original order wherever the graph allows.
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
        out.append(nodes[n])
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
        f"coralrt native compiler version {result.compiler.split(' ', 1)[-1]}",
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
