"""Rewrites that let a CPU backend run a valid model it would otherwise crash on.

LiteRT's optimized kernels (the XNNPACK delegate, which the default
``kernels="optimized"`` applies) die with SIGSEGV on a DEPTHWISE_CONV_2D that
has two inputs (no bias), although the operator's own kernel accepts two
inputs and the reference kernels run it (checked with ai-edge-litert 2.3,
float32 and uint8).  Adding an explicit all-zero bias changes no result, so
the model is handed to the backend with one instead of being rejected.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from coralrt._model.types import Buffer, Model, Quantization, Tensor, tensor_type

__all__ = ["with_explicit_biases"]

# Input type of the operator -> the bias type its kernels expect.
_BIAS_DTYPE = {np.dtype(np.float32): np.float32, np.dtype(np.uint8): np.int32,
               np.dtype(np.int8): np.int32, np.dtype(np.int16): np.int64}


def with_explicit_biases(model: Model) -> Model | None:
    """A copy of ``model`` whose bias-less DEPTHWISE_CONV_2D operators have a zero
    bias, or None when no operator lacks one (then ``model`` is fine as it is)."""
    subgraphs, changed = [], False
    for sg in model.subgraphs:
        tensors, operators = list(sg.tensors), list(sg.operators)
        for j, op in enumerate(sg.operators):
            if op.name != "DEPTHWISE_CONV_2D" or len(op.inputs) != 2:
                continue
            bias = _zero_bias(sg.tensors[op.inputs[0]], sg.tensors[op.inputs[1]],
                              f"{op.name.lower()}_{j}_zero_bias")
            if bias is None:
                continue
            tensors.append(bias)
            operators[j] = dataclasses.replace(op, inputs=[*op.inputs, len(tensors) - 1])
            changed = True
        subgraphs.append(dataclasses.replace(sg, tensors=tensors, operators=operators))
    if not changed:
        return None
    return dataclasses.replace(model, subgraphs=subgraphs, source=None)


def _zero_bias(x: Tensor, weights: Tensor, name: str) -> Tensor | None:
    dtype = _BIAS_DTYPE.get(x.dtype) if x.dtype is not None else None
    if dtype is None or not weights.shape:
        return None
    channels = int(weights.shape[-1])
    data = np.zeros(channels, np.dtype(dtype).newbyteorder("<"))
    raw = np.frombuffer(data.tobytes(), np.uint8)
    quantization = None
    xq, wq = x.quantization, weights.quantization
    if dtype is not np.float32 and xq is not None and wq is not None and xq.scale.size == 1:
        # The kernels check that the bias scale is input scale * filter scale.
        scale = (np.float64(xq.scale[0]) * wq.scale.astype(np.float64)).astype(np.float32)
        quantization = Quantization(scale=scale, zero_point=np.zeros(scale.size, np.int64),
                                    quantized_dimension=0)
    return Tensor(name=name, shape=(channels,), type=tensor_type(dtype), buffer=Buffer(raw),
                  quantization=quantization)
