"""The shapes LiteRT gives dynamic tensors while it prepares a model.

A converter that cannot size a tensor writes -1 in its ``shape_signature``
and some placeholder in its shape; LiteRT's kernels resize their outputs to
what they compute in Prepare, so the placeholder never matters to LiteRT
(a text embedder's CONCATENATION of token ids is declared ``[1]`` and
computes ``[2]``).  coralrt's NumPy backend and the CPU steps of compiled
models plan from the shapes a :class:`Model` holds, so :func:`with_prepared_shapes`
gives them the computed ones, operator by operator in execution order, for
the operators whose output shape validation computes too
(:mod:`coralrt._model.op_checks`): element-wise, broadcasting,
CONCATENATION and FULLY_CONNECTED.  Only dimensions that are -1 in the
signature change; a tensor whose shape an unlisted operator computes keeps
what the file says.  Such tensors never map to the Edge TPU (its rules ask
for static shapes), so no segment is planned from them.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from coralrt._model.types import Model, Operator, Subgraph, Tensor

__all__ = ["with_prepared_shapes", "computed_shape"]


def _dynamic(t: Tensor) -> bool:
    return bool(t.shape_signature) and -1 in t.shape_signature


def _validator(name: str) -> str | None:
    from coralrt._ops import builtin_specs
    spec = builtin_specs().get(name)
    ref = getattr(spec, "validate", None) if spec is not None else None
    target = getattr(ref, "target", None)
    return target.rpartition(":")[2] if isinstance(target, str) else None


def computed_shape(tensors: list[Tensor], op: Operator) -> tuple[int, ...] | None:
    """The shape LiteRT's kernel gives ``op`` 's output 0 (None: not known here)."""
    ins = [tensors[i] if i >= 0 else None for i in op.inputs]
    if not ins or ins[0] is None:
        return None
    kind = _validator(op.name)
    if kind == "same_shape":
        return tuple(ins[0].shape)
    if kind == "broadcast" and len(ins) == 2 and ins[1] is not None:
        try:
            return tuple(int(d) for d in np.broadcast_shapes(ins[0].shape, ins[1].shape))
        except ValueError:
            return None
    if kind == "concatenation" and all(t is not None for t in ins):
        first = tuple(ins[0].shape)
        axis = int(op.options.get("axis", 0))
        axis = axis + len(first) if axis < 0 else axis
        if not 0 <= axis < len(first) or any(len(t.shape) != len(first) for t in ins):
            return None
        return first[:axis] + (sum(int(t.shape[axis]) for t in ins),) + first[axis + 1:]
    if kind == "fully_connected" and len(ins) > 1 and ins[1] is not None \
            and len(ins[1].shape) == 2 and ins[1].shape[1]:
        units, depth = ins[1].shape
        if op.options.get("keep_num_dims"):
            return tuple(ins[0].shape[:-1]) + (int(units),)
        return (math.prod(ins[0].shape) // depth, int(units))
    return None


def _prepared(sg: Subgraph) -> Subgraph | None:
    tensors, changed = list(sg.tensors), False
    for op in sg.operators:
        if not op.outputs or not 0 <= op.outputs[0] < len(tensors):
            continue
        out = tensors[op.outputs[0]]
        if not _dynamic(out):
            continue
        want = computed_shape(tensors, op)
        if want is None or want == tuple(out.shape) or len(want) != len(out.shape):
            continue
        shape = tuple(w if s == -1 else d for d, s, w in
                      zip(out.shape, out.shape_signature, want)) \
            if len(out.shape_signature) == len(want) else tuple(out.shape)
        if shape != tuple(out.shape):
            tensors[op.outputs[0]] = dataclasses.replace(out, shape=shape)
            changed = True
    return dataclasses.replace(sg, tensors=tensors) if changed else None


def with_prepared_shapes(model: Model) -> Model:
    """``model`` with its dynamic tensors sized as LiteRT's Prepare sizes them (the
    same object when nothing changes).  ``source`` stays the bytes read: LiteRT,
    given them, resizes the same way."""
    subgraphs = [_prepared(sg) for sg in model.subgraphs]
    if all(s is None for s in subgraphs):
        return model
    return dataclasses.replace(model, subgraphs=[new or old for new, old in
                                                 zip(subgraphs, model.subgraphs)])
