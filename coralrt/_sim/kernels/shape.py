"""Data-movement kernels: concatenation, reshapes, packing, splitting, slicing,
padding, space-to-depth, transposition and tiling.

These move 8-bit values without arithmetic, with two exceptions that follow
LiteRT's reference kernels: uint8 CONCATENATION requantizes inputs whose
quantization differs from the output's (in float32, as TFLite does), and PAD
fills with the output zero point.  Where LiteRT refuses differing input and
output quantization (int8 CONCATENATION, PACK, EXPAND_DIMS) the factory
refuses too; the other operators copy the stored bytes unchanged, whatever
the quantization says, exactly like LiteRT.

Index arithmetic (axes, slice bounds, permutations) is resolved once in the
factory; ``run`` only indexes, reshapes or copies.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import ModelError
from coralrt._ops.arith.fixedpoint import c_int32, wrap_int32
from coralrt._sim.kernels import OpContext

__all__: list[str] = []


def _refuse(ctx: OpContext, detail: str):
    raise ModelError(detail, where=f"{ctx.op.name} operator")


def _declared_as_computed(ctx: OpContext, shapes: list[tuple]) -> None:
    # LiteRT gives these outputs the shapes it computes whatever the file
    # declares; the simulated Edge TPU moves the declared number of bytes, so
    # it declines a declared shape that is not the computed one (a SPLIT
    # output declared 1x20488x8x1 for 1x8x8x1 left it waiting for bytes that
    # never came; found by fuzzing).
    for k, (t, want) in enumerate(zip(ctx.outputs, shapes)):
        if tuple(t.shape) != tuple(int(d) for d in want):
            _refuse(ctx, f"output {k} is declared {list(t.shape)} but the operator makes "
                         f"{[int(d) for d in want]}")


def _constant(ctx: OpContext, k: int, what: str) -> np.ndarray:
    value = ctx.const(k)
    if value is None:
        _refuse(ctx, f"{what} (input {k}) must be a constant")
    return np.asarray(value).astype(np.int64)


def _same_quant(ctx: OpContext, a, b) -> bool:
    """TFLite's check: float32 scales and zero points compare equal."""
    return ctx.scale(a) == ctx.scale(b) and ctx.zero_point(a) == ctx.zero_point(b)


def _is_8bit(ctx: OpContext, t) -> bool:
    return ctx.dtype(t) in (np.dtype(np.uint8), np.dtype(np.int8))


def _require_same_quant(ctx: OpContext, tensors) -> None:
    out = ctx.outputs[0]
    if not _is_8bit(ctx, out):
        return
    for t in tensors:
        if not _same_quant(ctx, t, out):
            _refuse(ctx, f"input {t.name!r} is quantized differently from the output "
                         f"({ctx.scale(t)}, {ctx.zero_point(t)} vs {ctx.scale(out)}, "
                         f"{ctx.zero_point(out)}); TFLite requires them equal")


def _reshaper(ctx: OpContext):
    shape = tuple(ctx.outputs[0].shape)
    dtype = ctx.dtype(ctx.outputs[0])

    def run(inputs):
        return [np.asarray(inputs[0]).reshape(shape).astype(dtype, copy=False)]
    return run


def reshape(ctx: OpContext):
    # The output tensor already carries the shape that the constant shape
    # input, the new_shape option or squeeze/expand axes resolve to; the
    # bytes are copied unchanged.  Of the three, only EXPAND_DIMS insists on
    # equal quantization in TFLite.
    x, out = ctx.inputs[0], ctx.outputs[0]
    if ctx.op.name == "EXPAND_DIMS":
        _require_same_quant(ctx, [x])
    if int(np.prod(x.shape, dtype=np.int64)) != int(np.prod(out.shape, dtype=np.int64)):
        _refuse(ctx, f"cannot reshape {tuple(x.shape)} to {tuple(out.shape)}")
    return _reshaper(ctx)


