"""Plain/compiled model pairs: what edgetpu_compiler mapped, and whether compat mode agrees.

A pair is ``X.tflite`` and the ``X_edgetpu.tflite`` edgetpu_compiler made from
it.  The compiled model keeps the operators it left on the CPU unchanged
(same operator, same tensor names) and replaces the rest with one or more
``edgetpu-custom-op`` operators.  :func:`compiler_mapping` matches those CPU
operators back to the plain model, so every plain operator is known to be on
the Edge TPU or on the CPU, and checks the result against the custom
operators' own boundaries: the operators between each custom operator's input
and output tensors must be exactly the ones no CPU operator accounts for.

:func:`compare_pair` runs compat-mode partitioning on the plain model and
lists every operator placed differently.  ``tools/compat_pairs.py`` prints
these reports for folders of pairs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from coralrt._compile.partition import partition
from coralrt._formats.opnames import EDGETPU_OP
from coralrt._model.extract import boundary
from coralrt._model.reader import load_model
from coralrt._model.types import Model, Subgraph

__all__ = ["PairError", "CompilerMapping", "OpDiff", "PairReport", "find_pairs",
           "plain_for", "compiler_mapping", "ops_between", "compare_models", "compare_pair",
           "explain"]

COMPILED_SUFFIX = "_edgetpu.tflite"


class PairError(ValueError):
    """The compiled model cannot be matched to the plain one."""


@dataclass
class CompilerMapping:
    tpu: set[int]                 # plain operator indices inside an edgetpu-custom-op
    cpu: set[int]                 # plain operator indices edgetpu_compiler left on the CPU
    segments: list[set[int] | None]  # per edgetpu-custom-op (None: not matched by name)
    notes: list[str] = field(default_factory=list)


def plain_for(compiled) -> Path | None:
    """The plain model ``X.tflite`` of ``D/X_edgetpu.tflite``: in ``D``, or, when
    ``D`` is named ``edgetpu``, in its parent.  None when there is none."""
    compiled = Path(compiled)
    if not compiled.name.endswith(COMPILED_SUFFIX):
        return None
    stem = compiled.name[:-len(COMPILED_SUFFIX)]
    places = [compiled.parent]
    if compiled.parent.name == "edgetpu":
        places.append(compiled.parent.parent)
    return next((d / f"{stem}.tflite" for d in places if (d / f"{stem}.tflite").is_file()),
                None)


def find_pairs(folders: Iterable) -> tuple[list[tuple[Path, Path]], list[Path]]:
    """``([(plain, compiled)], [compiled models without a plain model])`` under
    ``folders`` (searched recursively; see :func:`plain_for`)."""
    pairs, unpaired = [], []
    seen: set[Path] = set()
    for folder in folders:
        for compiled in sorted(Path(folder).rglob(f"*{COMPILED_SUFFIX}")):
            if compiled.resolve() in seen:
                continue
            seen.add(compiled.resolve())
            plain = plain_for(compiled)
            if plain is None:
                unpaired.append(compiled)
            else:
                pairs.append((plain, compiled))
    return pairs, unpaired


def _producers(sg: Subgraph) -> dict[int, int]:
    return {t: i for i, op in enumerate(sg.operators) for t in op.outputs}


def ops_between(sg: Subgraph, inputs: Iterable[int], outputs: Iterable[int]) -> set[int] | None:
    """The operators that compute tensors ``outputs`` from tensors ``inputs`` (indices in ``sg``).

    Walks back from ``outputs`` and stops at ``inputs``, constants and
    variables.  None when the walk reaches a model input that is not among
    ``inputs`` (the operators would need data the boundary does not give).
    """
    producer = _producers(sg)
    stop = set(inputs)
    covered: set[int] = set()
    seen: set[int] = set()
    stack = list(outputs)
    while stack:
        t = stack.pop()
        if t in seen or t in stop:
            continue
        seen.add(t)
        k = producer.get(t)
        if k is None:
            if sg.tensors[t].is_constant or sg.tensors[t].is_variable:
                continue
            return None
        if k not in covered:
            covered.add(k)
            stack.extend(s for s in sg.operators[k].inputs if s >= 0)
    return covered


def _by_name(sg: Subgraph) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, t in enumerate(sg.tensors):
        index.setdefault(t.name, i)
    return index


def _signature(sg: Subgraph, op, names: bool) -> tuple:
    outs = tuple(sg.tensors[t].name if names else tuple(sg.tensors[t].shape)
                 for t in op.outputs)
    ins = () if names else tuple(sg.tensors[t].name for t in op.inputs if t >= 0)
    return (op.name, outs, ins)


def _match_cpu_ops(psg: Subgraph, csg: Subgraph) -> dict[int, int]:
    """compiled CPU operator index -> plain operator index.

    First by operator and output tensor names; an operator whose outputs were
    renamed falls back to operator, output shapes and input tensor names.
    """
    cpu = [k for k, op in enumerate(csg.operators) if op.opcode.custom_code != EDGETPU_OP]
    matched: dict[int, int] = {}
    taken: set[int] = set()
    for names in (True, False):
        table: dict[tuple, list[int]] = {}
        for i, op in enumerate(psg.operators):
            if i not in taken:
                table.setdefault(_signature(psg, op, names), []).append(i)
        for k in cpu:
            if k in matched:
                continue
            found = table.get(_signature(csg, csg.operators[k], names), [])
            if len(found) == 1:
                matched[k] = found[0]
                taken.add(found[0])
                table[_signature(csg, csg.operators[k], names)] = []
    missing = [k for k in cpu if k not in matched]
    if missing:
        op = csg.operators[missing[0]]
        raise PairError(f"compiled operator {missing[0]} ({op.name}) matches no operator of "
                        f"the plain model (by output names, or by shapes and input names)")
    return matched


def _io_shapes(sg: Subgraph, ops) -> tuple[list, list]:
    ins, outs = boundary(sg, ops)

    def key(t):
        return (tuple(int(d) for d in sg.tensors[t].shape), sg.tensors[t].type_name)
    return sorted(map(key, ins)), sorted(map(key, outs))


def compiler_mapping(plain: Model, compiled: Model) -> CompilerMapping:
    """Which operators of ``plain`` edgetpu_compiler put in ``compiled``'s custom operators.

    Raises :class:`PairError` when a CPU operator of ``compiled`` matches no
    plain operator, or when the plain operators left over do not have the
    custom operators' inputs and outputs (compared by shape and type).  When
    the custom operators' tensor names are all in ``plain``, each one's
    operators are found by name too and must together be exactly those left
    over; otherwise (a compiled model made from another version of the plain
    model, with renamed tensors) ``segments`` holds None for it and a note
    says so.
    """
    psg, csg = plain.main, compiled.main
    cpu = set(_match_cpu_ops(psg, csg).values())
    tpu = set(range(len(psg.operators))) - cpu
    customs = [k for k, op in enumerate(csg.operators) if op.opcode.custom_code == EDGETPU_OP]
    if bool(customs) != bool(tpu) or (
            customs and _io_shapes(psg, tpu) != _io_shapes(csg, customs)):
        raise PairError(f"the {len(tpu)} plain operators no CPU operator accounts for do not "
                        f"have the inputs and outputs of the {len(customs)} edgetpu-custom-op")
    index = _by_name(psg)
    segments: list[set[int] | None] = []
    notes = []
    for k in customs:
        op = csg.operators[k]
        names = [csg.tensors[t].name for t in (*op.inputs, *op.outputs) if t >= 0]
        absent = [n for n in names if n not in index]
        if absent:
            notes.append(f"edgetpu-custom-op {k}: tensor {absent[0]!r} is not in the plain model "
                         f"(renamed); its operators were matched by shapes only")
            segments.append(None)
            continue
        ops = ops_between(psg, [index[csg.tensors[t].name] for t in op.inputs if t >= 0],
                          [index[csg.tensors[t].name] for t in op.outputs])
        if ops is None:
            raise PairError(f"edgetpu-custom-op {k}: its outputs need a model input it does "
                            f"not take")
        segments.append(ops)
    if None not in segments:
        inside = set().union(*segments) if segments else set()
        if inside != tpu:
            raise PairError(f"the operators between the edgetpu-custom-op tensors are not the "
                            f"{len(tpu)} plain operators no CPU operator accounts for")
    return CompilerMapping(tpu, cpu, segments, notes)


@dataclass
class OpDiff:
    index: int
    opcode: str
    edgetpu_compiler: str    # "tpu" | "cpu"
    compat: str              # "tpu" | "cpu"
    reason: str              # compat mode's reason
    why: str = ""            # the disagreement in words: what each side did, and why


@dataclass
class PairReport:
    plain: str
    compiled: str
    agree: bool = False
    total_ops: int = 0
    compiler_tpu_ops: int = 0
    compat_tpu_ops: int = 0
    compiler_segments: int = 0
    compat_segments: int = 0
    diffs: list[OpDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def compare_models(plain: Model, compiled: Model, *, rules=None,
                   names: tuple[str, str] = ("", "")) -> PairReport:
    """Compat mode's placement of ``plain`` against edgetpu_compiler's in ``compiled``."""
    mapping = compiler_mapping(plain, compiled)
    plan = partition(plain, "compat", rules=rules)
    diffs = []
    for o in plan.ops:
        want = "tpu" if o.index in mapping.tpu else "cpu"
        if o.unit != want:
            diffs.append(OpDiff(o.index, o.opcode, want, o.unit, o.reason))
    explain(plain, diffs, rules)
    return PairReport(names[0], names[1], not diffs, len(plain.main.operators),
                      len(mapping.tpu), len(plan.tpu_ops), len(mapping.segments),
                      len(plan.segments), diffs, mapping.notes)


def _ancestors(sg: Subgraph, i: int) -> set[int]:
    prod, seen, todo = _producers(sg), set(), [i]
    while todo:
        for t in sg.operators[todo.pop()].inputs:
            p = prod.get(t)
            if p is not None and p not in seen:
                seen.add(p)
                todo.append(p)
    return seen


def _passes(name: str, version: int, rules) -> str:
    support = rules.support(name) if rules is not None else None
    if support is None:
        return f"its rule for {name} has no limit it fails"
    checks = [getattr(c, "__name__", type(c).__name__).strip("<>")
              for c in (*support.generic, *support.checks)]
    return (f"{name} (version {version}, the Edge TPU takes up to {support.max_version}) is "
            f"in the operator table and passes every check coralrt applies to it: "
            f"{', '.join(checks)}")


def explain(plain: Model, diffs: list[OpDiff], rules=None) -> None:
    """Fill in each disagreement's ``why``: coralrt's reason for each operator it
    keeps on the CPU that edgetpu_compiler mapped, and for each it maps that
    edgetpu_compiler left on the CPU, what lets it (the operator's own rule, or
    the upstream operator the two placed differently, where the compiler's
    subgraph ended)."""
    from coralrt._compile.compat_rules import compat_rules
    from coralrt._compile.rules import default_rules
    registry = compat_rules(rules or default_rules())
    sg = plain.main
    mapped_here = {d.index for d in diffs if d.compat == "tpu"}
    for d in diffs:
        if d.compat == "cpu":
            d.why = (f"Google's compiler mapped it; coralrt keeps it on the CPU because: "
                     f"{d.reason}")
            continue
        upstream = sorted(_ancestors(sg, d.index) & mapped_here)
        if upstream:
            j = upstream[0]
            d.why = (f"Google's compiler left it on the CPU, after operator {j} "
                     f"({sg.operators[j].name}) upstream; coralrt maps it because it maps "
                     f"operator {j} too and this operator passes its own rule")
        else:
            op = sg.operators[d.index]
            d.why = (f"Google's compiler left it on the CPU; coralrt maps it because "
                     f"{_passes(op.name, op.version, registry)}. No documented limit or "
                     f"other compiled pair says why the compiler did not")


def compare_pair(plain_path, compiled_path, *, rules=None) -> PairReport:
    """:func:`compare_models` for two files; a pair that cannot be read or matched
    comes back with ``error`` set and ``agree`` False."""
    names = (str(plain_path), str(compiled_path))
    try:
        return compare_models(load_model(plain_path), load_model(compiled_path), rules=rules,
                              names=names)
    except (PairError, OSError, ValueError) as e:
        return PairReport(*names, error=f"{type(e).__name__}: {e}")
