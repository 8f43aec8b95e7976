"""Structural checks that a model is safe to hand to a native interpreter.

Native TFLite code trusts many of these invariants; a file that breaks them
can crash the process instead of raising.  Every check raises
:class:`~coralrt.errors.ModelError` with the place (subgraph, tensor,
operator) it found the problem.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import ModelError
from coralrt.model.custom_options import check_known_custom_op
from coralrt.model.op_checks import check_builtin_op
from coralrt.model.optional_inputs import check_omitted_inputs
from coralrt.model.types import BUILTIN_NAMES, TYPE_NAMES, Model, Subgraph, Tensor, packed_size

__all__ = ["validate"]

SCHEMA_VERSION = 3
_MAX_RANK = 16
# TFLite flatbuffers, arenas and kernels index tensors with 32-bit sizes.
_MAX_TENSOR_BYTES = 2**31 - 1
_ZERO_POINT_RANGE = {"UINT8": (0, 255), "INT8": (-128, 127), "INT16": (-32768, 32767),
                     "INT32": (-(2**31), 2**31 - 1)}
# Input/output scale ratios of real quantized models stay within a few
# hundred; these bounds leave ample room while keeping fixed-point shifts valid.
_MIN_RATIO, _MAX_RATIO = 2.0**-24, 2.0**18
# Operators that only move or compare 8-bit values and need no scale.
_TYPE_ONLY_OPS = frozenset({
    "CAST", "RESHAPE", "SQUEEZE", "EXPAND_DIMS", "GATHER", "GATHER_ND", "TRANSPOSE", "SLICE",
    "STRIDED_SLICE", "SHAPE", "TILE", "BROADCAST_TO", "PACK", "UNPACK", "SPLIT", "SPLIT_V",
    "PAD", "PADV2", "MIRROR_PAD", "ARG_MAX", "ARG_MIN", "EQUAL", "NOT_EQUAL", "LESS",
    "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "SELECT", "SELECT_V2", "ZEROS_LIKE", "FILL",
    "DEPTH_TO_SPACE", "SPACE_TO_DEPTH", "BATCH_TO_SPACE_ND", "SPACE_TO_BATCH_ND",
    "REVERSE_V2", "WHERE", "TOPK_V2", "ONE_HOT", "BITCAST", "RANK", "SCATTER_ND",
    "WHILE", "IF", "CALL_ONCE", "EMBEDDING_LOOKUP", "DYNAMIC_UPDATE_SLICE",
})
# Options that must equal a count of the operator's tensors.
_COUNT_OPTIONS = {
    "SPLIT": (("num_splits", "outputs"),), "SPLIT_V": (("num_splits", "outputs"),),
    "PACK": (("values_count", "inputs"),), "UNPACK": (("num", "outputs"),),
}


def validate(model: Model) -> None:
    if model.version != SCHEMA_VERSION:
        raise ModelError(f"schema version {model.version} is not supported (TFLite files "
                         f"use version {SCHEMA_VERSION}); the file is damaged or not a "
                         f"TFLite model")
    if not model.subgraphs:
        raise ModelError("the model has no subgraphs: there is nothing to run")
    main = model.subgraphs[0]
    if not main.operators:
        raise ModelError("the model's main subgraph has no operators: there is nothing to run",
                         where="subgraph 0")
    if not main.outputs:
        raise ModelError("the model's main subgraph declares no outputs", where="subgraph 0")
    for si, sg in enumerate(model.subgraphs):
        _check_subgraph(sg, si, model.subgraphs)
    n_sub = len(model.subgraphs)
    for s in model.signatures:
        where = f"signature {s.key!r}"
        if not 0 <= s.subgraph_index < n_sub:
            raise ModelError(f"subgraph index {s.subgraph_index} is out of range (the model "
                             f"has {n_sub} subgraphs)", where=where)
        n = len(model.subgraphs[s.subgraph_index].tensors)
        for name, t in (*s.inputs.items(), *s.outputs.items()):
            if not 0 <= t < n:
                raise ModelError(f"tensor index {t} of {name!r} is out of range", where=where)


def _check_subgraph(sg: Subgraph, si: int, subgraphs: list[Subgraph]) -> None:
    where = f"subgraph {si}"
    n_sub = len(subgraphs)
    n = len(sg.tensors)
    for ti, t in enumerate(sg.tensors):
        _check_tensor(t, f"{where}, tensor {ti} ({t.name!r})")
    for kind, idxs in (("input", sg.inputs), ("output", sg.outputs)):
        for i in idxs:
            if not 0 <= i < n:
                raise ModelError(f"{kind} tensor index {i} is out of range (the subgraph has "
                                 f"{n} tensors)", where=where)
    produced: dict[int, int] = {}
    inputs = set(sg.inputs)
    # Tensors an operator may read: inputs, constants, state, earlier results.
    ready = inputs | {i for i, t in enumerate(sg.tensors) if t.is_constant or t.is_variable}
    for oi, op in enumerate(sg.operators):
        owhere = f"{where}, operator {oi} ({op.name})"
        if not op.opcode.is_custom and op.opcode.builtin_code not in BUILTIN_NAMES:
            raise ModelError(f"unknown builtin operator code {op.opcode.builtin_code}",
                             where=owhere)
        if op.opcode.is_custom and not op.opcode.custom_code:
            raise ModelError("custom operator without a custom code", where=owhere)
        for kind, idxs, optional in (("input", op.inputs, True), ("output", op.outputs, False),
                                     ("intermediate", op.intermediates, False)):
            for i in idxs:
                if not (-1 if optional else 0) <= i < n:
                    raise ModelError(f"{kind} tensor index {i} is out of range (the subgraph "
                                     f"has {n} tensors)", where=owhere)
        check_omitted_inputs(op, owhere, subgraphs)
        for i in op.inputs:
            if i >= 0 and i not in ready:
                raise ModelError(f"input tensor {i} ({sg.tensors[i].name!r}) is read before any "
                                 f"operator writes it, and is not a constant or a subgraph "
                                 f"input", where=owhere)
        ready.update(op.outputs)
        for i in op.outputs:
            if i in produced:
                raise ModelError(f"tensor {i} is written by operators {produced[i]} and {oi}",
                                 where=owhere)
            produced[i] = oi
            if sg.tensors[i].is_constant:
                raise ModelError(f"output tensor {i} is a constant", where=owhere)
            if i in inputs:
                raise ModelError(f"output tensor {i} is also an input of the subgraph",
                                 where=owhere)
        for option, side in _COUNT_OPTIONS.get(op.name, ()):
            n_tensors = len(op.inputs if side == "inputs" else op.outputs)
            if op.options.get(option) != n_tensors:
                raise ModelError(f"option {option}={op.options.get(option)} but the operator "
                                 f"has {n_tensors} {side}", where=owhere)
        _check_rescale(sg, op, owhere)
        _check_quantized_operands(sg, op, owhere)
        if op.opcode.is_custom:
            check_known_custom_op(sg, op, owhere)
        else:
            check_builtin_op(sg, op, owhere)
        for key, value in op.options.items():
            if key.endswith("subgraph_index") or (key == "subgraph" and op.name == "CALL"):
                if not 0 <= value < n_sub:
                    raise ModelError(f"{key} {value} is out of range (the model has {n_sub} "
                                     f"subgraphs)", where=owhere)
    # LiteRT plans no memory for a tensor nothing writes: it runs the model and
    # then cannot return that output ("Tensor data is null"), and coralrt's
    # executor has no value for it.
    for i in sg.outputs:
        t = sg.tensors[i]
        if i not in produced and i not in inputs and not t.is_constant and not t.is_variable:
            raise ModelError(f"output tensor {i} ({t.name!r}) is not written by any operator, "
                             f"and is not a constant or a subgraph input", where=where)


def _eight_bit_kernel(sg: Subgraph, op) -> bool:
    # A builtin kernel's type follows its first input.
    return (bool(op.inputs) and op.inputs[0] >= 0
            and sg.tensors[op.inputs[0]].type_name in ("UINT8", "INT8"))


def _scale(sg: Subgraph, i: int, any_type: bool) -> float | None:
    t = sg.tensors[i]
    q = t.quantization
    if q is None or q.scale.size != 1 or t.is_constant:
        return None
    if not any_type and t.type_name not in _ZERO_POINT_RANGE:
        return None
    return float(q.scale[0])


def _check_rescale(sg: Subgraph, op, where: str) -> None:
    # Quantized kernels turn scale ratios into fixed-point multipliers and
    # shifts at prepare time; ratios far outside what any trained model has
    # overflow those shifts inside the native code instead of failing cleanly.
    # An 8-bit kernel reads every operand's scale, whatever type it declares.
    any_type = not op.opcode.is_custom and _eight_bit_kernel(sg, op)
    outs = [s for s in (_scale(sg, o, any_type) for o in op.outputs) if s]
    if not outs:
        return
    for i in op.inputs:
        s_in = _scale(sg, i, any_type) if i >= 0 else None
        if s_in:
            ratio = s_in / outs[0]
            if not _MIN_RATIO <= ratio <= _MAX_RATIO:
                raise ModelError(f"input scale {s_in:g} and output scale {outs[0]:g} differ by a "
                                 f"factor of {ratio:g}, outside what quantized kernels can "
                                 f"represent", where=where)


def _check_quantized_operands(sg: Subgraph, op, where: str) -> None:
    # Quantized kernels read scale and zero point without checking they exist
    # and abort the process when they do not.
    if op.opcode.is_custom or op.name in _TYPE_ONLY_OPS:
        return
    operands = [i for i in (*op.inputs, *op.outputs) if i >= 0]
    if op.name == "DEQUANTIZE":
        operands = [i for i in op.inputs if i >= 0]
    elif op.name == "QUANTIZE":
        operands = [i for i in op.outputs] + [i for i in op.inputs if i >= 0 and
                                              sg.tensors[i].type_name in ("UINT8", "INT8")]
    # An 8-bit kernel reads the quantization of every operand, whatever type
    # the operand declares.
    eight_bit_kernel = _eight_bit_kernel(sg, op)
    for i in operands:
        t = sg.tensors[i]
        if t.is_constant or (t.type_name not in ("UINT8", "INT8") and not eight_bit_kernel):
            continue
        if t.quantization is None or not t.quantization.scale.size:
            raise ModelError(f"{t.type_name} tensor {i} ({t.name!r}) has no quantization "
                             f"parameters, which {op.name} needs", where=where)


def _check_quantization(t: Tensor, where: str) -> None:
    q = t.quantization
    if q is None or not q.scale.size:
        return
    if not np.all(np.isfinite(q.scale)) or np.any(q.scale < 0):
        raise ModelError(f"quantization scale {q.scale[:4].tolist()} is negative or not finite",
                         where=where)
    limits = _ZERO_POINT_RANGE.get(t.type_name)
    if limits is not None and q.zero_point.size:
        if np.any(q.scale == 0) and t.type_name != "INT32":
            raise ModelError("quantization scale is 0", where=where)
        lo, hi = limits
        if q.zero_point.min() < lo or q.zero_point.max() > hi:
            raise ModelError(f"zero point {q.zero_point[:4].tolist()} is outside the "
                             f"{t.type_name} range [{lo}, {hi}]", where=where)


def _check_tensor(t: Tensor, where: str) -> None:
    if t.type not in TYPE_NAMES:
        raise ModelError(f"unknown tensor type {t.type}", where=where)
    if len(t.shape) > _MAX_RANK:
        raise ModelError(f"rank {len(t.shape)} exceeds {_MAX_RANK}", where=where)
    if any(d < 0 for d in t.shape):
        raise ModelError(f"shape {list(t.shape)} has a negative dimension", where=where)
    size = packed_size(t.type, t.shape)
    if size is not None and size > _MAX_TENSOR_BYTES:
        raise ModelError(f"shape {list(t.shape)} of {t.type_name} needs {size} bytes, more "
                         f"than a TFLite tensor can hold (2 GiB)", where=where)
    if t.shape_signature is not None and len(t.shape_signature) not in (0, len(t.shape)):
        raise ModelError(f"shape_signature {list(t.shape_signature)} does not have the rank "
                         f"of shape {list(t.shape)}", where=where)
    if t.shape_signature and any(
            s != d and s != -1 for s, d in zip(t.shape_signature, t.shape)):
        raise ModelError(f"shape_signature {list(t.shape_signature)} disagrees with shape "
                         f"{list(t.shape)}", where=where)
    if t.is_constant and not t.extra.get("sparsity"):
        want = packed_size(t.type, t.shape)
        if want is not None and want != t.buffer.nbytes:
            raise ModelError(f"constant data has {t.buffer.nbytes} bytes but shape "
                             f"{list(t.shape)} of {t.type_name} needs {want}", where=where)
    _check_quantization(t, where)
    q = t.quantization
    if q is not None and q.scale.size:
        if q.zero_point.size not in (0, q.scale.size):
            raise ModelError(f"quantization has {q.scale.size} scales but "
                             f"{q.zero_point.size} zero points", where=where)
        if q.scale.size > 1:
            if not 0 <= q.quantized_dimension < len(t.shape):
                raise ModelError(f"quantized_dimension {q.quantized_dimension} is outside "
                                 f"shape {list(t.shape)}", where=where)
            if t.shape[q.quantized_dimension] != q.scale.size:
                raise ModelError(f"{q.scale.size} per-channel scales for dimension "
                                 f"{q.quantized_dimension} of size "
                                 f"{t.shape[q.quantized_dimension]}", where=where)
