"""Structural checks that a model is safe to hand to a native interpreter.

Native TFLite code trusts many invariants; a file that breaks some of them
crashes the process instead of raising.  Every check raises
:class:`~coralrt.errors.ModelError` with the place (subgraph, tensor,
operator) it found the problem.

Each rule is one of three kinds, and its comment says which:

- *crash*: LiteRT dies (SIGSEGV / SIGABRT) on exactly the models the rule
  refuses; the comment names the kernel, function and condition.
- *LiteRT refuses too*: LiteRT rejects the same models with an error; the
  rule only gives the error a place and a clear message.
- *coralrt*: LiteRT runs the model but cannot give a right answer (it reads
  memory nothing wrote, or mislabels a result), or coralrt's own executor,
  partitioner or simulator depends on it.

No rule refuses a model that LiteRT loads, runs and answers correctly; see
docs/model-layer.md for the list and the tests that hold each boundary.
"""

from __future__ import annotations

import math

import numpy as np

from coralrt.errors import ModelError
from coralrt._model.custom_options import check_known_custom_op
from coralrt._model.kernel_view import TYPE_RANGE
from coralrt._model.op_checks import MAX_RANK
from coralrt._model.optional_inputs import check_omitted_inputs
from coralrt._model.quant_checks import check_kernel_quantization
from coralrt._model.types import BUILTIN_NAMES, TYPE_NAMES, Model, Operator, Subgraph, Tensor, \
    packed_size
from coralrt._ops import builtin_specs, resolve

__all__ = ["validate"]

SCHEMA_VERSION = 3
# Kernels count elements in a C int (RuntimeShape::FlatSize, MatchingFlatSize):
# past 2^31 - 1 elements they compute nothing or a wrong answer.  (A tensor of
# more than 2 GiB with fewer elements, a large float tensor, runs correctly.)
_MAX_ELEMENTS = 2**31 - 1
# Integer types whose quantization kernels rescale with.
_RESCALED_TYPES = tuple(TYPE_RANGE)


def validate(model: Model) -> None:
    # LiteRT refuses too: "Model provided is schema version N not equal to
    # supported version 3" (InterpreterBuilder).
    if model.version != SCHEMA_VERSION:
        raise ModelError(f"schema version {model.version} is not supported (TFLite files "
                         f"use version {SCHEMA_VERSION}); the file is damaged or not a "
                         f"TFLite model")
    # LiteRT refuses too: "No subgraph in the model".
    if not model.subgraphs:
        raise ModelError("the model has no subgraphs: there is nothing to run")
    main = model.subgraphs[0]
    # coralrt: a session returns the main subgraph's outputs; with none there
    # is nothing to run (LiteRT invokes such a model and computes nothing).
    # A model with outputs but no operators (they are inputs or constants)
    # runs and is accepted.
    if not main.outputs:
        raise ModelError("the model's main subgraph declares no outputs: there is nothing "
                         "to run", where="subgraph 0")
    for si, sg in enumerate(model.subgraphs):
        _check_subgraph(sg, si, model.subgraphs)
    n_sub = len(model.subgraphs)
    for s in model.signatures:
        where = f"signature {s.key!r}"
        # Crash: LiteRT's signature runner for a signature whose subgraph does
        # not exist dereferences past the subgraph list (SIGSEGV, measured with
        # get_signature_runner).
        if not 0 <= s.subgraph_index < n_sub:
            raise ModelError(f"subgraph index {s.subgraph_index} is out of range (the model "
                             f"has {n_sub} subgraphs)", where=where)
        # coralrt: LiteRT's signature API refuses a missing tensor with an
        # error (the model itself runs), but coralrt's compiler maps every
        # signature tensor into the models it builds.
        sg = model.subgraphs[s.subgraph_index]
        n = len(sg.tensors)
        for name, t in (*s.inputs.items(), *s.outputs.items()):
            if not 0 <= t < n:
                raise ModelError(f"tensor index {t} of {name!r} is out of range", where=where)
        # coralrt, as for the subgraph's outputs: a signature output nothing
        # writes has no value to return (LiteRT plans no memory for it).
        written = {k for op in sg.operators for k in op.outputs} | set(sg.inputs)
        for name, t in s.outputs.items():
            if not _has_value(sg, t, written):
                raise ModelError(f"output {name!r} (tensor {t}, {sg.tensors[t].name!r}) is not "
                                 f"written by any operator, and is not a constant or an input",
                                 where=where)
    _check_call_cycles(model)


