"""Spatial resizing of NHWC tensors: RESIZE_BILINEAR, RESIZE_NEAREST_NEIGHBOR.

LiteRT's reference kernels take different paths per type, and both are
reproduced here:

- uint8 bilinear is the float template: source coordinates, fractions and
  the four-term blend are all float32, evaluated in TFLite's order
  ``((v * wy) * wx)`` summed left to right, plus 0.5, then truncated;
- int8 bilinear is the integer variant: coordinates in 1/1024 units
  (``scale_10``), int64 products and a 2^20 division rounding half away
  from zero.

Nearest neighbour picks source indices with float32 arithmetic, rounding
(``align_corners``) or flooring.  The values are never requantized: like
LiteRT, the kernels copy and blend the stored integers whatever the input and
output quantization say.  Every coordinate, index and weight depends only on
the shapes, so the factory computes them and ``run`` only gathers and blends.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import ModelError
from coralrt._ops.arith.parallel import for_bands
from coralrt._ops.arith.scratch import TEMPORARIES
from coralrt._sim.kernels import OpContext

__all__: list[str] = []

_F = np.float32
_BAND = 1 << 16                 # output values per band of rows


def _refuse(ctx: OpContext, detail: str):
    raise ModelError(detail, where=f"{ctx.op.name} operator")


def _sizes(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    if len(x.shape) != 4 or len(out.shape) != 4:
        _refuse(ctx, "input and output must be 4-D (NHWC)")
    if x.shape[0] != out.shape[0] or x.shape[3] != out.shape[3]:
        _refuse(ctx, f"cannot resize {tuple(x.shape)} to {tuple(out.shape)}")
    size = ctx.const(1)
    if size is not None and tuple(np.asarray(size).reshape(-1).tolist()) != tuple(out.shape[1:3]):
        _refuse(ctx, f"size {np.asarray(size).tolist()} does not match the output "
                     f"{tuple(out.shape)}")
    if min(out.shape[1:3]) < 1 or min(x.shape[1:3]) < 1:
        _refuse(ctx, "empty spatial dimensions")
    return int(x.shape[1]), int(x.shape[2]), int(out.shape[1]), int(out.shape[2])


# -- bilinear -----------------------------------------------------------------


def _float_axis(n_in: int, n_out: int, align: bool, half: bool):
    """Source indices and float32 fractions along one axis (float template)."""
    if align and n_out > 1:
        scale = _F(n_in - 1) / _F(n_out - 1)
    else:
        scale = _F(n_in) / _F(n_out)
    v = np.arange(n_out, dtype=_F)
    pos = (v + _F(0.5)) * scale - _F(0.5) if half else v * scale
    lo = np.maximum(np.floor(pos).astype(np.int64), 0)
    hi = np.minimum(np.ceil(pos).astype(np.int64), n_in - 1)
    frac = (pos - lo.astype(_F)).astype(_F)
    return np.minimum(lo, n_in - 1), hi, frac


def _int_axis(n_in: int, n_out: int, align: bool, half: bool):
    """Source indices and 1/1024 weights along one axis (integer variant)."""
    if align and n_out > 1:
        scale = ((1 << 10) * (n_in - 1) + (n_out - 1) // 2) // (n_out - 1)
    else:
        scale = ((1 << 10) * n_in + n_out // 2) // n_out
    v = np.arange(n_out, dtype=np.int64)
    pos = v * scale + scale // 2 - (1 << 9) if half else v * scale
    # C++ division truncates toward zero.
    lo = np.maximum(np.trunc(pos / 1024).astype(np.int64), 0)
    up = pos + 1023
    hi = np.minimum(np.where(up >= 0, up // 1024, -((-up) // 1024)), n_in - 1)
    w1 = pos - 1024 * lo
    return np.minimum(lo, n_in - 1), hi, 1024 - w1, w1


def resize_bilinear(ctx: OpContext):
    align = bool(ctx.params.get("align_corners", False))
    half = bool(ctx.params.get("half_pixel_centers", False))
    if align and half:
        _refuse(ctx, "half_pixel_centers requires align_corners to be false")
    ih, iw, oh, ow = _sizes(ctx)
    dtype = ctx.dtype(ctx.outputs[0])
    if dtype == np.dtype(np.uint8):
        return _bilinear_uint8(ctx, ih, iw, oh, ow, align, half)
    if dtype != np.dtype(np.int8):
        _refuse(ctx, f"type {dtype} is not supported (uint8 and int8 are)")
    y0, y1, wy0, wy1 = _int_axis(ih, oh, align, half)
    x0, x1, wx0, wx1 = _int_axis(iw, ow, align, half)
    w00 = (wy0[:, None] * wx0[None, :])[..., None]
    w10 = (wy1[:, None] * wx0[None, :])[..., None]
    w01 = (wy0[:, None] * wx1[None, :])[..., None]
    w11 = (wy1[:, None] * wx1[None, :])[..., None]

    def run_int8(inputs):
        x = np.asarray(inputs[0]).astype(np.int64)
        r0, r1 = x[:, y0], x[:, y1]
        acc = r0[:, :, x0] * w00 + r1[:, :, x0] * w10 + r0[:, :, x1] * w01 \
            + r1[:, :, x1] * w11
        acc += np.where(acc > 0, 1 << 19, -(1 << 19))
        q = np.where(acc >= 0, acc >> 20, -((-acc) >> 20))
        return [q.astype(np.int8)]
    return run_int8


def _bilinear_uint8(ctx: OpContext, ih: int, iw: int, oh: int, ow: int, align: bool,
                    half: bool):
    """The float template, in TFLite's order ``((v * wy) * wx)``.

    The products by the row weights are taken on the input's columns, before
    the columns are gathered (the same float32 products, ``iw / ow`` as
    many); columns and channels are flattened so that each gather and blend
    is one long loop per output row.  The float -> uint8 conversion goes
    through int32 and keeps the low byte; the blend of values up to 255 stays
    below 256 (checked here on the all-255 input, the largest since every
    step is monotone), so a direct cast gives the same bytes.
    """
    c = int(ctx.inputs[0].shape[3])
    y0, y1, dy = _float_axis(ih, oh, align, half)
    x0, x1, dx = _float_axis(iw, ow, align, half)
    wy0, wy1 = (_F(1) - dy)[:, None, None], dy[:, None, None]
    wx0, wx1 = np.repeat(_F(1) - dx, c), np.repeat(dx, c)
    ch = np.arange(c)
    i0, i1 = (x0[:, None] * c + ch).reshape(-1), (x1[:, None] * c + ch).reshape(-1)
    full = np.full((1, oh, ow * c), _F(255))
    top = full * wy0[:, :, 0] * wx0 + full * wy1[:, :, 0] * wx0 + full * wy0[:, :, 0] * wx1 \
        + full * wy1[:, :, 0] * wx1 + _F(0.5)
    direct = bool(top.max(initial=0) < 256)
    # The source columns are non-decreasing (floor and ceil of increasing positions).
    sorted_cols = bool((np.diff(x0) >= 0).all() and (np.diff(x1) >= 0).all())
    counts = (np.bincount(x0, minlength=iw), np.bincount(x1, minlength=iw))
    band = max(1, _BAND // max(ow * c, 1))

    def run(inputs):
        x = np.asarray(inputs[0])
        n = x.shape[0]
        xf = x.astype(_F)
        a0 = (xf[:, y0] * wy0).reshape(n, oh, iw * c)
        a1 = (xf[:, y1] * wy1).reshape(n, oh, iw * c)
        out = np.empty((n, oh, ow, c), np.uint8)
        flat = out.reshape(n, oh, ow * c)

        def gather(src, b, r0, r1, which):
            if sorted_cols:      # runs of repeated columns: np.repeat, 5x faster than take
                return np.repeat(src[b, r0:r1].reshape(r1 - r0, iw, c), counts[which],
                                 axis=1).reshape(r1 - r0, ow * c)
            t = TEMPORARIES.array(f"resize.{which}", (r1 - r0, ow * c), _F)
            return np.take(src[b, r0:r1], (i0, i1)[which], axis=1, out=t)

        def rows(r0, r1):
            for b in range(n):
                v = gather(a0, b, r0, r1, 0)
                v *= wx0
                for src, which, w in ((a1, 0, wx0), (a0, 1, wx1), (a1, 1, wx1)):
                    t = gather(src, b, r0, r1, which)
                    t *= w
                    v += t
                v += _F(0.5)
                if direct:
                    np.copyto(flat[b, r0:r1], v, casting="unsafe")
                else:
                    flat[b, r0:r1] = (v.astype(np.int32) & 0xFF).astype(np.uint8)

        for_bands(oh, band, rows)
        return [out]
    return run


# -- nearest neighbour ----------------------------------------------------------


def _nearest_axis(n_in: int, n_out: int, align: bool, half: bool) -> np.ndarray:
    if align and n_out > 1:
        scale = _F(n_in - 1) / _F(n_out - 1)
    else:
        scale = _F(n_in) / _F(n_out)
    pos = ((np.arange(n_out, dtype=_F) + _F(0.5 if half else 0.0)) * scale).astype(np.float64)
    if align:
        idx = np.trunc(pos + np.where(pos >= 0, 0.5, -0.5))    # round half away from zero
    else:
        idx = np.floor(pos)
    idx = np.minimum(idx.astype(np.int64), n_in - 1)
    if half:
        idx = np.maximum(idx, 0)
    return idx


def resize_nearest_neighbor(ctx: OpContext):
    align = bool(ctx.params.get("align_corners", False))
    half = bool(ctx.params.get("half_pixel_centers", False))
    ih, iw, oh, ow = _sizes(ctx)
    ys = _nearest_axis(ih, oh, align, half)
    xs = _nearest_axis(iw, ow, align, half)
    dtype = ctx.dtype(ctx.outputs[0])

    def run(inputs):
        x = np.asarray(inputs[0])
        return [x[:, ys][:, :, xs].astype(dtype, copy=False)]
    return run

