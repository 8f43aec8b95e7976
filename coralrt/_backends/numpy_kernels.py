"""Float32 kernels of the NumPy CPU backend, for the operators around quantized graphs.

Each kernel is a factory in the form of the simulated Edge TPU's kernels
(:mod:`coralrt._sim.kernels`): it takes an :class:`~coralrt._sim.kernels.OpContext`
once, when the model is loaded, and returns ``run(inputs) -> outputs``.
:mod:`coralrt._backends.numpy_backend` hands them to the simulator's
``SegmentRunner`` as ``extra`` kernels; they run on the host CPU, in NumPy.

What they follow (TFLite's reference kernels, ``OpResolverType.BUILTIN_REF``):

* QUANTIZE float32 -> uint8/int8: ``round(x / scale) + zero_point`` with the
  division in float32 and ties rounded away from zero, clamped: bit-exact.
* DEQUANTIZE 8-bit -> float32: ``float(double(scale) * (q - zero_point))``:
  bit-exact; float16 -> float32 is a widening: bit-exact.
* RESHAPE/SQUEEZE/EXPAND_DIMS, CONCATENATION: data movement: bit-exact.
* ADD, SUB, MUL, DIV (float32, broadcasting, fused activation): one float32
  operation per element: bit-exact.  SQRT: correctly rounded: bit-exact.
* LOGISTIC: the reference's cut-offs (``x > 16.619...`` -> 1, ``x < -9`` ->
  ``exp(x)``) around ``1 / (1 + exp(-x))`` in float32, ``exp`` rounded from
  double precision as the C library's ``expf``; SOFTMAX: ``exp((x - max) *
  beta) / sum``.  Measured bit-exact on the tests' inputs, but ``exp`` and the
  order of the sum may differ from LiteRT's in the last bit: the tests assert
  ``rtol=1e-5, atol=1e-6``.
* RELU, RELU6, RELU_N1_TO_1, LEAKY_RELU, ABS, NEG: bit-exact.  TANH and GELU (exact or
  ``approximate``): in double precision rounded to float32 (LiteRT's may
  differ in the last bits).
* MEAN over constant axes and FULLY_CONNECTED (float32 weights, DEFAULT
  format): float32 sums whose order differs from LiteRT's; the tests assert
  ``rtol=1e-5, atol=1e-6`` for MEAN and ``rtol=1e-5, atol=1e-5`` for
  FULLY_CONNECTED on unit-scale data.  Float operators with 8-bit weights
  (dynamic-range quantization) are refused at load.

The SSD post-processing operator is in :mod:`coralrt._backends.numpy_detect`; the
kernels that take any type (GATHER, CAST, UNPACK, ARG_MAX...) are in
:mod:`coralrt._backends.numpy_index`.
"""

from __future__ import annotations

import math

import numpy as np

from coralrt._model.types import numpy_dtype
from coralrt._ops.arith.common import refuse
from coralrt._ops.fused import fused_bounds
from coralrt._sim.kernels import OpContext
from coralrt._sim.kernels.reduce import reduction_axes

__all__ = ["is_float", "quantize", "dequantize"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))
_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def is_float(t) -> bool:
    """Whether a segment tensor holds float32 or float16 values."""
    return t is not None and numpy_dtype(t.dtype) in _FLOATS


def _require_float32(ctx: OpContext, *tensors) -> None:
    for t in tensors:
        if ctx.dtype(t) != np.dtype(np.float32):
            refuse(ctx, f"tensor {t.name!r} is {t.type_name}; the numpy backend's float "
                         f"kernels take FLOAT32 operands only (float operators with 8-bit "
                         f"weights, as dynamic-range quantization writes them, are not "
                         f"supported)")


def _activation(ctx: OpContext):
    code = int(ctx.params.get("fused_activation_function", 0) or 0)
    bounds = fused_bounds(code, op_name=ctx.op.name,
                          message="fused activation {code} is not supported for float32")
    if bounds == (None, None):
        return lambda x: x
    lo, hi = (np.float32(b) if b is not None else None for b in bounds)
    return lambda x: np.clip(x, lo, hi, out=x)


# -- QUANTIZE / DEQUANTIZE --------------------------------------------------------------------


def _channel_shape(ctx: OpContext, t, values: np.ndarray) -> np.ndarray:
    """Per-channel quantization values shaped to broadcast along the quantized dimension."""
    if values.size <= 1:
        return values.reshape(())
    shape = [1] * len(t.shape)
    shape[t.quantized_dimension] = values.size
    return values.reshape(shape)


