"""The ``fc_as_conv`` rewrite: a FULLY_CONNECTED over a matrix becomes a 1x1 CONV_2D.

When it applies
---------------
A quantized (uint8 or int8 activations) FULLY_CONNECTED with constant 8-bit
weights (k x n), a constant bias or none, the default ``weights_format``, and an
input that is a matrix: after flattening every axis but the last it is m x n
with m > 1, so the output (m x k, or the ``keep_num_dims=True`` form such as
1 x m x k) is not a vector.  The Edge TPU maps FULLY_CONNECTED only when it
produces a vector (``fc_default_weights`` in :mod:`coralrt._compile.checks`), so
such layers, the inner layers of Transformers, otherwise stay on the CPU.
Left alone: vector FCs (they map as they are), float or hybrid FCs, FCs whose
weights are not constant, shuffled weight formats, and int8 weights with a
non-zero zero point (LiteRT's int8 convolution ignores the weights' zero point
where its FULLY_CONNECTED does not, so the result would differ).

What it emits
-------------
``RESHAPE`` (input -> 1 x 1 x m x n) -> ``CONV_2D`` -> ``RESHAPE`` (1 x 1 x m x k
-> the FC's own output shape).  The convolution has k filters of 1 x 1 over n
input channels: the FC weights (k, n) are reused one to one as (k, 1, 1, n) with
the same quantization (per-channel scales stay on axis 0, the output axis of
both layouts), the same bias (a zero bias of scale ``in_scale * w_scale`` is
added when the FC had none), stride 1, VALID padding and the same fused
activation.  CONV_2D is version 3 for int8 (per-channel int8, as LiteRT's
converter writes it) and 1 for uint8.

The layout
----------
``C = A . B`` (A m x n, B n x k) can be written as a convolution in two ways:
k kernels of 1 x n slid over a one-channel m x n image (the form in the
Transformers-on-Edge-TPU study), or k kernels of 1 x 1 over an image of m
pixels with n channels.  This rewrite uses the second:
it is the pointwise convolution mobile networks are built from, which the
Edge TPU compiler maps at any depth; its weights are the FC's bytes as they
are (no transpose, and per-channel quantization stays on the output axis,
axis 0 of both layouts); and its output width k is the channel count that the
``layer_width`` check and the ``split_wide`` rewrite reason about, so a wide
layer is split the same way whether it started as an FC or a convolution.
The 1 x n form would put the whole reduction into the kernel's width over a
single input channel, a layout for which there is no evidence here of how the
compiler maps it, and it would need the weights reshaped to (k, 1, n, 1).

Why it is exact
---------------
Each output value of the convolution is the same sum over the same n products
of zero-point-corrected 8-bit values as the FC's, plus the same int32 bias,
then rescaled with the same multiplier (``in_scale * w_scale / out_scale``),
rounded, offset and clamped the same way.  With LiteRT's default kernels the
two graphs agree bit for bit (uint8 per-tensor, int8 per-tensor and int8
per-channel weights).  LiteRT's reference FULLY_CONNECTED (the ``BUILTIN_REF``
resolver) rescales accumulators as ``round(acc * double scale)`` instead of
with the fixed-point multiplier its convolution uses (``FC_DOUBLE_ROUNDING`` in
the simulator's conv kernels), so against the reference kernels a value whose
scaled accumulator lies within rounding distance of a half-way point can move
by one unit: measured at most 1 LSB on 0.05-0.25 % of the outputs of random
test layers.  The simulated Edge TPU's CONV_2D rescales in fixed point like
LiteRT's convolution, and matches the rewritten graph bit for bit.
"""

from __future__ import annotations

import numpy as np

from coralrt._compile.rewrite.base import RewriteRecord

__all__ = ["FcAsConv", "FC_AS_CONV"]

EIGHT_BIT = ("UINT8", "INT8")


def quant_kwargs(q, *, axis: int | None = None, lo: int = 0, hi: int | None = None) -> dict:
    """``add_tensor`` keyword arguments repeating quantization ``q``; per-channel
    parameters along ``axis`` are cut to channels ``lo:hi``."""
    if q is None or not q.scale.size:
        return {}
    scale, zp, dim = q.scale, q.zero_point, q.quantized_dimension
    if scale.size > 1 and axis is not None and dim == axis:
        scale, zp = scale[lo:hi], zp[lo:hi] if zp.size > 1 else zp
    return {"scale": scale.copy(), "zero_point": zp.copy(), "axis": dim}


def is_eight_bit(t) -> bool:
    return t.type_name in EIGHT_BIT and t.quantization is not None and \
        bool(t.quantization.scale.size)


