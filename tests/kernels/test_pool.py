"""AVERAGE_POOL_2D and MAX_POOL_2D against LiteRT's reference kernels, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coralrt.testing import ModelBuilder
from coralrt._ops.arith.common import compute_out_size

from .harness import check, random_data

DTYPES = (np.uint8, np.int8)
ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6")
OPS = ("AVERAGE_POOL_2D", "MAX_POOL_2D")


def _pool_model(op, shape, dtype, scale, zp, fh, fw, sh, sw, padding, act):
    n, h, w, c = shape
    pad = 0 if padding == "SAME" else 1
    out = (n, compute_out_size(pad, h, fh, sh), compute_out_size(pad, w, fw, sw), c)
    b = ModelBuilder()
    x = b.input("x", shape, dtype, scale=scale, zero_point=zp)
    # The pooling kernels need input and output quantization to be the same.
    y = b.tensor("y", out, dtype, scale=scale, zero_point=zp)
    b.op(op, [x], [y], padding=padding, stride_h=sh, stride_w=sw, filter_height=fh,
         filter_width=fw, fused_activation_function=act)
    b.output(y)
    return b.build()


_data = random_data


@st.composite
def pools(draw):
    dtype = draw(st.sampled_from(DTYPES))
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 5))
    h, w = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    if draw(st.integers(0, 5)) == 0:
        fh, fw, sh, sw = h, w, 1, 1              # global pooling
    else:
        fh, fw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
        sh, sw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    if padding == "VALID":
        fh, fw = min(fh, h), min(fw, w)
    info = np.iinfo(dtype)
    return dict(shape=(n, h, w, c), dtype=dtype, fh=fh, fw=fw, sh=sh, sw=sw, padding=padding,
                act=draw(st.sampled_from(ACTIVATIONS)), scale=draw(st.floats(0.002, 0.1)),
                zp=draw(st.integers(int(info.min), int(info.max))),
                seed=draw(st.integers(0, 2**32 - 1)))


@pytest.mark.parametrize("op", OPS)
@settings(max_examples=300, deadline=None)
@given(case=pools())
def test_pool(op, case):
    rng = np.random.default_rng(case["seed"])
    model = _pool_model(op, case["shape"], case["dtype"], case["scale"], case["zp"],
                        case["fh"], case["fw"], case["sh"], case["sw"], case["padding"],
                        case["act"])
    check(model, [_data(rng, case["shape"], case["dtype"])])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,f,s,padding", [
    ((1, 7, 7, 1280), 7, 1, "VALID"),        # MobileNet global average pool
    ((1, 112, 112, 8), 3, 2, "SAME"),       # ResNet-style stem max pool
    ((2, 9, 9, 3), 4, 3, "SAME"),           # windows clipped on both sides
])
def test_pool_fixed(op, dtype, shape, f, s, padding):
    rng = np.random.default_rng(sum(shape))
    zp = 128 if dtype == np.uint8 else -5
    model = _pool_model(op, shape, dtype, 0.02, zp, f, f, s, s, padding, "NONE")
    check(model, [_data(rng, shape, dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_average_pool_rounding(dtype):
    """Sums that end in exact halves: TFLite rounds them away from zero (int8 too)."""
    info = np.iinfo(dtype)
    # 2x1 windows of (v, v + 1) average to v + 0.5.
    v = np.arange(int(info.min), int(info.max), 2)
    pairs = np.stack([v, v + 1], axis=0).astype(dtype)        # (2, k)
    x = pairs.reshape(1, 2, -1, 1)
    model = _pool_model("AVERAGE_POOL_2D", x.shape, dtype, 0.05, 0, 2, 1, 2, 1, "VALID",
                        "NONE")
    check(model, [x])
