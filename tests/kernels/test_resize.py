"""RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR against LiteRT's reference kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coralrt.errors import ModelError
from coralrt.testing import ModelBuilder

from .harness import check, random_data, run_sim

DTYPES = (np.uint8, np.int8)


def _resize_model(op, in_shape, out_hw, dtype, *, align=False, half=False,
                  in_q=(0.05, 3), out_q=(0.05, 3)):
    b = ModelBuilder()
    x = b.input("x", in_shape, dtype, scale=in_q[0], zero_point=in_q[1])
    size = b.constant("size", np.array(out_hw, np.int32))
    y = b.tensor("y", (in_shape[0], *out_hw, in_shape[3]), dtype, scale=out_q[0],
                 zero_point=out_q[1])
    b.op(op, [x, size], [y], version=3 if half else 1, align_corners=align,
         half_pixel_centers=half)
    b.output(y)
    return b.build()


_data = random_data


modes = st.sampled_from([(False, False), (True, False), (False, True)])
spatial = st.integers(1, 9)


@settings(max_examples=300, deadline=None)
@given(dtype=st.sampled_from(DTYPES), batch=st.integers(1, 2), ih=spatial, iw=spatial,
       oh=st.integers(1, 17), ow=st.integers(1, 17), c=st.integers(1, 5), mode=modes,
       seed=st.integers(0, 2**32 - 1))
def test_bilinear(dtype, batch, ih, iw, oh, ow, c, mode, seed):
    align, half = mode
    rng = np.random.default_rng(seed)
    model = _resize_model("RESIZE_BILINEAR", (batch, ih, iw, c), (oh, ow), dtype,
                          align=align, half=half)
    check(model, [_data(rng, (batch, ih, iw, c), dtype)])


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from(DTYPES), batch=st.integers(1, 2), ih=spatial, iw=spatial,
       oh=st.integers(1, 17), ow=st.integers(1, 17), c=st.integers(1, 5),
       mode=st.sampled_from([(False, False), (True, False), (False, True), (True, True)]),
       seed=st.integers(0, 2**32 - 1))
def test_nearest_neighbor(dtype, batch, ih, iw, oh, ow, c, mode, seed):
    align, half = mode
    rng = np.random.default_rng(seed)
    model = _resize_model("RESIZE_NEAREST_NEIGHBOR", (batch, ih, iw, c), (oh, ow), dtype,
                          align=align, half=half)
    check(model, [_data(rng, (batch, ih, iw, c), dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("hw", [((7, 5), (33, 19)), ((33, 20), (7, 6)), ((1, 1), (3, 4)),
                                ((10, 10), (20, 20)), ((3, 4), (1, 1))])
def test_bilinear_fixed(dtype, mode, hw):
    (ih, iw), (oh, ow) = hw
    align, half = mode
    rng = np.random.default_rng(ih * 1000 + oh)
    model = _resize_model("RESIZE_BILINEAR", (1, ih, iw, 3), (oh, ow), dtype,
                          align=align, half=half)
    check(model, [_data(rng, (1, ih, iw, 3), dtype)])


def test_bilinear_extremes_uint8():
    # Constant 255 planes must come back as 255 through float blending.
    x = np.full((1, 5, 7, 2), 255, np.uint8)
    x[..., 1] = 0
    for align, half in ((False, False), (True, False), (False, True)):
        model = _resize_model("RESIZE_BILINEAR", x.shape, (13, 3), np.uint8,
                              align=align, half=half)
        check(model, [x])


@pytest.mark.parametrize("op", ["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantization_is_not_applied(op, dtype):
    # LiteRT copies/blends stored integers even when the output's quantization
    # differs from the input's.
    rng = np.random.default_rng(7)
    model = _resize_model(op, (1, 4, 6, 3), (9, 5), dtype, in_q=(0.1, 0), out_q=(0.02, 7))
    check(model, [_data(rng, (1, 4, 6, 3), dtype)])


def test_bilinear_rejects_align_with_half_pixel():
    model = _resize_model("RESIZE_BILINEAR", (1, 4, 4, 1), (8, 8), np.uint8,
                          align=True, half=True)
    with pytest.raises(ModelError, match="half_pixel_centers"):
        run_sim(model.to_bytes(), [np.zeros((1, 4, 4, 1), np.uint8)])
