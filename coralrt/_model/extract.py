"""Cut a set of operators out of a model into a standalone model.

The partitioner uses this to hand CPU segments to the CPU backend and TPU
segments to a compiler: each piece is a valid ``.tflite`` whose inputs and
outputs are exactly the tensors that cross the cut.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coralrt.errors import ModelError

if TYPE_CHECKING:   # types.py imports this module: annotations only
    from coralrt._model.types import Model, Subgraph

__all__ = ["Extracted", "extract", "boundary"]


@dataclass
class Extracted:
    model: Model
    inputs: list[int]          # original tensor indices, in the piece's input order
    outputs: list[int]         # original tensor indices, in the piece's output order
    tensor_map: dict[int, int]  # original tensor index -> index in the piece


def boundary(sg: Subgraph, op_indices) -> tuple[list[int], list[int]]:
    """(inputs, outputs) of the cut, as original tensor indices.

    Inputs are the non-constant, non-variable tensors read by the operators
    but produced outside them.  Outputs are the tensors the operators produce
    that an operator outside the cut reads, or that are subgraph outputs.
    Subgraph inputs/outputs keep their order first, then tensor index order.
    """
    chosen = set(op_indices)
    produced = {t for i in chosen for t in sg.operators[i].outputs}
    read_inside = {t for i in chosen for t in sg.operators[i].inputs if t >= 0}
    read_outside = {t for i, op in enumerate(sg.operators) if i not in chosen
                    for t in op.inputs if t >= 0}
    ins = {t for t in read_inside - produced
           if not sg.tensors[t].is_constant and not sg.tensors[t].is_variable}
    outs = {t for t in produced if t in read_outside or t in sg.outputs}
    if not outs:  # a piece whose results nobody reads still needs outputs to be valid
        outs = produced - read_inside
    return _ordered(ins, sg.inputs), _ordered(outs, sg.outputs)


def _ordered(tensors: set[int], first: list[int]) -> list[int]:
    head = [t for t in dict.fromkeys(first) if t in tensors]
    return head + sorted(tensors - set(head))


def extract(model: Model, op_indices, subgraph: int = 0) -> Extracted:
    sg = model.subgraphs[subgraph]
    ops = sorted(set(int(i) for i in op_indices))
    if not ops:
        raise ModelError("cannot extract an empty set of operators", where=f"subgraph {subgraph}")
    bad = [i for i in ops if not 0 <= i < len(sg.operators)]
    if bad:
        raise ModelError(f"operator indices {bad} are out of range (the subgraph has "
                         f"{len(sg.operators)} operators)", where=f"subgraph {subgraph}")
    inputs, outputs = boundary(sg, ops)
    used: dict[int, None] = dict.fromkeys(inputs)
    for i in ops:
        used.update(dict.fromkeys(sg.operators[i].tensor_indices()))
    used.update(dict.fromkeys(outputs))
    tensor_map = {old: new for new, old in enumerate(used)}

    def remap(idxs):
        return [tensor_map[t] if t >= 0 else -1 for t in idxs]

    new_ops = [
        dataclasses.replace(op, inputs=remap(op.inputs), outputs=remap(op.outputs),
                            intermediates=remap(op.intermediates))
        for op in (sg.operators[i] for i in ops)
    ]
    piece = dataclasses.replace(
        sg, tensors=[dataclasses.replace(sg.tensors[t]) for t in used],
        operators=new_ops, inputs=remap(inputs), outputs=remap(outputs))
    # Other subgraphs stay where they are so control-flow operators' subgraph
    # indices remain valid.
    subgraphs = list(model.subgraphs)
    subgraphs[subgraph] = piece
    if subgraph != 0:
        subgraphs[0], subgraphs[subgraph] = subgraphs[subgraph], subgraphs[0]
        _swap_subgraph_refs(subgraphs, 0, subgraph)
    # A new model keeping only the description and version (no metadata,
    # signatures or source bytes, which describe the whole model).
    new = dataclasses.replace(model, subgraphs=subgraphs, buffers=[], metadata=[],
                              signatures=[], metadata_buffer=[], source=None)
    return Extracted(new, inputs, outputs, tensor_map)


def _swap_subgraph_refs(subgraphs: list[Subgraph], a: int, b: int) -> None:
    swap = {a: b, b: a}
    for sg in subgraphs:
        for j, op in enumerate(sg.operators):
            refs = {k: swap[v] for k, v in op.options.items()
                    if k.endswith("subgraph_index") and v in swap}
            if refs:
                sg.operators[j] = dataclasses.replace(op, options={**op.options, **refs})
