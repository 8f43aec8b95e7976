"""Read TFLite bytes into a :class:`~coralrt._model.types.Model`.

``load_model`` decodes with the bounds-checked codec, builds the object graph
(constant data stays a view into the original bytes) and validates it before
anything is handed to a native library.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from coralrt.errors import ModelError
from coralrt._model import flatbuf
from coralrt._model._schema import UNIONS
from coralrt._model.types import (
    BUILTIN_CODES, Buffer, Metadata, Model, Operator, OperatorCode, Quantization,
    SignatureDef, Subgraph, Tensor,
)
from coralrt._model.prepared_shapes import with_prepared_shapes
from coralrt._model.validate import validate

__all__ = ["load_model", "read_bytes"]

log = logging.getLogger("coralrt.model")

_EMPTY = np.zeros(0, np.uint8)
_EMPTY.flags.writeable = False
_PLACEHOLDER = BUILTIN_CODES.get("PLACEHOLDER_FOR_GREATER_OP_CODES", 127)


def read_bytes(source) -> bytes:
    """The bytes of a model given as a path, bytes-like object or Model."""
    if isinstance(source, Model):
        return source.source if source.source is not None else source.to_bytes()
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise ModelError(f"model file not found: {path}") from None
        except IsADirectoryError:
            raise ModelError(f"{path} is a directory, not a .tflite file") from None
        except OSError as e:
            raise ModelError(f"cannot read model file {path}: {e.strerror or e}") from e
    raise TypeError(f"expected a path, bytes or Model, got {type(source).__name__}")


def load_model(source) -> Model:
    """Read and validate a TFLite model from a path, bytes or an existing Model.

    Raises :class:`coralrt.errors.ModelError` naming what is wrong and where
    for anything that is not a valid TFLite model.
    """
    if isinstance(source, Model):
        validate(source)
        return with_prepared_shapes(source)
    data = read_bytes(source)
    try:
        tree = flatbuf.decode(data)
    except flatbuf.FlatbufferError as e:
        raise ModelError(f"not a valid TFLite flatbuffer ({e})", where=_name(source)) from None
    if data[4:8] != flatbuf.FILE_IDENTIFIER:
        log.debug("%s: file identifier %r is not %r", _name(source), data[4:8],
                  flatbuf.FILE_IDENTIFIER)
    model = _build(tree, data)
    validate(model)
    # Dynamic tensors get the shapes LiteRT's Prepare gives them (prepared_shapes.py).
    return with_prepared_shapes(model)


def _name(source) -> str | None:
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else None


def _build(tree: dict, data: bytes) -> Model:
    buffers = [_buffer(b, data, i) for i, b in enumerate(tree.get("buffers") or [])]
    codes = [_opcode(c) for c in tree.get("operator_codes") or []]
    subgraphs = [_subgraph(sg, i, buffers, codes, data)
                 for i, sg in enumerate(tree.get("subgraphs") or [])]
    metadata = []
    for i, m in enumerate(tree.get("metadata") or []):
        b = m.get("buffer", 0)
        if not 0 <= b < len(buffers):
            raise ModelError(f"buffer index {b} is out of range (the model has "
                             f"{len(buffers)} buffers)", where=f"metadata {i}")
        metadata.append(Metadata(m.get("name") or "", buffers[b]))
    signatures = [
        SignatureDef(
            key=s.get("signature_key") or "",
            subgraph_index=s.get("subgraph_index", 0),
            inputs={t.get("name") or "": t.get("tensor_index", 0) for t in s.get("inputs") or []},
            outputs={t.get("name") or "": t.get("tensor_index", 0) for t in s.get("outputs") or []},
        )
        for s in tree.get("signature_defs") or []
    ]
    return Model(
        subgraphs=subgraphs, buffers=buffers, description=tree.get("description") or "",
        version=tree.get("version", 0), metadata=metadata, signatures=signatures,
        metadata_buffer=[int(x) for x in tree.get("metadata_buffer", ())], source=data,
    )


def _buffer(b: dict, data: bytes, index: int) -> Buffer:
    offset, size = b.get("offset", 0), b.get("size", 0)
    if offset > 1:
        # Large models keep buffer bytes after the flatbuffer, addressed from the file start.
        if offset + size > len(data):
            raise ModelError(f"external data [{offset}, {offset + size}) lies outside the "
                             f"{len(data)}-byte file", where=f"buffer {index}")
        return Buffer(np.frombuffer(data, np.uint8, size, offset))
    d = b.get("data")
    return Buffer(_EMPTY if d is None else d)


def _opcode(c: dict) -> OperatorCode:
    # Since schema v3a the real code is in builtin_code; old files only set the
    # int8 deprecated field, new ones set it to a placeholder for codes > 127.
    code = max(c.get("builtin_code", 0), c.get("deprecated_builtin_code", 0))
    return OperatorCode(code, c.get("custom_code"), c.get("version", 1))


def _subgraph(sg: dict, index: int, buffers, codes, data) -> Subgraph:
    where = f"subgraph {index}"
    tensors = [_tensor(t, f"{where}, tensor {i}", buffers) for i, t in enumerate(sg.get("tensors") or [])]
    ops = [_operator(o, f"{where}, operator {i}", codes, data)
           for i, o in enumerate(sg.get("operators") or [])]
    return Subgraph(tensors, ops, _ints(sg.get("inputs")), _ints(sg.get("outputs")),
                    sg.get("name") or "")


def _ints(v) -> list[int]:
    return [] if v is None else [int(x) for x in v]


def _tensor(t: dict, where: str, buffers) -> Tensor:
    b = t.get("buffer", 0)
    if not 0 <= b < max(len(buffers), 1):
        raise ModelError(f"buffer index {b} is out of range (the model has {len(buffers)} "
                         f"buffers)", where=where)
    sig = t.get("shape_signature")
    extra = {k: t[k] for k in ("sparsity", "variant_tensors", "external_buffer") if t.get(k)}
    return Tensor(
        name=t.get("name") or "",
        shape=tuple(int(x) for x in t.get("shape", ())),
        type=t.get("type", 0),
        buffer=buffers[b] if b > 0 and buffers else None,
        quantization=_quantization(t.get("quantization")),
        shape_signature=None if sig is None else tuple(int(x) for x in sig),
        is_variable=bool(t.get("is_variable", False)),
        has_rank=bool(t.get("has_rank", False)),
        extra=extra,
    )


def _quantization(q: dict | None) -> Quantization | None:
    if not q or all(q.get(k) is None for k in ("scale", "zero_point", "details")):
        return None
    scale = q.get("scale")
    zp = q.get("zero_point")
    return Quantization(
        scale=np.zeros(0, np.float32) if scale is None else scale,
        zero_point=np.zeros(0, np.int64) if zp is None else zp,
        quantized_dimension=q.get("quantized_dimension", 0),
        min=q.get("min"), max=q.get("max"),
        details=q.get("details"), details_type=q.get("details_type", 0),
    )


def _operator(o: dict, where: str, codes, data) -> Operator:
    idx = o.get("opcode_index", 0)
    if not 0 <= idx < len(codes):
        raise ModelError(f"opcode index {idx} is out of range (the model has {len(codes)} "
                         f"operator codes)", where=where)
    custom = o.get("custom_options")
    big_off, big_size = o.get("large_custom_options_offset", 0), o.get("large_custom_options_size", 0)
    if big_size:
        if big_off + big_size > len(data):
            raise ModelError("large custom options lie outside the file", where=where)
        custom = memoryview(data)[big_off:big_off + big_size]
    elif custom is not None:
        custom = memoryview(custom)
    opt_type = o.get("builtin_options_type", 0)
    extra = {k: o[k] for k in ("mutating_variable_inputs", "builtin_options2_type",
                               "builtin_options2") if o.get(k) is not None}
    if o.get("debug_metadata_index", -1) != -1:
        extra["debug_metadata_index"] = o["debug_metadata_index"]
    return Operator(
        opcode=codes[idx],
        inputs=_ints(o.get("inputs")),
        outputs=_ints(o.get("outputs")),
        options=_plain(o.get("builtin_options") or {}),
        options_type=UNIONS["BuiltinOptions"].get(opt_type),
        custom_options=custom,
        custom_options_format=o.get("custom_options_format", 0),
        intermediates=_ints(o.get("intermediates")),
        extra=extra,
    )


def _plain(options: dict) -> dict:
    # Options are small; plain lists read better than views in reprs and JSON.
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in options.items()}
