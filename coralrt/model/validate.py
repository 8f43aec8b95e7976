"""Structural checks that a model is safe to hand to a native interpreter.

Native TFLite code trusts many of these invariants; a file that breaks them
can crash the process instead of raising.  Every check raises
:class:`~coralrt.errors.ModelError` with the place (subgraph, tensor,
operator) it found the problem.
"""

from __future__ import annotations

from coralrt.errors import ModelError
from coralrt.model.types import BUILTIN_NAMES, TYPE_NAMES, Model, Subgraph, Tensor, packed_size

__all__ = ["validate"]

SCHEMA_VERSION = 3
_MAX_RANK = 16
# TFLite flatbuffers, arenas and kernels index tensors with 32-bit sizes.
_MAX_TENSOR_BYTES = 2**31 - 1


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
    n_sub = len(model.subgraphs)
    for si, sg in enumerate(model.subgraphs):
        _check_subgraph(sg, si, n_sub)
    for s in model.signatures:
        where = f"signature {s.key!r}"
        if not 0 <= s.subgraph_index < n_sub:
            raise ModelError(f"subgraph index {s.subgraph_index} is out of range (the model "
                             f"has {n_sub} subgraphs)", where=where)
        n = len(model.subgraphs[s.subgraph_index].tensors)
        for name, t in (*s.inputs.items(), *s.outputs.items()):
            if not 0 <= t < n:
                raise ModelError(f"tensor index {t} of {name!r} is out of range", where=where)


def _check_subgraph(sg: Subgraph, si: int, n_sub: int) -> None:
    where = f"subgraph {si}"
    n = len(sg.tensors)
    for ti, t in enumerate(sg.tensors):
        _check_tensor(t, f"{where}, tensor {ti} ({t.name!r})")
    for kind, idxs in (("input", sg.inputs), ("output", sg.outputs)):
        for i in idxs:
            if not 0 <= i < n:
                raise ModelError(f"{kind} tensor index {i} is out of range (the subgraph has "
                                 f"{n} tensors)", where=where)
    produced: dict[int, int] = {}
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
        for i in op.outputs:
            if i in produced:
                raise ModelError(f"tensor {i} is written by operators {produced[i]} and {oi}",
                                 where=owhere)
            produced[i] = oi
            if sg.tensors[i].is_constant:
                raise ModelError(f"output tensor {i} is a constant", where=owhere)
        for key, value in op.options.items():
            if key.endswith("subgraph_index") or (key == "subgraph" and op.name == "CALL"):
                if not 0 <= value < n_sub:
                    raise ModelError(f"{key} {value} is out of range (the model has {n_sub} "
                                     f"subgraphs)", where=owhere)


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
