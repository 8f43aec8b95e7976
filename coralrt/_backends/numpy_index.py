"""Kernels of the NumPy CPU backend that take any type: indexing, casts, and
integer arithmetic on plain (not quantized) int32/int64 tensors.

Factories in the form of :mod:`coralrt._backends.numpy_kernels`; what they
follow (TFLite's reference kernels), all bit-exact:

* ARG_MAX/ARG_MIN: the first extreme index.
* GATHER (batch_dims 0) and GATHER_ND: data movement; an index out of range
  fails the run with InferenceError, as it fails TFLite's.
* UNPACK, SPLIT_V, DEPTH_TO_SPACE: data movement.
* CAST: ``static_cast`` of the stored values (quantization ignored, as TFLite
  does); float to integer truncates toward zero.  Values a C cast leaves
  undefined (NaN, out of range) give NumPy's answer.
* ADD, SUB, MUL of int32/int64 tensors: the integer operation (wrapping on
  overflow, as the C++ kernels do in practice) and the fused activation's
  integer range.  FLOOR_DIV of int32/int64 (floor of the quotient; a zero
  divisor fails the run, as in TFLite) or float32 (``floor(a / b)``).
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import InferenceError
from coralrt._model.types import numpy_dtype
from coralrt._ops.arith.common import refuse
from coralrt._ops.fused import fused_bounds
from coralrt._sim.kernels import OpContext

from coralrt._backends.numpy_kernels import dequantize

__all__ = ["is_plain_wide_int"]

_INDEX_TYPES = (np.dtype(np.int16), np.dtype(np.int32), np.dtype(np.int64))


def _axis(ctx: OpContext, axis: int, rank: int) -> int:
    k = axis + rank if axis < 0 else axis
    if not 0 <= k < max(rank, 1):
        refuse(ctx, f"axis {axis} is out of range for rank {rank}")
    return k


def _out_of_range(op: str, idx: np.ndarray, n) -> None:
    # TFLite fails the invocation; NumPy would wrap negative indices.
    bad = idx[(idx < 0) | (idx >= n)]
    if bad.size:
        raise InferenceError(f"{op} index {int(bad.reshape(-1)[0])} is out of range for a "
                             f"dimension of {int(np.max(n)) if np.ndim(n) else int(n)}")


_WIDE_INTS = (np.dtype(np.int32), np.dtype(np.int64))


def is_plain_wide_int(t) -> bool:
    """Whether a segment tensor holds int32 or int64 values without quantization."""
    return t is not None and numpy_dtype(t.dtype) in _WIDE_INTS and not len(t.scales)


def _binary_int(fn):
    """ADD, SUB, MUL of int32 or int64 tensors (not quantized): the C++ integer
    operation, which wraps on overflow as NumPy's does, then the fused activation."""
    def factory(ctx: OpContext):
        a, b, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
        dtype = ctx.dtype(out)
        if ctx.dtype(a) != dtype or ctx.dtype(b) != dtype:
            refuse(ctx, f"operands {a.type_name}, {b.type_name} and output {out.type_name} "
                         f"are not one type")
        code = int(ctx.params.get("fused_activation_function", 0) or 0)
        # CalculateActivationRange for int32/int64: the same bounds, as integers.
        bounds = tuple(None if b is None else int(b) for b in fused_bounds(
            code, op_name=ctx.op.name,
            message="fused activation {code} is not supported for integers"))
        bounds = None if bounds == (None, None) else bounds
        shape = tuple(out.shape)
        try:
            np.broadcast_shapes(tuple(a.shape), tuple(b.shape))
        except ValueError:
            refuse(ctx, f"shapes {tuple(a.shape)} and {tuple(b.shape)} do not broadcast")

        def run(inputs):
            r = np.asarray(fn(np.asarray(inputs[0], dtype), np.asarray(inputs[1], dtype)), dtype)
            if bounds is not None:
                r = np.clip(r, bounds[0], bounds[1])
            return [r.astype(dtype, copy=False).reshape(shape)]
        return run
    return factory


