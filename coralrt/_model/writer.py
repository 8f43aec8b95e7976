"""Write a :class:`~coralrt._model.types.Model` as a TFLite flatbuffer.

The on-disk tables that the object graph does not keep as indices (the
buffer list and the operator-code list) are rebuilt here: buffer 0 is the
empty sentinel TFLite expects, then every buffer in ``model.buffers`` order,
then any buffer only reachable from a tensor or metadata entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from coralrt._model import flatbuf
from coralrt._model._schema import UNIONS

if TYPE_CHECKING:   # types.py imports this module: annotations only
    from coralrt._model.types import Buffer, Model, Operator, Quantization, Tensor

__all__ = ["write_model"]

_OPTION_CODES = {name: code for code, name in UNIONS["BuiltinOptions"].items()}
_PLACEHOLDER = 127  # deprecated_builtin_code for codes that do not fit in int8


def write_model(model: Model) -> bytes:
    buffer_index: dict[int, int] = {}
    buffers: list[dict] = [{}]

    def index_of(buf: Buffer | None) -> int:
        if buf is None or buf.nbytes == 0:
            return 0
        i = buffer_index.get(id(buf))
        if i is None:
            i = buffer_index[id(buf)] = len(buffers)
            buffers.append({"data": buf.data})
        return i

    for b in model.buffers:
        if b.nbytes:
            index_of(b)
    codes = model.operator_codes
    code_index = {c: i for i, c in enumerate(codes)}
    tree = {
        "version": model.version,
        "operator_codes": [
            {"deprecated_builtin_code": min(c.builtin_code, _PLACEHOLDER),
             "builtin_code": c.builtin_code, "custom_code": c.custom_code,
             "version": c.version}
            for c in codes
        ],
        "subgraphs": [
            {
                "tensors": [_tensor(t, index_of(t.buffer)) for t in sg.tensors],
                "inputs": sg.inputs,
                "outputs": sg.outputs,
                "operators": [_operator(op, code_index[op.opcode]) for op in sg.operators],
                "name": sg.name or None,
            }
            for sg in model.subgraphs
        ],
        "description": model.description or None,
        "metadata": [{"name": m.name, "buffer": index_of(m.buffer) if m.buffer.nbytes
                      else _empty(buffers)} for m in model.metadata] or None,
        "signature_defs": [
            {"signature_key": s.key, "subgraph_index": s.subgraph_index,
             "inputs": [{"name": k, "tensor_index": v} for k, v in s.inputs.items()],
             "outputs": [{"name": k, "tensor_index": v} for k, v in s.outputs.items()]}
            for s in model.signatures
        ] or None,
        "metadata_buffer": model.metadata_buffer or None,
    }
    tree["buffers"] = buffers
    size = sum(b["data"].size for b in buffers if "data" in b)
    return flatbuf.encode(tree, size_hint=size + 64 * 1024)


def _empty(buffers: list[dict]) -> int:
    # Metadata may legitimately point at an empty buffer; give it its own.
    buffers.append({})
    return len(buffers) - 1


def _tensor(t: Tensor, buffer: int) -> dict:
    d = {
        "shape": list(t.shape), "type": t.type, "buffer": buffer, "name": t.name,
        "quantization": _quantization(t.quantization),
        "is_variable": t.is_variable or None,
        "shape_signature": None if t.shape_signature is None else list(t.shape_signature),
        "has_rank": t.has_rank or None,
    }
    d.update(t.extra)
    return d


def _quantization(q: Quantization | None) -> dict | None:
    if q is None:
        return None
    return {
        "scale": np.asarray(q.scale, np.float32), "zero_point": np.asarray(q.zero_point, np.int64),
        "quantized_dimension": q.quantized_dimension, "min": q.min, "max": q.max,
        "details_type": q.details_type or None, "details": q.details,
    }


def _operator(op: Operator, opcode_index: int) -> dict:
    d = {
        "opcode_index": opcode_index, "inputs": op.inputs, "outputs": op.outputs,
        "custom_options_format": op.custom_options_format or None,
        "intermediates": op.intermediates or None,
    }
    if op.options_type:
        d["builtin_options_type"] = _OPTION_CODES[op.options_type]
        d["builtin_options"] = op.options
    if op.custom_options is not None:
        d["custom_options"] = np.frombuffer(op.custom_options, np.uint8)
    d.update(op.extra)
    return d