def concatenation(ctx: OpContext):
    if ctx.params.get("fused_activation_function", 0) != 0:
        _refuse(ctx, "a fused activation is not supported by TFLite's CONCATENATION")
    ins = [t for t in ctx.inputs if t is not None]
    out = ctx.outputs[0]
    rank = len(ins[0].shape)
    axis = int(ctx.params.get("axis", 0))
    if axis < 0:
        axis += rank
    if not 0 <= axis < max(rank, 1):
        _refuse(ctx, f"axis {ctx.params.get('axis')} is out of range for rank {rank}")
    dtype = ctx.dtype(out)
    if dtype == np.dtype(np.int8):
        _require_same_quant(ctx, ins)
    # Per input: None to copy bytes, else the float32 (scale, bias) of
    # TFLite's uint8 requantization round(q * scale + bias) + output zero point.
    plans = []
    if dtype == np.dtype(np.uint8):
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            inverse = np.float32(1.0) / np.float32(ctx.scale(out))
            for t in ins:
                if _same_quant(ctx, t, out):
                    plans.append(None)
                else:
                    scale = np.float32(np.float32(ctx.scale(t)) * inverse)
                    bias = np.float32(np.float32(-ctx.zero_point(t)) * scale)
                    plans.append((scale, bias))
    else:
        plans = [None] * len(ins)
    out_zp = ctx.zero_point(out)
    out_shape = tuple(out.shape)

    def convert(x, plan):
        if plan is None:
            return x
        scale, bias = plan
        with np.errstate(over="ignore", invalid="ignore"):
            v = (x.astype(np.float32) * scale + bias).astype(np.float64)
            r = np.trunc(v + np.where(v >= 0, 0.5, -0.5))   # round half away from zero
        if np.all(np.abs(r) < 2.0**30):
            return np.clip(r + out_zp, 0, 255).astype(np.uint8)
        # static_cast<int32_t> (INT32_MIN past the int32 range, for extreme
        # scale ratios), plus the output zero point with int32 wrap-around.
        q = wrap_int32(c_int32(r) + out_zp)
        return np.clip(q, 0, 255).astype(np.uint8)

    # A uint8 input has 256 values: its requantization is a table of them, computed
    # once with the same arithmetic, so the result is the same, bit for bit.
    every_code = np.arange(256, dtype=np.uint8)
    tables = [convert(every_code, p) if p is not None and ctx.dtype(t) == np.dtype(np.uint8)
              else None for t, p in zip(ins, plans)]

    def run(inputs):
        parts = [table[np.asarray(x)] if table is not None else convert(np.asarray(x), p)
                 for x, p, table in zip(inputs, plans, tables)]
        if rank == 0:
            return [np.stack(parts).astype(dtype, copy=False).reshape(out_shape)]
        return [np.concatenate(parts, axis=axis).astype(dtype, copy=False)]
    return run


def pack(ctx: OpContext):
    ins = [t for t in ctx.inputs if t is not None]
    _require_same_quant(ctx, ins)
    rank = len(ins[0].shape)
    axis = int(ctx.params.get("axis", 0))
    if axis < 0:
        axis += rank + 1
    if not 0 <= axis <= rank:
        _refuse(ctx, f"axis {ctx.params.get('axis')} is out of range for rank {rank}")
    dtype = ctx.dtype(ctx.outputs[0])
    _declared_as_computed(ctx, [(*ins[0].shape[:axis], len(ins), *ins[0].shape[axis:])])

    def run(inputs):
        return [np.stack(inputs, axis=axis).astype(dtype, copy=False)]
    return run


def split(ctx: OpContext):
    data = ctx.inputs[1]
    axis = int(_constant(ctx, 0, "the split axis").reshape(-1)[0])
    rank = len(data.shape)
    if axis < 0:
        axis += rank
    if not 0 <= axis < rank:
        _refuse(ctx, f"split axis out of range for rank {rank}")
    n = len(ctx.outputs)
    if data.shape[axis] % n:
        _refuse(ctx, f"dimension {data.shape[axis]} does not split into {n} equal parts")
    step = data.shape[axis] // n
    _declared_as_computed(ctx, [(*data.shape[:axis], step, *data.shape[axis + 1:])] * n)
    index = [[slice(None)] * rank for _ in range(n)]
    for k in range(n):
        index[k][axis] = slice(k * step, (k + 1) * step)
    index = [tuple(i) for i in index]

    def run(inputs):
        x = np.asarray(inputs[1])
        return [x[i] for i in index]
    return run


def slice_(ctx: OpContext):
    x = ctx.inputs[0]
    begin = _constant(ctx, 1, "begin").reshape(-1)
    size = _constant(ctx, 2, "size").reshape(-1)
    index = []
    for d, dim in enumerate(x.shape):
        b = int(begin[d]) if d < begin.size else 0
        s = int(size[d]) if d < size.size else -1
        e = dim if s == -1 else b + s
        if not 0 <= b <= e <= dim:
            _refuse(ctx, f"slice [{b}, {e}) is outside dimension {d} of size {dim}")
        index.append(slice(b, e))
    index = tuple(index)
    shape = tuple(ctx.outputs[0].shape)

    def run(inputs):
        return [np.asarray(inputs[0])[index].reshape(shape)]
    return run


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(v, hi))


