"""Small models built in code that several test files share."""

from __future__ import annotations

import numpy as np

from coralrt.model.builder import ModelBuilder


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
