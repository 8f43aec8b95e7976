"""Convert a uint8 per-tensor quantized TFLite model to the layout TensorFlow 2's
full-integer post-training converter emits, so tests and benchmarks can run a
real int8 per-channel network without TensorFlow:

* every uint8 input becomes a float32 input followed by QUANTIZE (float32 ->
  int8); every uint8 output is produced by DEQUANTIZE (int8 -> float32);
* activations are int8 with the same scale and zero point ``zp - 128`` (the
  same real values; uint8 constants are shifted by -128 as well);
* CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED weights become int8 symmetric
  per-channel (zero point 0, ``scale_c = max|w_c| / 127`` over each output
  channel; quantized_dimension 0, or 3 for depthwise) and their int32 bias is
  requantized to ``in_scale * w_scale_c``;
* other supported operators keep their options and run on the int8 tensors.

The model is rebuilt operator by operator with ``ModelBuilder`` and written by
coralrt's writer.  Anything the conversion cannot express (float or int16
tensors, per-channel inputs, several subgraphs, operators not listed in
``_INT8_VERSIONS``) raises :class:`Int8ConversionError` naming the culprit.

    int8_bytes = int8_per_channel_from_uint8(shared_model("mobilenet_v2_1.0_224_quant.tflite"))
"""

from __future__ import annotations

import numpy as np

from coralrt import Model, load_model
from coralrt.testing import ModelBuilder
from coralrt._model.types import TENSOR_TYPES, Tensor

__all__ = ["Int8ConversionError", "int8_per_channel_from_uint8", "WEIGHT_OPERATORS"]

UINT8, INT8, INT32 = TENSOR_TYPES["UINT8"], TENSOR_TYPES["INT8"], TENSOR_TYPES["INT32"]

#: Operators whose weights (input 1) become per-channel, with the weight axis
#: that holds the output channels.
WEIGHT_OPERATORS = {"CONV_2D": 0, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 0}

#: Operators the conversion handles, with the version TensorFlow's converter
#: gives their int8 form (the larger of this and the original is kept).
_INT8_VERSIONS = {
    "CONV_2D": 3, "DEPTHWISE_CONV_2D": 3, "FULLY_CONNECTED": 4,
    "ADD": 2, "SUB": 2, "MUL": 2, "AVERAGE_POOL_2D": 2, "MAX_POOL_2D": 2, "SOFTMAX": 2,
    "LOGISTIC": 2, "TANH": 2, "RELU": 2, "RELU6": 2, "CONCATENATION": 2, "PAD": 2,
    "MEAN": 2, "RESIZE_BILINEAR": 2, "RESIZE_NEAREST_NEIGHBOR": 2, "RESHAPE": 1,
    "SQUEEZE": 1, "STRIDED_SLICE": 2, "TRANSPOSE": 2, "SPLIT": 2, "GATHER": 2,
    "MAXIMUM": 2, "MINIMUM": 2, "HARD_SWISH": 1, "L2_NORMALIZATION": 2, "ARG_MAX": 2,
}
#: Versions TensorFlow gives the boundary operators of an int8 model.
_QUANTIZE_VERSION, _DEQUANTIZE_VERSION = 1, 2


class Int8ConversionError(ValueError):
    """The model cannot be converted (names the operator or tensor)."""


def _per_tensor(t: Tensor, where: str) -> tuple[float, int]:
    q = t.quantization
    if q is None or q.scale.size != 1:
        raise Int8ConversionError(f"{where}: tensor {t.name!r} is not per-tensor quantized "
                                  f"(a uint8 per-tensor model is expected)")
    return q.params


def _per_channel_weights(w: Tensor, axis: int, where: str):
    """int8 symmetric per-channel weights and their scales from uint8 per-tensor ones."""
    scale, zp = _per_tensor(w, where)
    data = w.data
    if data is None:
        raise Int8ConversionError(f"{where}: weights {w.name!r} are not a constant tensor")
    real = (data.astype(np.float64) - zp) * scale
    other = tuple(a for a in range(real.ndim) if a != axis)
    wmax = np.abs(real).max(axis=other)
    # An all-zero channel has no range: any scale represents it exactly.
    scales = np.where(wmax > 0, wmax / 127.0, 1.0).astype(np.float32)
    shape = [1] * real.ndim
    shape[axis] = -1
    q = np.clip(np.round(real / scales.astype(np.float64).reshape(shape)), -127, 127)
    return q.astype(np.int8), scales


def _requantized_bias(bias: Tensor, in_scale: float, w_scales: np.ndarray, where: str):
    if bias.type != INT32 or bias.data is None:
        raise Int8ConversionError(f"{where}: bias {bias.name!r} is not a constant int32 tensor")
    old_scale, _ = _per_tensor(bias, where)
    real = bias.data.astype(np.float64) * old_scale
    new_scales = (np.float64(in_scale) * w_scales.astype(np.float64)).astype(np.float32)
    q = np.round(real / new_scales.astype(np.float64))
    info = np.iinfo(np.int32)
    return np.clip(q, info.min, info.max).astype(np.int32), new_scales


