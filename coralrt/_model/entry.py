"""A model whose entry is another subgraph: how a signature on subgraph ``k`` runs.

Runtimes (LiteRT's whole-model programs, coralrt's compiler) run subgraph 0.
:func:`with_entry` swaps subgraphs 0 and ``k`` and renumbers every reference
to them (control-flow operators' subgraph options, signatures), so that the
result runs subgraph ``k`` of the original.
"""

from __future__ import annotations

import dataclasses

from coralrt._model.types import Model, Subgraph

__all__ = ["with_entry"]


def with_entry(model: Model, k: int) -> Model:
    """``model`` with subgraphs 0 and ``k`` swapped (and every reference to them),
    so that a runtime running subgraph 0 runs ``k``."""
    def swap(i: int) -> int:
        return k if i == 0 else 0 if i == k else i

    def calls(op, key: str) -> bool:
        return key.endswith("subgraph_index") or (key == "subgraph" and op.name == "CALL")

    subgraphs = []
    for j in range(len(model.subgraphs)):
        sg = model.subgraphs[swap(j)]
        ops = [dataclasses.replace(op, options={key: swap(int(v)) if calls(op, key) else v
                                                for key, v in op.options.items()})
               if any(calls(op, key) for key in op.options) else op for op in sg.operators]
        subgraphs.append(Subgraph(sg.tensors, ops, sg.inputs, sg.outputs, sg.name))
    return dataclasses.replace(
        model, subgraphs=subgraphs, source=None,
        signatures=[dataclasses.replace(s, subgraph_index=swap(s.subgraph_index))
                    for s in model.signatures])
