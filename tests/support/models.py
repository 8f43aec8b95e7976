"""Small models built in code that several test files share."""

from __future__ import annotations

import numpy as np

from coralrt.testing import ModelBuilder


def conv_chain(segments: int = 2, hw: int = 64, c: int = 32, seed: int = 0):
    """1x1 convolutions (Edge TPU) separated by DEQUANTIZE + QUANTIZE (CPU): one
    Edge TPU segment per convolution in multi mode."""
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input("x", (1, hw, hw, c), np.uint8, scale=0.02, zero_point=128)
    for j in range(segments):
        if j:
            f = b.tensor(f"f{j}", (1, hw, hw, c), np.float32)
            b.op("DEQUANTIZE", [x], [f])
            x = b.tensor(f"q{j}", (1, hw, hw, c), np.uint8, scale=0.05, zero_point=128)
            b.op("QUANTIZE", [f], [x])
        w = b.constant(f"w{j}", rng.integers(0, 256, (c, 1, 1, c), dtype=np.uint8),
                       scale=0.002, zero_point=128)
        bias = b.constant(f"b{j}", rng.integers(-500, 500, c).astype(np.int32),
                          scale=0.00004, zero_point=0)
        y = b.tensor(f"y{j}", (1, hw, hw, c), np.uint8, scale=0.05, zero_point=128)
        b.op("CONV_2D", [x, w, bias], [y], stride_w=1, stride_h=1, padding="SAME")
        x = y
    b.output(x)
    return b.build()


def conv_relu(channels: int = 4, seed: int | None = None, name: str | None = None):
    """An int8 3x3 CONV_2D (6x6x3 -> 6x6xchannels) and a RELU of it, both outputs: the
    small model the USB tests send to simulated sticks as a native segment.  ``seed``
    (default ``channels``) picks the weights."""
    rng = np.random.default_rng(channels if seed is None else seed)
    b = ModelBuilder() if name is None else ModelBuilder(name=name)
    x = b.input("x", (1, 6, 6, 3), np.int8, scale=0.05, zero_point=3)
    w = b.constant("w", rng.integers(-127, 128, (channels, 3, 3, 3), dtype=np.int8),
                   scale=0.02, zero_point=0)
    bias = b.constant("b", rng.integers(-500, 500, channels, dtype=np.int32), scale=0.001,
                      zero_point=0)
    y = b.tensor("y", (1, 6, 6, channels), np.int8, scale=0.1, zero_point=-2)
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1)
    z = b.tensor("z", (1, 6, 6, channels), np.int8, scale=0.1, zero_point=-2)
    b.op("RELU", [y], [z])
    b.output(y, z)
    return b.build()


def image_times_zero(b: ModelBuilder, size=(16, 12)):
    """Add a float image input [1, h, w, 3] to ``b`` and return a [1, 1, 1, 1] tensor
    that is 0 * mean(image): adding it to a constant makes an output that depends on
    the input without changing the constant."""
    w, h = size
    x = b.input("image", (1, h, w, 3), np.float32)
    m = b.tensor("mean", (1, 1, 1, 1), np.float32)
    b.op("MEAN", [x, b.constant("axes", np.array([1, 2, 3], np.int32))], [m], keep_dims=True)
    z = b.tensor("z", (1, 1, 1, 1), np.float32)
    b.op("MUL", [m, b.constant("zero", np.zeros((1,), np.float32))], [z])
    return z
