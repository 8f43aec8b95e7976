"""A request's inputs in program order, and its outputs by name.

The session's per-request path turns what a caller passes (a dict by input
name, a list in input order, one array for a one-input model) into the list
a program takes (:func:`order_feed`), and picks the outputs a caller asked
for (:func:`pick`).  :func:`unique_names` makes output names usable as dict
keys when a model repeats one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from coralrt.errors import InputError

__all__ = ["order_feed", "pick", "unique_names"]


def order_feed(inputs, names: list[str], positions: Mapping[str, int]) -> list:
    """``inputs`` as a list in the order of ``names`` (InputError when they do not match)."""
    n = len(names)
    if isinstance(inputs, Mapping):
        unknown = [k for k in inputs if k not in positions]
        missing = [k for k in names if k not in inputs]
        if unknown or missing:
            parts = []
            if missing:
                parts.append(f"missing {missing}")
            if unknown:
                parts.append(f"unknown {unknown}")
            raise InputError(f"inputs do not match the model: {', '.join(parts)}; the "
                             f"model's inputs are {names}")
        return [inputs[k] for k in names]
    if isinstance(inputs, np.ndarray):
        if n != 1:
            raise InputError(f"the model has {n} inputs {names}; pass a dict "
                             f"by name or a list in that order, not one array")
        return [inputs]
    if isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)):
        if len(inputs) != n:
            raise InputError(f"the model has {n} input(s) {names}, got "
                             f"{len(inputs)} value(s)")
        return list(inputs)
    raise InputError(f"inputs must be a dict by name, a list in input order or a numpy "
                     f"array, got {type(inputs).__name__}")


def pick(results: dict, names, known: list[str]) -> dict[str, np.ndarray]:
    """The entries of ``results`` named by ``names`` (one name or a list), in that order."""
    if isinstance(names, str):
        names = [names]
    picked = {}
    for name in names:
        if name not in results:
            raise InputError(f"unknown output {name!r}; the outputs are {known}")
        picked[name] = results[name]
    return picked


def unique_names(names: list[str]) -> list[str]:
    """``names`` with repeats suffixed ``:1``, ``:2`` ... in order."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if k == 0 else f"{n}:{k}")
    return out