def arg_extreme(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    axis_values = ctx.const(1)
    if axis_values is None or np.asarray(axis_values).size != 1:
        refuse(ctx, "the axis (input 1) must be a constant holding one value")
    axis = _axis(ctx, int(np.asarray(axis_values).reshape(-1)[0]), len(x.shape))
    dtype = ctx.dtype(out)
    if dtype not in (np.dtype(np.int32), np.dtype(np.int64)):
        refuse(ctx, f"output type {out.type_name} is not INT32 or INT64")
    fn = np.argmax if ctx.op.name == "ARG_MAX" else np.argmin
    shape = tuple(out.shape)
    return lambda inputs: [fn(np.asarray(inputs[0]), axis=axis).astype(dtype).reshape(shape)]


def _gather_operands(ctx: OpContext):
    """(values, indices, output) of GATHER or GATHER_ND, their types checked."""
    params, indices, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    if ctx.dtype(indices) not in _INDEX_TYPES:
        refuse(ctx, f"indices of type {indices.type_name} (INT16, INT32 and INT64 are "
                     f"supported)")
    if ctx.dtype(params).kind not in "fiub":
        refuse(ctx, f"values of type {params.type_name} are not supported")
    return params, indices, out


def gather(ctx: OpContext):
    params, indices, out = _gather_operands(ctx)
    if int(ctx.params.get("batch_dims", 0) or 0) != 0:
        refuse(ctx, "batch_dims other than 0 is not supported")
    if not len(params.shape):
        refuse(ctx, "the values are a scalar; GATHER needs at least one dimension")
    axis = _axis(ctx, int(ctx.params.get("axis", 0) or 0), len(params.shape))
    n, shape, dtype = int(params.shape[axis]), tuple(out.shape), ctx.dtype(out)

    def run(inputs):
        idx = np.asarray(inputs[1])
        _out_of_range("GATHER", idx, n)
        return [np.take(np.asarray(inputs[0]), idx, axis=axis).astype(dtype, copy=False)
                .reshape(shape)]
    return run


def gather_nd(ctx: OpContext):
    params, indices, out = _gather_operands(ctx)
    depth = int(indices.shape[-1]) if len(indices.shape) else 0
    if not 0 < depth <= len(params.shape):
        refuse(ctx, f"index depth {depth} does not fit values of rank {len(params.shape)}")
    limits = np.array(params.shape[:depth], np.int64)
    shape, dtype = tuple(out.shape), ctx.dtype(out)

    def run(inputs):
        idx = np.asarray(inputs[1]).astype(np.int64).reshape(-1, depth)
        _out_of_range("GATHER_ND", idx, limits)
        values = np.asarray(inputs[0])[tuple(idx.T)]
        return [values.astype(dtype, copy=False).reshape(shape)]
    return run


def unpack(ctx: OpContext):
    x = ctx.inputs[0]
    rank = len(x.shape)
    axis = _axis(ctx, int(ctx.params.get("axis", 0) or 0), rank)
    if int(x.shape[axis]) != len(ctx.outputs):
        refuse(ctx, f"{len(ctx.outputs)} outputs for a dimension of {x.shape[axis]}")
    shapes = [tuple(t.shape) for t in ctx.outputs]
    dtypes = [ctx.dtype(t) for t in ctx.outputs]

    def run(inputs):
        v = np.asarray(inputs[0])
        return [np.take(v, k, axis=axis).astype(d, copy=False).reshape(s)
                for k, (s, d) in enumerate(zip(shapes, dtypes))]
    return run


def cast(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    src, dst = ctx.dtype(x), ctx.dtype(out)
    if src.kind not in "fiub" or dst.kind not in "fiub":
        refuse(ctx, f"casting {x.type_name} to {out.type_name} is not supported")
    shape = tuple(out.shape)

    def run(inputs):
        with np.errstate(invalid="ignore", over="ignore"):
            v = np.asarray(inputs[0])
            if dst.kind == "b":
                r = v != 0
            else:
                r = v.astype(dst)          # float -> int truncates toward zero, as C
        return [r.reshape(shape)]
    return run


def floor_div(ctx: OpContext):
    a, b, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    dtype = ctx.dtype(out)
    if ctx.dtype(a) != dtype or ctx.dtype(b) != dtype or \
            dtype not in (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float32)):
        refuse(ctx, f"operands {a.type_name}, {b.type_name} and output {out.type_name}: "
                     f"INT32, INT64 or FLOAT32, one type, are supported")
    shape = tuple(out.shape)

    def run(inputs):
        x, y = np.asarray(inputs[0], dtype), np.asarray(inputs[1], dtype)
        if dtype.kind == "f":
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                r = np.floor(x / y)
        else:
            if np.any(y == 0):
                raise InferenceError("FLOOR_DIV: division by zero")
            r = np.floor_divide(x, y)
        return [np.asarray(r, dtype).reshape(shape)]
    return run


def split_v(ctx: OpContext):
    x = ctx.inputs[0]
    sizes, axis_value = ctx.const(1), ctx.const(2)
    if sizes is None or axis_value is None or np.asarray(axis_value).size != 1:
        refuse(ctx, "the sizes (input 1) and the axis (input 2) must be constants")
    rank = len(x.shape)
    axis = _axis(ctx, int(np.asarray(axis_value).reshape(-1)[0]), rank)
    sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
    if sizes.count(-1) == 1:
        sizes[sizes.index(-1)] = int(x.shape[axis]) - (sum(sizes) + 1)
    if len(sizes) != len(ctx.outputs) or any(s < 0 for s in sizes) \
            or sum(sizes) != int(x.shape[axis]):
        refuse(ctx, f"sizes {sizes} do not split a dimension of {x.shape[axis]} into "
                     f"{len(ctx.outputs)} outputs")
    bounds = np.cumsum(sizes)[:-1].tolist()
    shapes = [tuple(t.shape) for t in ctx.outputs]

    def run(inputs):
        parts = np.split(np.asarray(inputs[0]), bounds, axis=axis)
        return [p.reshape(s) for p, s in zip(parts, shapes)]
    return run


def depth_to_space(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    bs = int(ctx.params.get("block_size", 0) or 0)
    if len(x.shape) != 4 or bs < 1 or x.shape[3] % (bs * bs):
        refuse(ctx, f"input {tuple(x.shape)} with block size {bs}: needs NHWC with depth "
                     f"a multiple of {bs}x{bs}")
    n, h, w, c = (int(d) for d in x.shape)
    depth, shape = c // (bs * bs), tuple(out.shape)

    def run(inputs):
        v = np.asarray(inputs[0]).reshape(n, h, w, bs, bs, depth).transpose(0, 1, 3, 2, 4, 5)
        return [v.reshape(shape)]
    return run


# int32/int64 kernels made from one NumPy function; the operator specs
# (coralrt._ops) name them and every other kernel of this module.
add_int, sub_int, mul_int = (_binary_int(f) for f in (np.add, np.subtract, np.multiply))