def _check_subgraph(sg: Subgraph, si: int, subgraphs: list[Subgraph]) -> None:
    where = f"subgraph {si}"
    for ti, t in enumerate(sg.tensors):
        _check_tensor(t, f"{where}, tensor {ti} ({t.name!r})")
    _check_subgraph_io(sg, where)
    produced: dict[int, int] = {}   # tensor -> the operator that writes it
    types: dict[int, str] = {}   # types LiteRT's kernels give their outputs
    inputs = set(sg.inputs)
    # Tensors an operator may read: inputs, constants, state, earlier results.
    ready = inputs | {i for i, t in enumerate(sg.tensors) if t.is_constant or t.is_variable}
    for oi, op in enumerate(sg.operators):
        _check_operator(sg, oi, op, where, subgraphs, ready, produced, inputs, types)
    _check_outputs_written(sg, produced, inputs, where)


def _check_subgraph_io(sg: Subgraph, where: str) -> None:
    # LiteRT refuses too: "Invalid tensor index N in inputs/outputs".
    n = len(sg.tensors)
    for kind, idxs in (("input", sg.inputs), ("output", sg.outputs)):
        for i in idxs:
            if not 0 <= i < n:
                raise ModelError(f"{kind} tensor index {i} is out of range (the subgraph has "
                                 f"{n} tensors)", where=where)


def _check_operator(sg: Subgraph, oi: int, op: Operator, where: str,
                    subgraphs: list[Subgraph], ready: set[int], produced: dict[int, int],
                    inputs: set[int], types: dict[int, str]) -> None:
    """Check operator ``oi`` of ``sg`` in file order: ``ready`` holds the tensors
    it may read and ``produced`` the writer of each tensor written so far; both
    are updated with its outputs, and ``types`` with the types its kernel gives
    them."""
    owhere = f"{where}, operator {oi} ({op.name})"
    _check_opcode(op, owhere)
    _check_operand_indices(op, len(sg.tensors), owhere)
    check_omitted_inputs(op, owhere, subgraphs)
    _check_inputs_ready(sg, op, ready, owhere)
    ready.update(op.outputs)
    _check_outputs(sg, oi, op, produced, inputs, owhere)
    _check_count_options(op, owhere)
    if op.opcode.is_custom:
        check_known_custom_op(sg, op, owhere)
    else:
        spec = builtin_specs().get(op.name)
        if spec is not None and spec.io_check is not None:
            resolve(spec.io_check)(sg, op, owhere, types)   # before types learns its output
        check_kernel_quantization(sg, op, owhere, types)
        # An output the kernel retypes (a FLOAT32-declared ADD of two uint8
        # inputs is uint8) is held to its zero-point range as that type.
        for k in op.outputs:
            if k >= 0 and types.get(k, sg.tensors[k].type_name) != sg.tensors[k].type_name:
                _check_zero_points(sg.tensors[k], types[k],
                                   f"{where}, tensor {k} ({sg.tensors[k].name!r})")
        if spec is not None and spec.validate is not None:
            resolve(spec.validate)(sg, op, owhere)   # its structural check (op_checks)
    _check_subgraph_references(op, len(subgraphs), owhere)


def _check_opcode(op: Operator, owhere: str) -> None:
    # LiteRT refuses too: "Op builtin_code out of range" / "Operator with
    # CUSTOM builtin_code has no custom_code".
    if not op.opcode.is_custom and op.opcode.builtin_code not in BUILTIN_NAMES:
        raise ModelError(f"unknown builtin operator code {op.opcode.builtin_code}",
                         where=owhere)
    if op.opcode.is_custom and not op.opcode.custom_code:
        raise ModelError("custom operator without a custom code", where=owhere)


def _check_operand_indices(op: Operator, n: int, owhere: str) -> None:
    # LiteRT refuses too ("Invalid tensor index N in node inputs/outputs");
    # coralrt indexes the tensors of every operand (intermediates too).  Only
    # an input may be -1 (an omitted optional input).
    for kind, idxs, optional in (("input", op.inputs, True), ("output", op.outputs, False),
                                 ("intermediate", op.intermediates, False)):
        for i in idxs:
            if not (-1 if optional else 0) <= i < n:
                raise ModelError(f"{kind} tensor index {i} is out of range (the subgraph "
                                 f"has {n} tensors)", where=owhere)


def _check_inputs_ready(sg: Subgraph, op: Operator, ready: set[int], owhere: str) -> None:
    # coralrt: LiteRT runs operators in file order without checking that
    # an operand was written; a kernel then reads arena memory nothing
    # wrote (a wrong answer, or a crash when the garbage is a shape or an
    # index), or refuses ("Input tensor N lacks data").
    for i in op.inputs:
        if i >= 0 and i not in ready:
            raise ModelError(f"input tensor {i} ({sg.tensors[i].name!r}) is read before any "
                             f"operator writes it, and is not a constant or a subgraph "
                             f"input", where=owhere)


