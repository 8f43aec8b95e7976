#!/usr/bin/env python3
"""STAND-IN for Google's ``edgetpu_compiler``, for tests only.  It compiles nothing.

The real compiler is closed source, x86-64 only and not installed here, so the
tests of :mod:`coralrt._compile.edgetpu_compiler` run this script in its place.
It accepts edgetpu_compiler's command line (``-s``, ``-o DIR``, ``-t N``,
``-m N``, ``-v``/``--version``, ``-i``, ``-n``, ``-d``, ``-k``; unused options
are ignored) and answers from the models the real compiler produced, which
sit in the folder named by ``FAKE_EDGETPU_MODELS`` (tests use
``../shared/models``: ``X.tflite`` next to ``edgetpu/X_edgetpu.tflite``):

- for an input model, it looks for a compiled model whose single
  ``edgetpu-custom-op`` reads tensors of the input model's name and produces
  tensors of the input model's names, such that the operators between them
  are exactly the operators the real compiler mapped (those of the plain model
  ``X.tflite`` whose outputs are not produced by a CPU operator of
  ``X_edgetpu.tflite``).  That covers the whole plain model (deeplab: the real
  compiler's 8 CPU operators stay) and any piece of it holding the mapped
  operators and possibly more;
- on a match it writes ``<name>_edgetpu.tflite``: the input model with those
  operators replaced by the real compiler's ``edgetpu-custom-op`` (its DWN1
  package unchanged), the other operators kept for the CPU; and
  ``<name>_edgetpu.log`` in the real log layout with one status per operator;
- when nothing matches it behaves like a compiler that maps nothing: exit
  status 0, every operator "Operation is otherwise supported, but not mapped
  due to some unspecified limitation", an output model equal to the input.

Several models in one call (co-compilation) are compiled one after the other,
each into its own ``<name>_edgetpu.tflite`` and ``.log`` (nothing is shared:
the stand-in has no parameter cache to share).  ``-n N`` (``--num_segments``)
takes one model only, as the real compiler (its documentation says the option
cannot be used with several models): the model's operators, in execution
order, are cut into N consecutive pieces (hence convex) whose constant
(parameter) bytes are as close as possible to equal shares, each piece at
least one operator; piece ``i`` is compiled as above and written as
``<name>_segment_<i>_of_<N>_edgetpu.tflite`` with its ``.log`` (the naming of
Coral's pipeline examples, e.g. ``inception_v3_299_quant_segment_0_of_2_edgetpu.tflite``).
A piece rarely matches a real compiled model, so pieces are mostly written
plain (all operators on the CPU).  N larger than the number of operators, or
N < 1, is an error (exit status 1).  How the real compiler balances segments
is not modelled.

Test switches: ``FAKE_EDGETPU_HANG=1`` prints the header, starts a child and
sleeps (a compiler that never finishes, for the timeout); ``FAKE_EDGETPU_FAIL=1``
prints an internal error and exits with status 1;
``FAKE_EDGETPU_ARGV_LOG=FILE`` appends every command line it receives (its
arguments, without the program name, ``--version`` calls included) to FILE as
one JSON list per line.  ``--version`` prints
``Edge TPU Compiler version 16.0.384591198`` as the real compiler 16 does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

VERSION = "16.0.384591198"
OP = "edgetpu-custom-op"
MAPPED = "Mapped to Edge TPU"
UNSPECIFIED = ("Operation is otherwise supported, but not mapped due to some unspecified "
               "limitation")
SECOND = "More than one subgraph is not supported"
ONCHIP = 8 * 1024 * 1024
NOT_ALL = ("[Model successfully compiled but not all operations are supported by the Edge TPU. "
           "A percentage of the model will instead run on the CPU, which is slower. If "
           "possible, consider updating your model to use only operations supported by the "
           "Edge TPU. For details, visit g.co/coral/model-reqs.]")


def _size(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f}MiB"
    if n >= 1 << 10:
        return f"{n / (1 << 10):.2f}KiB"
    return f"{n:.2f}B"


def _candidates(folder: Path):
    from coralrt import load_model
    for path in sorted(folder.rglob("*_edgetpu.tflite")):
        stem = path.name[: -len("_edgetpu.tflite")]
        plain = next((p for p in (path.parent / f"{stem}.tflite",
                                  path.parent.parent / f"{stem}.tflite") if p.is_file()), None)
        try:
            yield load_model(path), load_model(plain) if plain else None
        except Exception:  # an unreadable file in the folder: not a candidate
            continue


def _match(x, compiled, plain):
    """(custom op, {X operator indices it covers}) or None."""
    from coralrt._compile.pairs import PairError, compiler_mapping, ops_between
    csg = compiled.main
    customs = [op for op in csg.operators if op.name == OP]
    if len(customs) != 1:
        return None
    e = customs[0]
    index = {}
    for i, t in enumerate(x.tensors):
        index.setdefault(t.name, i)
    e_in = [csg.tensors[t].name for t in e.inputs if t >= 0]
    e_out = [csg.tensors[t].name for t in e.outputs]
    if any(n not in index for n in (*e_in, *e_out)):
        return None
    # None: the program would need a model input it does not take.
    covered = ops_between(x, [index[n] for n in e_in], [index[n] for n in e_out])
    producer = {t: k for k, op in enumerate(x.operators) for t in op.outputs}
    if not covered or any(producer.get(index[n]) not in covered for n in e_out):
        return None
    if plain is not None:
        try:
            mapping = compiler_mapping(plain, compiled)
        except PairError:
            return None
        psg = plain.main
        mapped = {psg.tensors[t].name for k in mapping.tpu for t in psg.operators[k].outputs}
        got = {x.tensors[t].name for k in covered for t in x.operators[k].outputs}
        if got != mapped:
            return None
    return e, covered


def _replace(model, e, covered, csg):
    """``model`` with the ``covered`` operators replaced by the custom op ``e``."""
    from coralrt._model import Model, Operator, OperatorCode, Subgraph
    from coralrt._model.types import CUSTOM
    x = model.main
    index = {}
    for i, t in enumerate(x.tensors):
        index.setdefault(t.name, i)
    custom = Operator(OperatorCode(CUSTOM, OP, 1),
                      [index[csg.tensors[t].name] for t in e.inputs if t >= 0],
                      [index[csg.tensors[t].name] for t in e.outputs],
                      custom_options=bytes(e.custom_options))
    first = min(covered)
    nodes = {k: op for k, op in enumerate(x.operators) if k not in covered}
    nodes[first] = custom
    producer = {t: k for k, op in nodes.items() for t in op.outputs}
    order, done = [], set()
    while len(order) < len(nodes):  # topological, original order where possible
        k = next(k for k in sorted(nodes) if k not in done and all(
            producer.get(t) in done or t not in producer or producer[t] == k
            for t in nodes[k].inputs if t >= 0))
        order.append(nodes[k])
        done.add(k)
    used = dict.fromkeys(x.inputs)
    for op in order:
        used.update(dict.fromkeys(t for t in (*op.inputs, *op.outputs) if t >= 0))
    used.update(dict.fromkeys(x.outputs))
    remap = {old: new for new, old in enumerate(used)}
    import dataclasses
    ops = [dataclasses.replace(op, inputs=[remap[t] if t >= 0 else -1 for t in op.inputs],
                               outputs=[remap[t] for t in op.outputs], intermediates=[])
           for op in order]
    sg = Subgraph([x.tensors[t] for t in used], ops, [remap[t] for t in x.inputs],
                  [remap[t] for t in x.outputs], x.name)
    return Model(subgraphs=[sg], description="TOCO Converted.", version=3)


def _statuses(x, covered) -> list[str]:
    producer = {t: k for k, op in enumerate(x.operators) for t in op.outputs}
    after: list[bool] = []
    cut = False
    out = []
    for k, op in enumerate(x.operators):
        parents = [producer[t] for t in op.inputs if t >= 0 and t in producer]
        a = any(p in covered or after[p] for p in parents)
        after.append(a)
        if k in covered:
            out.append(MAPPED)
        elif a and cut:
            out.append(SECOND)
        else:
            cut = cut or a
            out.append(UNSPECIFIED)
    return out


def _table(x, statuses) -> list[str]:
    counts: dict[tuple[str, str], int] = {}
    for op, status in zip(x.operators, statuses):
        counts[(op.name, status)] = counts.get((op.name, status), 0) + 1
    rows = sorted(counts.items(), key=lambda kv: (kv[0][1] != MAPPED, kv[0][0]))
    return [f"{'Operator':<31}{'Count':<11}Status", ""] + [
        f"{name:<31}{n:<11}{status}" for (name, status), n in rows]


def _compile(model, folder: Path | None):
    """(covered operators, output model bytes or None for "unchanged", parameter bytes)."""
    x = model.main
    for compiled, plain in (_candidates(folder) if folder and folder.is_dir() else ()):
        found = _match(x, compiled, plain)
        if found is not None:
            e, covered = found
            params = sum(x.tensors[t].buffer.nbytes for k in covered
                         for t in set(x.operators[k].inputs)
                         if t >= 0 and x.tensors[t].is_constant)
            return covered, _replace(model, e, covered, compiled.main).to_bytes(), params
    return set(), None, 0


def _write(src: Path, model, data: bytes, out_stem: str, out_dir: Path, folder: Path | None,
           show: bool, t0: float) -> None:
    """Compile ``model`` (read from ``src``, or a piece of it) into ``out_stem``_edgetpu.*."""
    x = model.main
    covered, out_bytes, params = _compile(model, folder)
    if out_bytes is None:
        out_bytes = data
    statuses = _statuses(x, covered)
    out_path = out_dir / f"{out_stem}_edgetpu.tflite"
    log_path = out_dir / f"{out_stem}_edgetpu.log"
    out_path.write_bytes(out_bytes)
    table = _table(x, statuses)
    log_path.write_text("\n".join([f"Edge TPU Compiler version {VERSION}", f"Input: {src}",
                                   f"Output: {out_path}", "", *table, ""]))
    n, tpu = len(x.operators), len(covered)
    on_chip = min(params, ONCHIP)
    lines = [
        "", f"Model compiled successfully in {round(1e3 * (time.perf_counter() - t0))} ms.", "",
        f"Input model: {src}", f"Input size: {_size(len(data))}",
        f"Output model: {out_path}", f"Output size: {_size(len(out_bytes))}",
        f"On-chip memory used for caching model parameters: {_size(on_chip)}",
        f"On-chip memory remaining for caching model parameters: {_size(ONCHIP - on_chip)}",
        f"Off-chip memory used for streaming uncached model parameters: "
        f"{_size(params - on_chip)}",
        f"Number of Edge TPU subgraphs: {1 if tpu else 0}",
        f"Total number of operations: {n}", f"Operation log: {log_path}", "",
    ]
    if tpu < n:
        lines += [NOT_ALL, f"Number of operations that will run on Edge TPU: {tpu}",
                  f"Number of operations that will run on CPU: {n - tpu}", ""]
    if show:
        lines += [*table, ""]
    else:
        lines.append("See the operation log file for individual operation details.")
    print("\n".join(lines))


def _stem(src: Path) -> str:
    return src.name[:-len(".tflite")] if src.name.endswith(".tflite") else src.name


def compile_one(src: Path, out_dir: Path, folder: Path | None, show: bool, timeout: int) -> None:
    from coralrt import load_model
    t0 = time.perf_counter()
    data = src.read_bytes()
    _write(src, load_model(data), data, _stem(src), out_dir, folder, show, t0)


def _param_bytes(x) -> list[int]:
    """Constant bytes each operator brings (a constant shared by several counts once)."""
    seen: set[int] = set()
    out = []
    for op in x.operators:
        n = 0
        for t in op.inputs:
            if t >= 0 and t not in seen and x.tensors[t].is_constant:
                seen.add(t)
                n += x.tensors[t].nbytes
        out.append(n)
    return out


def cuts(weights: list[int], n: int) -> list[int]:
    """Boundaries 0 = b0 < b1 < ... < bn = len(weights) of ``n`` consecutive non-empty
    pieces whose sums of ``weights`` are as close as possible to equal shares."""
    total = sum(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    bounds = [0]
    for k in range(1, n):
        lo, hi = bounds[-1] + 1, len(weights) - (n - k)
        target = total * k / n
        bounds.append(min(range(lo, hi + 1), key=lambda b: (abs(prefix[b] - target), b)))
    return bounds + [len(weights)]


def compile_segments(src: Path, out_dir: Path, folder: Path | None, show: bool,
                     n: int) -> int:
    """``-n N``: N consecutive pieces balanced by parameter bytes, each compiled on its own
    and written as ``<stem>_segment_<i>_of_<N>_edgetpu.tflite`` (and ``.log``)."""
    from coralrt import load_model
    t0 = time.perf_counter()
    model = load_model(src.read_bytes())
    ops = len(model.main.operators)
    if n > ops:
        print(f"ERROR: cannot cut a model of {ops} operators into {n} segments.")
        return 1
    bounds = cuts(_param_bytes(model.main), n)
    for i in range(n):
        piece = model.extract(range(bounds[i], bounds[i + 1]))
        _write(src, piece, piece.to_bytes(), f"{_stem(src)}_segment_{i}_of_{n}", out_dir,
               folder, show, t0)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="edgetpu_compiler", add_help=True)
    p.add_argument("models", nargs="*")
    p.add_argument("-v", "--version", action="store_true")
    p.add_argument("-s", "--show_operations", action="store_true")
    p.add_argument("-o", "--out_dir", default=".")
    p.add_argument("-t", "--timeout_sec", type=int, default=180)
    p.add_argument("-m", "--min_runtime_version", type=int, default=14)
    p.add_argument("-i", "--intermediate_tensors", default=None)
    p.add_argument("-n", "--num_segments", type=int, default=None)
    p.add_argument("-d", "--search_delegate", action="store_true")
    p.add_argument("-k", "--delegate_search_step", type=int, default=1)
    p.add_argument("-a", "--enable_multiple_subgraphs", action="store_true")
    argv_log = os.environ.get("FAKE_EDGETPU_ARGV_LOG")
    if argv_log:
        with open(argv_log, "a", encoding="utf-8") as f:
            f.write(json.dumps(list(sys.argv[1:] if argv is None else argv)) + "\n")
    args = p.parse_args(argv)
    print(f"Edge TPU Compiler version {VERSION}", flush=True)
    if args.version:
        return 0
    if not args.models:
        print("ERROR: no model given. Usage: edgetpu_compiler [options] model...")
        return 1
    if args.num_segments is not None and args.num_segments < 1:
        print(f"ERROR: --num_segments must be at least 1, not {args.num_segments}.")
        return 1
    if args.num_segments is not None and len(args.models) > 1:
        print("ERROR: --num_segments cannot be used when passing multiple models.")
        return 1
    print(f"Started a compilation timeout timer of {args.timeout_sec} seconds.", flush=True)
    if os.environ.get("FAKE_EDGETPU_HANG") == "1":
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        pid_file = os.environ.get("FAKE_EDGETPU_PIDFILE")
        if pid_file:
            Path(pid_file).write_text(f"{os.getpid()} {child.pid}")
        while True:
            time.sleep(1)
    if os.environ.get("FAKE_EDGETPU_FAIL") == "1":
        print("Internal compiler error. Aborting!")
        return 1
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository's coralrt
    folder = os.environ.get("FAKE_EDGETPU_MODELS")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    models = Path(folder) if folder else None
    if args.num_segments is not None:
        if compile_segments(Path(args.models[0]), out_dir, models, args.show_operations,
                            args.num_segments):
            return 1
    for m in args.models if args.num_segments is None else ():
        compile_one(Path(m), out_dir, models, args.show_operations, args.timeout_sec)
    print("Compilation child process completed within timeout period.")
    print("Compilation succeeded! ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
