"""tflite_runtime's detail dicts of tensors (``get_input_details()`` and the rest)."""

from __future__ import annotations

import numpy as np

from coralrt._model.types import TYPE_NAMES, Tensor

__all__ = ["tensor_details"]

_OTHER_TYPES = {"STRING": np.bytes_}


def tensor_details(t: Tensor, index: int, shape=None) -> dict:
    """tflite_runtime's detail dict of tensor ``t`` (``shape``: its current shape)."""
    shape = t.shape if shape is None else tuple(shape)
    q = t.quantization
    dtype = t.dtype.type if t.dtype is not None else _OTHER_TYPES.get(
        TYPE_NAMES.get(t.type, ""), np.object_)
    return {
        "name": t.name,
        "index": int(index),
        "shape": np.array(shape, np.int32),
        "shape_signature": np.array(t.shape_signature or shape, np.int32),
        "dtype": dtype,
        "quantization": q.params if q is not None else (0.0, 0),
        "quantization_parameters": {
            "scales": np.asarray(q.scale if q is not None else [], np.float32),
            "zero_points": np.asarray(q.zero_point if q is not None else [], np.int32),
            "quantized_dimension": int(q.quantized_dimension) if q is not None else 0,
            "block_size": 0,
        },
        "sparsity_parameters": {},
    }