def _check_outputs(sg: Subgraph, oi: int, op: Operator, produced: dict[int, int],
                   inputs: set[int], owhere: str) -> None:
    """Check the tensors operator ``oi`` writes, recording it as their writer."""
    for i in op.outputs:
        # LiteRT refuses a tensor that is both an operator's input and output;
        # coralrt's executor and partitioner keep one writer per tensor.
        if i in produced:
            raise ModelError(f"tensor {i} is written by operators {produced[i]} and {oi}",
                             where=owhere)
        produced[i] = oi
        # Crash: a constant lives in the model buffer (kTfLiteMmapRo); the
        # kernel writes its result there, SIGSEGV when the file is mapped
        # read-only (measured with Interpreter(model_path=...)).
        if sg.tensors[i].is_constant:
            raise ModelError(f"output tensor {i} is a constant", where=owhere)
        # coralrt: the operator would overwrite the caller's input, which
        # coralrt feeds anew each run.
        if i in inputs:
            raise ModelError(f"output tensor {i} is also an input of the subgraph",
                             where=owhere)


def _check_count_options(op: Operator, owhere: str) -> None:
    # The spec's count_options (coralrt/_ops/litert.py says what each guards against).
    spec = builtin_specs().get(op.name)
    for option, side in (spec and spec.count_options) or ():
        n_tensors = len(op.inputs if side == "inputs" else op.outputs)
        if op.options.get(option) != n_tensors:
            raise ModelError(f"option {option}={op.options.get(option)} but the operator "
                             f"has {n_tensors} {side}", where=owhere)


def _is_subgraph_option(op: Operator, key: str) -> bool:
    """Whether option ``key`` of ``op`` is the index of a subgraph it calls."""
    return key.endswith("subgraph_index") or (key == "subgraph" and op.name == "CALL")


def _check_subgraph_references(op: Operator, n_sub: int, owhere: str) -> None:
    # LiteRT refuses too (while.cc, if.cc, call_once.cc check the index
    # against the subgraph count); coralrt follows these indices.
    for key, value in op.options.items():
        if _is_subgraph_option(op, key):
            if not 0 <= value < n_sub:
                raise ModelError(f"{key} {value} is out of range (the model has {n_sub} "
                                 f"subgraphs)", where=owhere)


def _check_outputs_written(sg: Subgraph, produced: dict[int, int], inputs: set[int],
                           where: str) -> None:
    # coralrt: LiteRT plans no memory for a tensor nothing writes: it runs the
    # model and then cannot return that output ("Tensor data is null"), and
    # coralrt's executor has no value for it.
    for i in sg.outputs:
        if not _has_value(sg, i, produced.keys() | inputs):
            raise ModelError(f"output tensor {i} ({sg.tensors[i].name!r}) is not written by any "
                             f"operator, and is not a constant or a subgraph input", where=where)


def _has_value(sg: Subgraph, i: int, written) -> bool:
    """Tensor ``i`` is in ``written`` (an operator's output or an input), a constant
    or a variable: something has given it a value to return."""
    t = sg.tensors[i]
    return i in written or t.is_constant or t.is_variable


def _called_subgraphs(sg: Subgraph) -> set[int]:
    called = set()
    for op in sg.operators:
        for key, value in op.options.items():
            if _is_subgraph_option(op, key):
                called.add(int(value))
    return called


def _check_call_cycles(model: Model) -> None:
    # Crash: control-flow kernels (while.cc, if.cc, call_once.cc) prepare the
    # subgraphs they call from their own Prepare; a subgraph that calls itself,
    # directly or through others, recurses until the stack overflows (SIGSEGV,
    # measured with a WHILE whose body is subgraph 0).  Only cycles reachable
    # from a subgraph LiteRT runs (the main one or a signature's) are prepared.
    calls = [_called_subgraphs(sg) for sg in model.subgraphs]
    entries = {0} | {s.subgraph_index for s in model.signatures}
    state: dict[int, int] = {}   # 1: on the current path, 2: done

    def visit(si: int, path: list[int]) -> None:
        state[si] = 1
        for callee in sorted(calls[si]):
            if state.get(callee) == 1:
                cycle = " -> ".join(str(i) for i in [*path[path.index(callee):], callee])
                raise ModelError(f"subgraphs call each other in a cycle ({cycle}); LiteRT "
                                 f"would recurse until its stack overflows",
                                 where=f"subgraph {si}")
            if state.get(callee) is None:
                visit(callee, [*path, callee])
        state[si] = 2

    for entry in sorted(entries):
        if state.get(entry) is None:
            visit(entry, [entry])


