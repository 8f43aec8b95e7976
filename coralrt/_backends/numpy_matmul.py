"""BATCH_MATMUL for the NumPy CPU backend: float32, and int8 with per-tensor
quantization (a transformer's attention on the CPU).

What it follows (TFLite's ``batch_matmul`` with the reference kernels):

* ``adj_x`` / ``adj_y`` transpose the last two dimensions of an operand; the
  leading dimensions broadcast.
* float32: ``matmul`` in float32.  The order of the sums differs from
  LiteRT's: the tests assert ``rtol=1e-5, atol=1e-5`` on unit-scale data.
* int8: the accumulator ``sum((a - zp_a) * (b - zp_b))`` (computed in float64,
  exact below 2^53, far beyond any real depth), then
  ``MultiplyByQuantizedMultiplier`` with the multiplier of ``s_a * s_b / s_out``
  (in double, as TFLite derives it), the output zero point, clamped to int8
  (the operator has no fused activation): bit-exact.
* Anything else (int16, hybrid float x int8, per-channel scales) is refused at
  load with the reason.
"""

from __future__ import annotations

import numpy as np

from coralrt._ops.arith.common import refuse
from coralrt._ops.arith.fixedpoint import quantize_multiplier
from coralrt._ops.arith.requant import Requantizer
from coralrt._sim.kernels import OpContext


__all__ = ["batch_matmul"]

_F32, _I8 = np.dtype(np.float32), np.dtype(np.int8)


def batch_matmul(ctx: OpContext):
    a_t, b_t, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    adj_x, adj_y = bool(ctx.params.get("adj_x", False)), bool(ctx.params.get("adj_y", False))
    a_shape, b_shape = tuple(a_t.shape), tuple(b_t.shape)
    if len(a_shape) < 2 or len(b_shape) < 2:
        refuse(ctx, f"operands of shapes {a_shape} and {b_shape}: both need 2 dimensions")
    n, k = (a_shape[-1], a_shape[-2]) if adj_x else (a_shape[-2], a_shape[-1])
    k_b, m = (b_shape[-1], b_shape[-2]) if adj_y else (b_shape[-2], b_shape[-1])
    try:
        batch = np.broadcast_shapes(a_shape[:-2], b_shape[:-2])
    except ValueError:
        refuse(ctx, f"the batch dimensions of {a_shape} and {b_shape} do not broadcast")
    if k != k_b or int(np.prod(out.shape, dtype=np.int64)) != \
            int(np.prod(batch, dtype=np.int64)) * n * m:
        refuse(ctx, f"operands {a_shape} x {b_shape} (adj_x={adj_x}, adj_y={adj_y}) do not "
                     f"give the output {tuple(out.shape)}")
    shape = tuple(out.shape)

    def operands(inputs, dtype):
        a, b = np.asarray(inputs[0]).astype(dtype), np.asarray(inputs[1]).astype(dtype)
        return (np.swapaxes(a, -1, -2) if adj_x else a), (np.swapaxes(b, -1, -2) if adj_y else b)

    types = (ctx.dtype(a_t), ctx.dtype(b_t), ctx.dtype(out))
    if types == (_F32, _F32, _F32):
        def run_float(inputs):
            a, b = operands(inputs, np.float32)
            return [np.matmul(a, b).astype(np.float32, copy=False).reshape(shape)]
        return run_float
    if types != (_I8, _I8, _I8):
        refuse(ctx, f"types {', '.join(t.type_name for t in (a_t, b_t, out))}: the numpy "
                     f"backend runs FLOAT32 and quantized INT8 batch matrix products")
    for t in (a_t, b_t, out):
        if len(t.scales) != 1:
            refuse(ctx, f"tensor {t.name!r} is not quantized per tensor")
    real = float(np.float64(ctx.scale(a_t)) * np.float64(ctx.scale(b_t))
                 / np.float64(ctx.scale(out)))
    multiplier, shift = quantize_multiplier(real)
    zp_a, zp_b = ctx.zero_point(a_t), ctx.zero_point(b_t)
    bound = k * (128 + abs(zp_a)) * (128 + abs(zp_b))
    requant = Requantizer([multiplier], [shift], ctx.zero_point(out), -128, 127, _I8,
                          acc_bound=bound)

    def run_int8(inputs):
        a, b = operands(inputs, np.float64)
        acc = np.matmul(a - zp_a, b - zp_b)          # integer-valued, exact in float64
        return [requant(acc).reshape(shape)]
    return run_int8