def strided_slice(ctx: OpContext):
    p = ctx.params
    if p.get("ellipsis_mask", 0) or p.get("new_axis_mask", 0):
        _refuse(ctx, "ellipsis and new-axis masks are not supported")
    x = ctx.inputs[0]
    rank = len(x.shape)
    begin = _constant(ctx, 1, "begin").reshape(-1)
    end = _constant(ctx, 2, "end").reshape(-1)
    strides = (_constant(ctx, 3, "strides").reshape(-1) if len(ctx.inputs) > 3
               and ctx.inputs[3] is not None else np.ones(rank, np.int64))
    begin_mask, end_mask = int(p.get("begin_mask", 0)), int(p.get("end_mask", 0))
    shrink_mask, offset = int(p.get("shrink_axis_mask", 0)), bool(p.get("offset", False))
    index = []
    for d in range(rank):
        dim = x.shape[d]
        if d >= begin.size:        # dimensions past the given ones are kept whole
            index.append(slice(None))
            continue
        stride = int(strides[d])
        if stride == 0:
            _refuse(ctx, f"stride 0 on dimension {d}")
        # TFLite's StartForAxis / EndForAxis: normalise, clamp for the
        # direction, then let the masks override.
        start = int(begin[d])
        if start < 0:
            start += dim
        start = _clamp(start, 0, dim) if stride > 0 else _clamp(start, -1, dim - 1)
        if begin_mask & (1 << d):
            start = 0 if stride > 0 else dim - 1
        if shrink_mask & (1 << d):
            stop = start if start >= dim else start + 1
        else:
            stop = int(end[d]) + (start if offset else 0)
            if stop < 0:
                stop += dim
            stop = _clamp(stop, 0, dim) if stride > 0 else _clamp(stop, -1, dim - 1)
            if end_mask & (1 << d):
                stop = dim if stride > 0 else -1
        # -1 (before the first element) is a valid C loop bound but means the
        # last element in Python: an empty start, or an open stop.
        if start < 0:
            index.append(slice(0, 0))
        else:
            index.append(slice(start, None if stop < 0 else stop, stride))
    index = tuple(index)
    shape = tuple(ctx.outputs[0].shape)

    def run(inputs):
        return [np.ascontiguousarray(np.asarray(inputs[0])[index]).reshape(shape)]
    return run


def pad(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    paddings = _constant(ctx, 1, "paddings").reshape(-1, 2)
    rank = len(x.shape)
    if paddings.shape[0] != rank or (paddings < 0).any():
        _refuse(ctx, f"paddings {paddings.tolist()} do not fit rank {rank}")
    dtype = ctx.dtype(out)
    fill = ctx.zero_point(out) if _is_8bit(ctx, out) and len(out.scales) else 0
    info = np.iinfo(dtype) if dtype.kind in "iu" else None
    if info is not None and not info.min <= fill <= info.max:
        _refuse(ctx, f"output zero point {fill} is outside the range of {dtype}")
    shape = tuple(int(d) for d in out.shape)
    inner = tuple(slice(int(lo), int(lo) + dim) for (lo, _), dim in zip(paddings, x.shape))

    def run(inputs):
        y = np.full(shape, fill, dtype)
        y[inner] = inputs[0]
        return [y]
    return run


def space_to_depth(ctx: OpContext):
    x = ctx.inputs[0]
    bs = int(ctx.params.get("block_size", 0))
    if len(x.shape) != 4 or bs < 1 or x.shape[1] % bs or x.shape[2] % bs:
        _refuse(ctx, f"block size {bs} does not divide the input {tuple(x.shape)}")
    b, h, w, c = x.shape
    split = (b, h // bs, bs, w // bs, bs, c)
    shape = tuple(ctx.outputs[0].shape)

    def run(inputs):
        y = np.asarray(inputs[0]).reshape(split).transpose(0, 1, 3, 2, 4, 5)
        return [np.ascontiguousarray(y).reshape(shape)]
    return run


def transpose(ctx: OpContext):
    x = ctx.inputs[0]
    rank = len(x.shape)
    perm = [int(v) for v in _constant(ctx, 1, "perm").reshape(-1)]
    perm = [v + rank if v < 0 else v for v in perm]
    if sorted(perm) != list(range(rank)):
        _refuse(ctx, f"perm {perm} is not a permutation of {rank} dimensions")
    perm = tuple(perm)

    def run(inputs):
        return [np.ascontiguousarray(np.transpose(inputs[0], perm))]
    return run


def tile(ctx: OpContext):
    # TFLite's TILE copies the stored values, whatever the quantization says;
    # the multiples must be constant here (a segment has fixed shapes).
    multiples = _constant(ctx, 1, "the multiples")
    x, out = ctx.inputs[0], ctx.outputs[0]
    if multiples.shape != (len(x.shape),) or (multiples < 0).any():
        _refuse(ctx, f"multiples {multiples.tolist()} do not fit an input of rank "
                     f"{len(x.shape)}")
    reps = tuple(int(m) for m in multiples)
    if tuple(int(d) * m for d, m in zip(x.shape, reps)) != tuple(out.shape):
        _refuse(ctx, f"tiling {tuple(x.shape)} by {reps} does not give {tuple(out.shape)}")
    dtype = ctx.dtype(out)

    def run(inputs):
        return [np.tile(np.asarray(inputs[0]), reps).astype(dtype, copy=False)]
    return run
