"""Whole-model compiles with edgetpu_compiler: co-compilation and ``num_segments``.

In this mode coralrt's partitioner is not used: edgetpu_compiler gets whole
models and partitions each itself (the same as partition mode ``compat``).

- **Co-compilation**: several models go to edgetpu_compiler in ONE call
  (``edgetpu_compiler -s -o OUT m1 m2 ...``, in the order given; earlier
  models get priority for the on-chip parameter cache), so they share the
  stick's parameter cache and caching token.  The compiler writes
  ``<name>_edgetpu.tflite`` and ``<name>_edgetpu.log`` per model.
- **num_segments**: ``edgetpu_compiler -n N`` cuts one model into N segments,
  ``<name>_segment_<i>_of_<N>_edgetpu.tflite`` (what pycoral's
  ``PipelinedModelRunner`` takes).  :func:`merge_segments` joins them back by
  tensor name into one model whose Edge TPU custom operators coralrt's
  pipelined program spreads over several sticks
  (:mod:`coralrt._runtime.pipeline`: TPU operator ``i`` on ``devices[i % n]``).

:func:`compile_whole` runs the compiler (through an
:class:`~coralrt._compile.edgetpu_compiler.EdgeTpuCompiler`, which handles the
timeout and the compiler's process group) in a temporary folder, checks that
every expected output exists and loads as a TFLite model, and parses the log.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from coralrt._compile.edgetpu_compiler import EdgeTpuCompiler, _tail, parse_log
from coralrt.errors import CompileError, ConfigError, CoralRTError, ModelError
from coralrt._formats.opnames import EDGETPU_OP
from coralrt._model import Model, load_model
from coralrt._model.types import Subgraph, Tensor

__all__ = ["CompiledFile", "WholeRun", "compile_whole", "whole_command", "output_stem",
           "segment_stem", "merge_segments"]

log = logging.getLogger("coralrt.compile")


def output_stem(source: str | os.PathLike) -> str:
    """``m`` for ``dir/m.tflite``: the stem edgetpu_compiler names its outputs after."""
    name = Path(source).name
    return name[: -len(".tflite")] if name.endswith(".tflite") else name


def segment_stem(stem: str, i: int, n: int) -> str:
    """``<stem>_segment_<i>_of_<n>``; edgetpu_compiler appends ``_edgetpu.tflite``."""
    return f"{stem}_segment_{i}_of_{n}"


@dataclass
class CompiledFile:
    """One compiled output: its file name, bytes, parsed model and log text."""
    name: str                 # e.g. "m_edgetpu.tflite"
    data: bytes
    model: Model
    log: str                  # the compiler's output for it (stdout part and .log file)
    report: dict              # parse_log(log)


@dataclass
class WholeRun:
    """What one edgetpu_compiler run produced, per input model in the given order.

    ``outputs[k]`` is model ``k``'s compiled model (with ``num_segments`` > 1:
    the merged model, named ``<name>_edgetpu.tflite``); ``segments[k]`` its
    segment files (empty without ``num_segments``).
    """
    command: list[str]
    text: str                                  # everything the compiler printed
    outputs: list[CompiledFile]
    segments: list[list[CompiledFile]] = field(default_factory=list)
    seconds: float = 0.0
    compiler: str = ""                         # "edgetpu_compiler <version>"


def whole_command(compiler: EdgeTpuCompiler, sources, out_dir, num_segments: int = 1
                  ) -> list[str]:
    """The command line: ``edgetpu_compiler -s -o OUT [-n N] [-t S] [extra] m1 m2 ...``."""
    seg = ["-n", str(num_segments)] if num_segments > 1 else []
    return [str(compiler.path), "-s", "-o", str(out_dir), *seg, *compiler._timeout_args(),
            *compiler.extra_args, *(os.path.abspath(s) for s in sources)]


def _check_request(sources, num_segments: int) -> None:
    if not sources:
        raise ConfigError("no model to compile")
    if num_segments < 1:
        raise ConfigError(f"the number of segments must be at least 1, not {num_segments}")
    if num_segments > 1 and len(sources) > 1:
        raise ConfigError("--num-segments takes one model: edgetpu_compiler does not allow "
                          "-n/--num_segments when several models are co-compiled; compile "
                          "each model to segment on its own")
    stems = [output_stem(s) for s in sources]
    twice = sorted({s for s in stems if stems.count(s) > 1})
    if twice:
        raise ConfigError(f"several models are named {twice[0]}.tflite: edgetpu_compiler names "
                          f"its outputs after the file name, so their outputs would collide; "
                          f"rename one of them")


def compile_whole(compiler: EdgeTpuCompiler, sources, *, num_segments: int = 1,
                  plains: list[Model] | None = None) -> WholeRun:
    """Compile whole models in one edgetpu_compiler run; see the module docstring.

    ``plains``: the input models, already read (for the merged model's input
    and output order and signatures); read here when not given.
    """
    sources = [Path(s) for s in sources]
    _check_request(sources, num_segments)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="coralrt-edgetpu-") as tmp:
        out_dir = Path(tmp) / "out"
        out_dir.mkdir()
        cmd = whole_command(compiler, sources, out_dir, num_segments)
        log.debug("running %s", " ".join(cmd))
        text, code = compiler._run(cmd, compiler.timeout, tmp)
        if code != 0:
            raise CompileError(f"edgetpu_compiler failed on {_names(sources)} "
                               f"(exit status {code})", log_tail=_tail(text), returncode=code)
        stems = [output_stem(s) for s in sources]
        if num_segments > 1:
            names = [[segment_stem(stems[0], i, num_segments) for i in range(num_segments)]]
        else:
            names = [[s] for s in stems]
        missing = [f"{n}_edgetpu.tflite" for group in names for n in group
                   if not (out_dir / f"{n}_edgetpu.tflite").is_file()]
        if missing:
            raise CompileError(f"edgetpu_compiler exited normally but did not write "
                               f"{', '.join(missing)}", log_tail=_tail(text), returncode=code)
        parts = _split_output(text)
        files = [[_collect(out_dir, n, parts.get(f"{n}_edgetpu.tflite")
                           or parts.get(sources[k].name) or text) for n in group]
                 for k, group in enumerate(names)]
    version = compiler.version
    if num_segments == 1:
        return WholeRun(cmd, text, [g[0] for g in files], [[] for _ in files],
                        time.perf_counter() - start, f"edgetpu_compiler {version}")
    plain = plains[0] if plains else load_model(sources[0])
    merged = merge_segments([f.model for f in files[0]], plain)
    data = merged.to_bytes()
    merged = _load(data, f"{stems[0]}_edgetpu.tflite (the merged segments)")
    whole_log = "\n".join([text.rstrip(), *(f.log for f in files[0])])
    out = CompiledFile(f"{stems[0]}_edgetpu.tflite", data, merged, whole_log,
                       _summed(parse_log(text), [f.report for f in files[0]]))
    return WholeRun(cmd, text, [out], files, time.perf_counter() - start,
                    f"edgetpu_compiler {version}")


def _summed(report: dict, parts: list[dict]) -> dict:
    """``report`` with the figures that add up over the segments summed (None
    when a segment's log lacks one)."""
    out = dict(report)
    for key in ("on_chip_bytes", "off_chip_bytes", "total_ops", "tpu_ops", "cpu_ops"):
        values = [r.get(key) for r in parts]
        out[key] = None if any(v is None for v in values) else sum(values)
    out["all_mapped"] = out["cpu_ops"] == 0 if out["cpu_ops"] is not None else None
    return out


def _names(sources) -> str:
    return ", ".join(Path(s).name for s in sources)


def _load(data: bytes, name: str) -> Model:
    try:
        return load_model(data)
    except CoralRTError as e:
        raise CompileError(f"edgetpu_compiler wrote {name}, which does not load as a "
                           f"TFLite model: {e}") from e


def _collect(out_dir: Path, stem: str, part: str) -> CompiledFile:
    name = f"{stem}_edgetpu.tflite"
    data = (out_dir / name).read_bytes()
    log_file = out_dir / f"{stem}_edgetpu.log"
    text = part.rstrip() + "\n"
    if log_file.is_file():
        text += "\n" + log_file.read_text("utf-8", "replace")
    return CompiledFile(name, data, _load(data, name), text, parse_log(text))


def _split_output(text: str) -> dict[str, str]:
    """The compiler's output cut into one part per compiled file (its header
    first), keyed by the base names of the part's "Input model" and "Output
    model" lines (the first part wins for an input named by several)."""
    lines = text.splitlines()
    starts: list[int] = []
    for i, line in enumerate(lines):
        if line.startswith("Input model:"):
            j = i
            while j > (starts[-1] + 1 if starts else 0) and (
                    not lines[j - 1].strip()
                    or lines[j - 1].startswith("Model compiled successfully")):
                j -= 1
            starts.append(j)
    head = lines[:starts[0]] if starts else []
    parts: dict[str, str] = {}
    for k, begin in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(lines)
        chunk = "\n".join(head + lines[begin:end])
        for line in lines[begin:end]:
            if line.startswith(("Input model:", "Output model:")):
                parts.setdefault(Path(line.split(":", 1)[1].strip()).name, chunk)
    return parts


# -- merging the segments of -n N ------------------------------------------------------

def merge_segments(segments: list[Model], plain: Model | None = None) -> Model:
    """One model from pipeline segments, joined by tensor name.

    Segment ``k``'s inputs must be produced by an earlier segment (an output
    of its graph) or be inputs of the model; its operators follow those of
    the earlier segments, so the order is topological and every segment's
    Edge TPU custom operators keep their place.  With ``plain`` (the model
    that was segmented) the merged inputs and outputs are the plain model's,
    in its order, with its signatures and metadata; without it the inputs are
    those no segment produces, and the outputs those no later segment reads.
    """
    if not segments:
        raise ModelError("no segments to merge")
    plain_ins = {plain.main.tensors[t].name for t in plain.main.inputs} if plain else None
    graph = _MergedGraph(plain_ins)
    for k, seg in enumerate(segments):
        graph.add_segment(k, seg)
    inputs, outputs = graph.boundary(plain)
    main = Subgraph(graph.tensors, graph.ops, inputs, list(dict.fromkeys(outputs)),
                    plain.main.name if plain else segments[0].main.name)
    signatures, metadata = [], list(segments[0].metadata)
    if plain is not None:
        metadata = list(plain.metadata)
        signatures = _signatures(plain, graph.tensors, graph.by_name)
    n_tpu = sum(op.name == EDGETPU_OP for op in graph.ops)
    log.debug("merged %d segment(s): %d operators, %d Edge TPU custom operator(s)",
              len(segments), len(graph.ops), n_tpu)
    return Model(subgraphs=[main], description=segments[0].description,
                 version=segments[0].version, metadata=metadata, signatures=signatures)


@dataclass
class _MergedGraph:
    """The merged subgraph as it grows, one segment after the other."""
    plain_ins: set[str] | None          # the plain model's input names, when given
    tensors: list[Tensor] = field(default_factory=list)
    by_name: dict[str, int] = field(default_factory=dict)   # boundary tensor name -> index
    inputs: list[int] = field(default_factory=list)
    ops: list = field(default_factory=list)
    seg_outputs: list[list[int]] = field(default_factory=list)
    read_by_later: set[int] = field(default_factory=set)

    def add_segment(self, k: int, seg: Model) -> None:
        """Append segment ``k``: its inputs joined by name, its operators and tensors."""
        if len(seg.subgraphs) != 1:
            raise ModelError(f"segment {k} has {len(seg.subgraphs)} subgraphs; only "
                             f"single-subgraph segments can be merged")
        sg = seg.main
        local = self._join_inputs(k, sg)
        self._check_new_outputs(k, sg, local)
        for op in sg.operators:
            self.ops.append(dataclasses.replace(
                op, inputs=self._map(sg, local, op.inputs),
                outputs=self._map(sg, local, op.outputs),
                intermediates=self._map(sg, local, op.intermediates)))
        outs = self._map(sg, local, sg.outputs)
        for t, at in zip(sg.outputs, outs):
            self.by_name.setdefault(sg.tensors[t].name, at)
        self.seg_outputs.append(outs)

    def _join_inputs(self, k: int, sg: Subgraph) -> dict[int, int]:
        """Segment tensor index -> merged index for the segment's inputs: a tensor an
        earlier segment produced, or else a new input of the merged model."""
        local: dict[int, int] = {}
        for t in sg.inputs:
            tensor = sg.tensors[t]
            at = self.by_name.get(tensor.name)
            if at is None:
                if self.plain_ins is not None and tensor.name not in self.plain_ins:
                    raise ModelError(f"segment {k} reads {tensor.name!r}, which no earlier "
                                     f"segment produces and which is not a model input")
                at = self.by_name[tensor.name] = _add(self.tensors, tensor)
                self.inputs.append(at)
            else:
                _same(self.tensors[at], tensor, k)
                self.read_by_later.add(at)
            local[t] = at
        return local

    def _check_new_outputs(self, k: int, sg: Subgraph, local: dict[int, int]) -> None:
        """A segment's outputs (but inputs it passes on) must be names not seen yet."""
        for t in sg.outputs:
            name = sg.tensors[t].name
            if name in self.by_name and t not in local:
                raise ModelError(f"segment {k} produces {name!r} again; segments must "
                                 f"join on unique tensor names")

    def _map(self, sg: Subgraph, local: dict[int, int], idxs) -> list[int]:
        """Merged indices of segment tensors (-1 stays -1), copying in those not seen yet."""
        out = []
        for t in idxs:
            if t >= 0 and t not in local:
                local[t] = _add(self.tensors, sg.tensors[t])
            out.append(local[t] if t >= 0 else -1)
        return out

    def boundary(self, plain: Model | None) -> tuple[list[int], list[int]]:
        """The merged model's inputs and outputs (the outputs may repeat)."""
        if plain is None:
            return self.inputs, [t for outs in self.seg_outputs for t in outs
                                 if t not in self.read_by_later]
        psg = plain.main
        missing = [psg.tensors[t].name for t in psg.outputs
                   if psg.tensors[t].name not in self.by_name]
        if missing:
            raise ModelError(f"no segment produces the model output(s) {missing[:4]}")
        inputs = [self.by_name[psg.tensors[t].name] for t in psg.inputs
                  if psg.tensors[t].name in self.by_name]
        return inputs, [self.by_name[psg.tensors[t].name] for t in psg.outputs]


def _signatures(plain: Model, tensors: list[Tensor], by_name: dict[str, int]) -> list:
    """The plain model's signatures of its main subgraph, on the merged tensors; one
    that names a tensor the segments lack is dropped."""
    psg = plain.main
    names = {t.name: i for i, t in reversed(list(enumerate(tensors)))}
    names.update(by_name)
    signatures = []
    for sig in plain.signatures:
        if sig.subgraph_index != 0:
            continue
        try:
            signatures.append(dataclasses.replace(
                sig, inputs={k: names[psg.tensors[v].name] for k, v in sig.inputs.items()},
                outputs={k: names[psg.tensors[v].name] for k, v in sig.outputs.items()}))
        except KeyError:
            log.info("signature %r names a tensor the segments do not have; dropped",
                     sig.key)
    return signatures


def _add(tensors: list[Tensor], tensor: Tensor) -> int:
    tensors.append(dataclasses.replace(tensor))
    return len(tensors) - 1


def _same(a: Tensor, b: Tensor, k: int) -> None:
    if tuple(a.shape) != tuple(b.shape) or a.type != b.type:
        raise ModelError(f"segment {k} reads {b.name!r} as {b.type_name}{list(b.shape)}, but "
                         f"it was produced as {a.type_name}{list(a.shape)}")