def reshape_op(editor, src: int, dst: int):
    """A RESHAPE from tensor ``src`` to tensor ``dst`` (shape as a constant input and
    as the ``new_shape`` option, as LiteRT's converter writes it)."""
    shape = [int(d) for d in editor.tensor(dst).shape]
    name = editor.tensor(dst).name + "/shape"
    const = editor.add_constant(name, np.array(shape, np.int32))
    return editor.make_op("RESHAPE", [src, const], [dst], new_shape=shape)


def bias_or_zero(editor, op, k: int, name: str) -> int | None:
    """The FC's bias tensor index, a new zero bias when it has none, or None when
    the bias is not a constant."""
    b = op.inputs[2] if len(op.inputs) > 2 else -1
    if b >= 0:
        return b if editor.const(b) is not None else None
    x, w = editor.tensor(op.inputs[0]), editor.tensor(op.inputs[1])
    scale = np.float32(x.quantization.scale[0]) * w.quantization.scale.astype(np.float32)
    return editor.add_tensor(name, (k,), np.int32, scale=scale, zero_point=0,
                             data=np.zeros(k, np.int32))


def fc_matrix(editor, op) -> tuple[int, int, int] | None:
    """(m, n, k) if ``op`` is a FULLY_CONNECTED the rewrite takes, else None."""
    if len(op.inputs) < 2 or min(op.inputs[:2]) < 0 or len(op.outputs) != 1:
        return None
    if op.options.get("weights_format", 0) != 0:
        return None
    x, w, y = (editor.tensor(t) for t in (op.inputs[0], op.inputs[1], op.outputs[0]))
    if not (is_eight_bit(x) and is_eight_bit(y) and is_eight_bit(w)) or x.type != y.type:
        return None
    data = editor.const(op.inputs[1])
    if data is None or data.ndim != 2:
        return None
    if w.type_name == "INT8" and np.any(w.quantization.zero_point != 0):
        return None
    if w.quantization.scale.size not in (1, data.shape[0]) or \
            (w.quantization.scale.size > 1 and w.quantization.quantized_dimension != 0):
        return None
    k, n = data.shape
    size = int(np.prod(x.shape, dtype=np.int64))
    if n == 0 or size % n or (x.shape and x.shape[-1] != n):
        return None
    m = size // n
    if m <= 1 or sum(d != 1 for d in y.shape) <= 1:
        return None
    if int(np.prod(y.shape, dtype=np.int64)) != m * k:
        return None
    return m, n, k


class FcAsConv:
    name = "fc_as_conv"
    version = 1
    exact = True
    order = 200
    description = ("FULLY_CONNECTED over a matrix -> RESHAPE, 1x1 CONV_2D, RESHAPE "
                   "(the Edge TPU maps FULLY_CONNECTED only with a vector output)")

    def apply(self, editor) -> list[RewriteRecord]:
        records = []
        for i, op in list(editor.each("FULLY_CONNECTED")):
            dims = fc_matrix(editor, op)
            if dims is None:
                continue
            m, n, k = dims
            x, w, y = op.inputs[0], op.inputs[1], op.outputs[0]
            base = editor.tensor(y).name
            bias = bias_or_zero(editor, op, k, base + "/bias")
            if bias is None:
                continue
            wt = editor.tensor(w)
            filt = editor.add_tensor(wt.name + "/1x1", (k, 1, 1, n), wt.dtype,
                                     data=editor.const(w).reshape(k, 1, 1, n),
                                     **quant_kwargs(wt.quantization))
            xt = editor.tensor(x)
            x4 = editor.add_tensor(base + "/rows", (1, 1, m, n), xt.dtype,
                                   **quant_kwargs(xt.quantization))
            y4 = editor.like(y, base + "/conv", (1, 1, m, k))
            int8 = xt.type_name == "INT8"
            conv = editor.make_op(
                "CONV_2D", [x4, filt, bias], [y4], version=3 if int8 else 1, padding="VALID",
                stride_w=1, stride_h=1, dilation_w_factor=1, dilation_h_factor=1,
                fused_activation_function=op.options.get("fused_activation_function", 0))
            new = [reshape_op(editor, x, x4), conv, reshape_op(editor, y4, y)]
            editor.replace([i], new)
            records.append(RewriteRecord(
                self.name, (editor.label(i),), tuple(o.name for o in new),
                f"{m}x{n} input times {n}x{k} weights as {k} 1x1 filters over {n} channels"))
        return records


FC_AS_CONV = FcAsConv()