def int8_per_channel_from_uint8(model_bytes_or_path) -> bytes:
    """The int8 per-channel, float-in/float-out version of a uint8 quantized model."""
    model: Model = load_model(model_bytes_or_path)
    if len(model.subgraphs) != 1:
        raise Int8ConversionError(f"only single-subgraph models are supported, this one has "
                                  f"{len(model.subgraphs)}")
    sg = model.main
    tensors = sg.tensors
    b = ModelBuilder(name=sg.name or "main", description="int8 per-channel (coralrt tests)")
    new_index: dict[int, int] = {}
    # Tensors converted with the weights/bias of an operator, keyed by old index.
    special: dict[int, int] = {}

    # The float32 boundary tensors keep the original names; their int8 twins get a suffix.
    boundary = {i for i in (*sg.inputs, *sg.outputs) if tensors[i].type == UINT8}

    def activation(i: int, where: str, *, model_input: bool = False) -> int:
        """The int8 (or unchanged int32) counterpart of tensor ``i``."""
        if i < 0:
            return i
        if i in special:
            return special[i]
        if i in new_index:
            return new_index[i]
        t = tensors[i]
        sig = t.shape_signature
        if t.type == UINT8:
            scale, zp = _per_tensor(t, where)
            data = None if t.data is None else (t.data.astype(np.int16) - 128).astype(np.int8)
            name = f"{t.name}_int8" if i in boundary else t.name
            n = b.tensor(name, t.shape, np.int8, scale=scale, zero_point=zp - 128, data=data,
                         shape_signature=sig)
        elif t.type == INT32:
            q = t.quantization
            make = b.input if model_input else b.tensor
            n = make(t.name, t.shape, np.int32, data=t.data, shape_signature=sig,
                         **({} if q is None or q.scale.size == 0 else
                            {"scale": q.scale, "zero_point": q.zero_point,
                             "axis": q.quantized_dimension}))
        else:
            raise Int8ConversionError(f"{where}: tensor {t.name!r} has type {t.type_name}; "
                                      f"only UINT8 activations and INT32 tensors convert")
        new_index[i] = n
        return n

    # Model inputs: float32 -> QUANTIZE -> int8.
    for i in sg.inputs:
        t = tensors[i]
        if t.type != UINT8:
            activation(i, f"input {t.name!r}", model_input=True)
            continue
        f = b.input(t.name, t.shape, np.float32, shape_signature=t.shape_signature)
        q = activation(i, f"input {t.name!r}")
        b.op("QUANTIZE", [f], [q], version=_QUANTIZE_VERSION)

    for k, op in enumerate(sg.operators):
        where = f"operator {k} ({op.name})"
        if op.opcode.is_custom or op.name not in _INT8_VERSIONS:
            raise Int8ConversionError(f"{where}: operator {op.name!r} is not supported by the "
                                      f"int8 conversion")
        if op.intermediates or op.custom_options is not None:
            raise Int8ConversionError(f"{where}: operators with intermediates or custom "
                                      f"options are not supported")
        inputs = list(op.inputs)
        if op.name in WEIGHT_OPERATORS:
            x, w = tensors[inputs[0]], tensors[inputs[1]]
            if w.type != UINT8:
                raise Int8ConversionError(f"{where}: weights {w.name!r} have type "
                                          f"{w.type_name}, expected UINT8")
            in_scale, _ = _per_tensor(x, where)
            axis = WEIGHT_OPERATORS[op.name]
            qw, w_scales = _per_channel_weights(w, axis, where)
            special[inputs[1]] = b.tensor(w.name, w.shape, np.int8, data=qw, scale=w_scales,
                                          zero_point=np.zeros(w_scales.size, np.int64),
                                          axis=axis)
            if len(inputs) > 2 and inputs[2] >= 0:
                bias = tensors[inputs[2]]
                qb, b_scales = _requantized_bias(bias, in_scale, w_scales, where)
                if qb.size != w_scales.size:
                    raise Int8ConversionError(f"{where}: bias has {qb.size} entries for "
                                              f"{w_scales.size} output channels")
                special[inputs[2]] = b.tensor(bias.name, bias.shape, np.int32, data=qb,
                                              scale=b_scales,
                                              zero_point=np.zeros(b_scales.size, np.int64))
        new_in = [activation(i, where) for i in inputs]
        new_out = [activation(i, where) for i in op.outputs]
        for i in inputs[1:] if op.name in WEIGHT_OPERATORS else ():
            special.pop(i, None)   # a shared weight tensor is requantized per use
        version = max(op.version, _INT8_VERSIONS[op.name])
        b.op(op.name, new_in, new_out, version=version,
             options_type=op.options_type, **op.options)

    # Model outputs: int8 -> DEQUANTIZE -> float32.
    for i in sg.outputs:
        t = tensors[i]
        if i not in new_index:
            raise Int8ConversionError(f"output {t.name!r} is produced by no operator")
        if t.type != UINT8:
            b.output(new_index[i])
            continue
        f = b.tensor(t.name, t.shape, np.float32, shape_signature=t.shape_signature)
        b.op("DEQUANTIZE", [new_index[i]], [f], version=_DEQUANTIZE_VERSION)
        b.output(f)
    return b.build().to_bytes()
