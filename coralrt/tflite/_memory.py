"""The interpreter's tensor arrays: who else holds them, and inputs resized at will.

``Interpreter.tensor(i)()`` hands out the interpreter's own array of tensor
``i``.  tflite_runtime and LiteRT refuse ``allocate_tensors()``, ``invoke()``
and ``resize_tensor_input()`` while any such array (or a slice, reshape or
other view of it) is still referenced, because those calls may move the
tensors' memory; :func:`held_elsewhere` is how :mod:`coralrt.tflite` tells,
so that a program behaves the same on both (and never writes into an array
the interpreter has stopped reading).  Every view of an array keeps the array
alive, so counting the references to the arrays themselves counts the views.

LiteRT's non-strict ``resize_tensor_input`` may change any dimension of an
input, not only its ``-1`` ones.  :func:`widened` is the model a session
needs for that: the same file with those dimensions made ``-1`` in the
inputs' shape signatures, so that the CPU backend resizes them the way
LiteRT itself does (its strict resize, then its own shape propagation).
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from coralrt._model.types import Model

__all__ = ["held_elsewhere", "widened", "fixed_changes"]


def _counts(arrays: dict) -> dict:
    getrefcount = sys.getrefcount
    return {key: getrefcount(a) for key, a in arrays.items()}


def held_elsewhere(arrays: dict) -> list:
    """The keys of ``arrays`` whose array something besides the dict references
    (an array handed out by ``tensor()``, or a view of it).  Measured against an
    array only a dict holds, so the count does not depend on how this Python
    counts its own temporary references.  Empty where there is no reference
    count to read (not CPython)."""
    if not hasattr(sys, "getrefcount"):
        return []
    baseline = _counts({None: np.empty(0)})[None]
    return [key for key, n in _counts(arrays).items() if n > baseline]


def fixed_changes(shape: tuple, signature: tuple) -> list[int]:
    """The dimensions where ``shape`` differs from a fixed (not ``-1``) one of
    ``signature`` (same rank)."""
    return [d for d, (new, old) in enumerate(zip(shape, signature)) if old != -1 and new != old]


def widened(model: Model, dims: dict[int, set[int]]) -> Model:
    """``model`` with dimensions ``dims[t]`` of input tensor ``t`` made ``-1`` in
    its shape signature (stored shapes unchanged)."""
    main = model.main
    tensors = list(main.tensors)
    for t, which in dims.items():
        tensor = tensors[t]
        sig = list(tensor.shape_signature or tensor.shape)
        for d in which:
            sig[d] = -1
        tensors[t] = dataclasses.replace(tensor, shape_signature=tuple(sig))
    subgraphs = [dataclasses.replace(main, tensors=tensors), *model.subgraphs[1:]]
    return dataclasses.replace(model, subgraphs=subgraphs, source=None)