def _check_quantization(t: Tensor, where: str) -> None:
    q = t.quantization
    if q is None or not q.scale.size:
        return
    # LiteRT refuses too: "QuantizationParam has N zero_point values and M
    # scale values" (InterpreterBuilder::ParseQuantization).
    if q.zero_point.size not in (0, q.scale.size):
        raise ModelError(f"quantization has {q.scale.size} scales but "
                         f"{q.zero_point.size} zero points", where=where)
    # LiteRT refuses too: "quantized_dimension must be in range" and "num_scales
    # must be 1 for per-layer quantization, or N for per-axis quantization".
    if q.scale.size > 1:
        if not 0 <= q.quantized_dimension < len(t.shape):
            raise ModelError(f"quantized_dimension {q.quantized_dimension} is outside "
                             f"shape {list(t.shape)}", where=where)
        if t.shape[q.quantized_dimension] != q.scale.size:
            raise ModelError(f"{q.scale.size} per-channel scales for dimension "
                             f"{q.quantized_dimension} of size "
                             f"{t.shape[q.quantized_dimension]}", where=where)
    # coralrt: an integer tensor's real value is scale * (q - zero_point).  A
    # scale of 0, infinity or NaN gives it no value kernels can rescale: they
    # divide by it (undefined in LiteRT's integer kernels; several abort, see
    # quant_checks.py) and the simulator cannot reproduce a division by zero.
    # Negative scales are well defined and left to quant_checks.py, as are
    # tiny and huge ones.
    if t.type_name in _RESCALED_TYPES and (not np.all(np.isfinite(q.scale))
                                           or np.any(q.scale == 0)):
        raise ModelError(f"quantization scale {q.scale[:4].tolist()} is 0 or not finite",
                         where=where)
    # A zero point outside the type's range (a uint8 tensor with zero point
    # 36192: one flipped byte of a real model's int64) names values the type
    # cannot hold, and no kernel set agrees on what to do with it.  LiteRT's
    # reference kernels abort on it (SIGABRT, a uint8 convolution's output in a
    # real MobileNet), its default kernels die on a QUANTIZE (SIGSEGV) and
    # otherwise the XNNPACK delegate refuses the operator ("unsupported
    # zero-point value"), leaving builtin kernels that answer zeros; the
    # simulated Edge TPU and the NumPy backend follow TFLite's quantization
    # spec.  Zero points are checked as the file stores them (int64): LiteRT
    # truncates them to 32 bits, which turns no out-of-range value into a
    # meaningful one.
    _check_zero_points(t, t.type_name, where)


def _check_zero_points(t: Tensor, type_name: str, where: str) -> None:
    """The zero points of ``t``, seen as a ``type_name`` tensor, are in its range."""
    q = t.quantization
    if type_name not in _RESCALED_TYPES or q is None or not q.scale.size \
            or not q.zero_point.size:
        return
    lo, hi = TYPE_RANGE[type_name]
    zps = np.asarray(q.zero_point, np.int64)
    if zps.min() < lo or zps.max() > hi:
        bad = zps[(zps < lo) | (zps > hi)]
        raise ModelError(f"zero point {int(bad[0])} is outside the {type_name} range "
                         f"[{lo}, {hi}]", where=where)


def _check_tensor(t: Tensor, where: str) -> None:
    # LiteRT refuses too: "Unsupported data type N in tensor".
    if t.type not in TYPE_NAMES:
        raise ModelError(f"unknown tensor type {t.type}", where=where)
    # coralrt: tensors are NumPy arrays in coralrt (and in LiteRT's Python
    # API), which hold at most MAX_RANK dimensions.
    if len(t.shape) > MAX_RANK:
        raise ModelError(f"rank {len(t.shape)} exceeds {MAX_RANK}, the most dimensions a "
                         f"NumPy array holds", where=where)
    # LiteRT refuses too: "BytesRequired number of elements overflowed".
    if any(d < 0 for d in t.shape):
        raise ModelError(f"shape {list(t.shape)} has a negative dimension", where=where)
    n = math.prod(t.shape)
    if n > _MAX_ELEMENTS:
        raise ModelError(f"shape {list(t.shape)} has {n} elements, more than TFLite's kernels "
                         f"count (2^31 - 1)", where=where)
    if t.is_constant and not t.extra.get("sparsity"):
        want = packed_size(t.type, t.shape)
        # Fewer bytes: LiteRT refuses too ("required_bytes <= bytes").  More
        # bytes: coralrt (LiteRT ignores the rest, coralrt reads a constant as
        # an array of its shape).
        if want is not None and want != t.buffer.nbytes:
            raise ModelError(f"constant data has {t.buffer.nbytes} bytes but shape "
                             f"{list(t.shape)} of {t.type_name} needs {want}", where=where)
    _check_quantization(t, where)