def quantize(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    _require_float32(ctx, x)
    dtype = ctx.dtype(out)
    if dtype not in _EIGHT_BIT or not len(out.scales):
        refuse(ctx, f"float32 input quantized to {out.type_name}: only uint8 and int8 "
                     f"outputs are supported")
    scales, zps = ctx.quant(out)
    if np.any(scales == 0):
        refuse(ctx, f"output {out.name!r} has scale 0")
    scale = _channel_shape(ctx, out, scales.astype(np.float32))
    zp = _channel_shape(ctx, out, zps.astype(np.float64))
    info = np.iinfo(dtype)
    # round() of a value beyond int32 is undefined in C; clamping first keeps numpy's
    # result in range without changing any representable answer.
    limit = np.float64(2.0**31)

    def run(inputs):
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            q = np.asarray(inputs[0], np.float32) / scale          # float32 division
            q = q.astype(np.float64)
            r = np.trunc(q + np.copysign(0.5, q))                  # ties away from zero
            r = np.clip(np.nan_to_num(r, nan=0.0), -limit, limit) + zp
        return [np.clip(r, info.min, info.max).astype(dtype)]
    return run


def dequantize(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    _require_float32(ctx, out)
    dtype = ctx.dtype(x)
    if dtype == np.dtype(np.float16):
        return lambda inputs: [np.asarray(inputs[0]).astype(np.float32)]
    if dtype not in (*_EIGHT_BIT, np.dtype(np.int16)) or not len(x.scales):
        refuse(ctx, f"dequantizing {x.type_name} is not supported (uint8, int8, int16 "
                     f"and float16 are)")
    scales, zps = ctx.quant(x)
    scale = _channel_shape(ctx, x, scales.astype(np.float64))
    zp = _channel_shape(ctx, x, zps.astype(np.int64))

    def run(inputs):
        q = np.asarray(inputs[0]).astype(np.int64) - zp
        return [(scale * q).astype(np.float32)]
    return run


# -- data movement ------------------------------------------------------------------------


def reshape(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    shape = tuple(out.shape)
    if int(np.prod(x.shape, dtype=np.int64)) != int(np.prod(shape, dtype=np.int64)):
        refuse(ctx, f"cannot reshape {tuple(x.shape)} to {shape}")
    dtype = ctx.dtype(out)
    return lambda inputs: [np.asarray(inputs[0]).reshape(shape).astype(dtype, copy=False)]


def concatenation(ctx: OpContext):
    ins = [t for t in ctx.inputs if t is not None]
    _require_float32(ctx, *ins, ctx.outputs[0])
    rank = len(ctx.outputs[0].shape)
    axis = int(ctx.params.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < max(rank, 1):
        refuse(ctx, f"axis {ctx.params.get('axis')} is out of range for rank {rank}")
    act = _activation(ctx)
    shape = tuple(ctx.outputs[0].shape)

    def run(inputs):
        parts = [np.asarray(v, np.float32) for v in inputs if v is not None]
        return [act(np.concatenate(parts, axis=axis).reshape(shape))]
    return run


# -- arithmetic ---------------------------------------------------------------------------


def _binary(fn):
    def factory(ctx: OpContext):
        a, b, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        _require_float32(ctx, a, b, out)
        act = _activation(ctx)
        shape = tuple(out.shape)
        try:
            np.broadcast_shapes(tuple(a.shape), tuple(b.shape))
        except ValueError:
            refuse(ctx, f"shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast")

        def run(inputs):
            with np.errstate(over="ignore", invalid="ignore"):
                r = fn(np.asarray(inputs[0], np.float32), np.asarray(inputs[1], np.float32))
            return [act(np.array(r, np.float32).reshape(shape))]
        return run
    return factory


def _elementwise(fn):
    """A float32 -> float32 kernel of one operand (the output takes its shape)."""
    def factory(ctx: OpContext):
        _require_float32(ctx, ctx.inputs[0], ctx.outputs[0])
        shape = tuple(ctx.outputs[0].shape)

        def run(inputs):
            with np.errstate(over="ignore", under="ignore", invalid="ignore"):
                r = fn(np.asarray(inputs[0], np.float32))
            return [np.asarray(r, np.float32).reshape(shape)]
        return run
    return factory


def _tanh(x: np.ndarray) -> np.ndarray:
    return np.tanh(x.astype(np.float64)).astype(np.float32)


_ERFC = np.frompyfunc(math.erfc, 1, 1)


def leaky_relu(ctx: OpContext):
    """``x`` where positive, else ``alpha * x``, in float32: bit-exact."""
    alpha = np.float32(ctx.params.get("alpha", 0.0) or 0.0)
    return _elementwise(lambda x: np.where(x > 0, x, x * alpha))(ctx)


def gelu(ctx: OpContext):
    """Float GELU, in double precision rounded to float32: the exact form
    ``0.5 x erfc(-x / sqrt 2)`` or, with ``approximate``, the tanh form."""
    if ctx.params.get("approximate", False):
        def form(x):
            d = x.astype(np.float64)
            return 0.5 * d * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (d + 0.044715 * d ** 3)))
    else:
        def form(x):
            d = x.astype(np.float64)
            return 0.5 * d * _ERFC(d * -math.sqrt(0.5)).astype(np.float64)
    return _elementwise(form)(ctx)


def mean(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    _require_float32(ctx, x, out)
    axes, shape = reduction_axes(ctx), tuple(out.shape)

    def run(inputs):
        v = np.asarray(inputs[0], np.float32)
        r = np.mean(v, axis=axes, keepdims=True, dtype=np.float32) if axes else v.copy()
        return [np.asarray(r, np.float32).reshape(shape)]
    return run


def fully_connected(ctx: OpContext):
    x, w, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    bias = ctx.inputs[2] if len(ctx.inputs) > 2 else None
    _require_float32(ctx, x, w, out, *([bias] if bias is not None else []))
    if int(ctx.params.get("weights_format", 0) or 0) != 0:
        refuse(ctx, "only the DEFAULT weights format is supported")
    if len(w.shape) != 2:
        refuse(ctx, f"weights of shape {tuple(w.shape)} are not 2-D")
    units, depth = (int(d) for d in w.shape)
    size, outputs = int(np.prod(x.shape, dtype=np.int64)), int(np.prod(out.shape, dtype=np.int64))
    # fully_connected.cc: the batch is the input's size over the weights' depth, and
    # the output holds batch x units values (a 0-deep layer sizes it from the output).
    batch = size // depth if depth else (outputs // units if units else 0)
    if (depth and size % depth) or batch * units != outputs:
        refuse(ctx, f"input {tuple(x.shape)}, weights {tuple(w.shape)} and output "
                     f"{tuple(out.shape)} do not agree")
    if bias is not None and int(np.prod(bias.shape, dtype=np.int64)) != units:
        refuse(ctx, f"bias of shape {tuple(bias.shape)} does not hold {units} values")
    act, shape = _activation(ctx), tuple(out.shape)

    def run(inputs):
        weights = np.asarray(inputs[1], np.float32).reshape(units, depth)
        if depth:
            y = np.asarray(inputs[0], np.float32).reshape(batch, depth) @ weights.T
        else:
            y = np.zeros((batch, units), np.float32)
        if bias is not None and inputs[2] is not None:
            y = y + np.asarray(inputs[2], np.float32).reshape(units)
        return [act(np.asarray(y, np.float32).reshape(shape))]
    return run


def _expf(x: np.ndarray) -> np.ndarray:
    """float32 ``exp`` rounded from double precision, as a correctly rounded ``expf``
    gives it (NumPy's own float32 ``exp`` may be one unit in the last place off)."""
    return np.exp(x.astype(np.float64)).astype(np.float32)


def logistic(ctx: OpContext):
    _require_float32(ctx, ctx.inputs[0], ctx.outputs[0])
    upper, lower, one = np.float32(16.619047164916992188), np.float32(-9.0), np.float32(1.0)

    def run(inputs):
        x = np.asarray(inputs[0], np.float32)
        with np.errstate(over="ignore", under="ignore"):
            mid = one / (one + _expf(-x))
            r = np.where(x > upper, one, np.where(x < lower, _expf(x), mid))
        return [r.astype(np.float32)]
    return run


def softmax(ctx: OpContext):
    _require_float32(ctx, ctx.inputs[0], ctx.outputs[0])
    beta = np.float32(ctx.params.get("beta", 1.0))
    shape = tuple(ctx.outputs[0].shape)

    def run(inputs):
        x = np.asarray(inputs[0], np.float32)
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            e = np.exp((x - x.max(axis=-1, keepdims=True)) * beta)
            r = e / e.sum(axis=-1, keepdims=True, dtype=np.float32)
        return [r.astype(np.float32).reshape(shape)]
    return run


# Float kernels made from one NumPy function; the operator specs (coralrt._ops)
# name them and every other kernel of this module.
add, sub, mul, div = (_binary(f) for f in (np.add, np.subtract, np.multiply, np.divide))
relu = _elementwise(lambda x: np.maximum(x, np.float32(0)))
relu6 = _elementwise(lambda x: np.clip(x, np.float32(0), np.float32(6)))
relu_n1_to_1 = _elementwise(lambda x: np.clip(x, np.float32(-1), np.float32(1)))
abs_, neg, sqrt = (_elementwise(f) for f in (np.abs, np.negative, np.sqrt))
tanh = _elementwise(_tanh)
