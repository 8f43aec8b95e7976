"""Model surgery for on-device training: read a model, quantize a new layer, edit the graph.

Both trainers (imprinting and softmax regression) read the base model with
coralrt's own reader, change or append the last layers as plain
:mod:`coralrt._model` objects and write the result with coralrt's writer, so
the ``.tflite`` they produce is an ordinary quantized model: it runs on every
coralrt target and its operators are ones the Edge TPU maps.

Quantization follows TFLite's conventions: 8-bit activations and weights with
a scale and zero point, int32 biases with zero point 0 and scale
``input_scale * weight_scale``, int8 weights symmetric (zero point 0).
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

from coralrt.errors import ModelError
from coralrt._model import Model, Quantization, Tensor, load_model
from coralrt._model.compiled import compiled_by, host_model, with_plain_twin
from coralrt._model.types import tensor_type
from coralrt._tensors import dequantize, quantize

__all__ = ["read_model", "activation_params", "quantize_weights", "bias_tensor",
           "const_tensor", "activation_tensor", "copy_main", "constant_value",
           "EIGHT_BIT"]

EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def read_model(model_path) -> Model:
    """The model at ``model_path`` (a path; bytes are accepted too), validated.

    A path that cannot be read is a :class:`ModelError` whose message starts
    with ``Failed to open file:``, the words pycoral uses.
    """
    if isinstance(model_path, (bytes, bytearray, memoryview)):
        return load_model(bytes(model_path))
    try:
        path = os.fspath(model_path)
    except TypeError:
        raise TypeError(f"model_path must be a path to a .tflite file, got "
                        f"{type(model_path).__name__}") from None
    if not os.path.isfile(path):
        why = "it is a directory" if os.path.isdir(path) else "no such file"
        raise ModelError(f"Failed to open file: {path} ({why}); pass the path of a "
                         f".tflite model")
    return load_model(path)


def plain_of(model_path, model: Model) -> Model | None:
    """The plain model of an edgetpu_compiler output read from ``model_path`` (its
    plain file, or the twin it carries), or None: for a plain model, or when none is
    found.  Layers appended to a compiled model are appended to this one too, and
    the result carries it as its twin, so that ``cpu`` and ``sim`` run it."""
    if compiled_by(model) != "edgetpu_compiler":
        return None
    plain = host_model(model_path, model)
    return None if plain is None else load_model(plain)


def serialized(model: Model, twin: Model | None) -> bytes:
    """``model`` as bytes, carrying ``twin`` (its plain form) when there is one."""
    return (with_plain_twin(model, twin) if twin is not None else model).to_bytes()


def _qrange(dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def activation_params(lo: float, hi: float, dtype) -> tuple[float, int]:
    """(scale, zero_point) covering ``[min(lo, 0), max(hi, 0)]`` in ``dtype`` with 0
    exactly representable (TFLite's choice of parameters for an activation)."""
    qmin, qmax = _qrange(dtype)
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ValueError(f"cannot quantize the range [{lo}, {hi}]")
    if hi - lo < 1e-12:
        hi = lo + 1e-6          # a constant zero: any positive scale represents it
    scale = (hi - lo) / (qmax - qmin)
    zero_point = int(np.clip(round(qmin - lo / scale), qmin, qmax))
    return float(scale), zero_point


def quantize_weights(w: np.ndarray, dtype) -> tuple[np.ndarray, float, int]:
    """(quantized ``w``, scale, zero_point), per tensor: asymmetric for uint8,
    symmetric with zero point 0 for int8 (what TFLite's int8 kernels require)."""
    w = np.asarray(w, np.float64)
    dtype = np.dtype(dtype)
    if dtype == np.int8:
        m = float(np.max(np.abs(w))) if w.size else 0.0
        scale, zero_point = (m if m > 0 else 1e-6) / 127.0, 0
    else:
        scale, zero_point = activation_params(w.min(initial=0.0), w.max(initial=0.0), dtype)
    q = quantize(w, scale, zero_point, dtype)
    if dtype == np.int8:
        q = np.maximum(q, -127).astype(np.int8)
    return q, scale, zero_point


def const_tensor(name: str, data: np.ndarray, scale=None, zero_point=None) -> Tensor:
    from coralrt._model.builder import make_tensor
    data = np.asarray(data)
    return make_tensor(name, data.shape, data.dtype, data=data, scale=scale,
                       zero_point=zero_point)


def bias_tensor(name: str, bias: np.ndarray, input_scale: float, weight_scale: float) -> Tensor:
    """An int32 bias quantized with scale ``input_scale * weight_scale``, zero point 0."""
    scale = float(np.float32(input_scale) * np.float32(weight_scale))
    q = np.clip(np.round(np.asarray(bias, np.float64) / scale), -2**31, 2**31 - 1)
    return const_tensor(name, q.astype(np.int32), scale, 0)


def activation_tensor(name: str, shape, dtype, scale: float, zero_point: int) -> Tensor:
    return Tensor(name=name, shape=tuple(int(d) for d in shape), type=tensor_type(dtype),
                  quantization=Quantization(scale=np.array([scale], np.float32),
                                            zero_point=np.array([zero_point], np.int64)))


def copy_main(model: Model) -> Model:
    """A copy of ``model`` whose main subgraph's lists can be edited freely (tensors
    and operators themselves are shared: replace them, never change them)."""
    sg = model.main
    main = dataclasses.replace(sg, tensors=list(sg.tensors), operators=list(sg.operators),
                               inputs=list(sg.inputs), outputs=list(sg.outputs))
    # No buffer list: the writer stores the buffers the tensors still reach, so a
    # replaced constant's old bytes are not written.  Signatures would name the old
    # outputs: dropped.
    return dataclasses.replace(model, subgraphs=[main, *model.subgraphs[1:]], buffers=[],
                               signatures=[], source=None)


def constant_value(t: Tensor) -> np.ndarray | None:
    """A constant tensor's real values (dequantized when it is quantized), or None."""
    data = t.data
    if data is None:
        return None
    q = t.quantization
    if q is None or not q.scale.size or not np.issubdtype(data.dtype, np.integer):
        return np.asarray(data, np.float64)
    return dequantize(data, q.scale, q.zero_point, axis=q.quantized_dimension)
