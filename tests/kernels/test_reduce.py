"""MEAN, SUM, REDUCE_MAX and REDUCE_MIN against LiteRT's reference kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coralrt.errors import ModelError
from coralrt.testing import ModelBuilder

from .harness import check, random_data, run_sim

DTYPES = (np.uint8, np.int8)


def _out_shape(shape, axes, keep):
    resolved = {a % len(shape) for a in axes}
    if keep:
        return tuple(1 if d in resolved else s for d, s in enumerate(shape))
    return tuple(s for d, s in enumerate(shape) if d not in resolved)


def _reduce_model(op, shape, axes, keep, dtype, in_q, out_q):
    b = ModelBuilder()
    x = b.input("x", shape, dtype, scale=in_q[0], zero_point=in_q[1])
    a = b.constant("axes", np.array(axes, np.int32))
    y = b.tensor("y", _out_shape(shape, axes, keep), dtype, scale=out_q[0],
                 zero_point=out_q[1])
    b.op(op, [x, a], [y], keep_dims=keep)
    b.output(y)
    return b.build()


_data = random_data


@st.composite
def reductions(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 7), min_size=rank, max_size=rank)))
    n = draw(st.integers(1, rank))
    axes = draw(st.lists(st.integers(-rank, rank - 1), min_size=n, max_size=n))
    keep = draw(st.booleans())
    dtype = draw(st.sampled_from(DTYPES))
    info = np.iinfo(dtype)
    zp = draw(st.integers(int(info.min), int(info.max)))
    return shape, axes, keep, dtype, zp


scales = st.floats(1e-3, 1.0)


@settings(max_examples=400, deadline=None)
@given(case=reductions(), in_scale=scales, ratio=st.sampled_from([1.0, None]),
       out_scale=scales, out_zp=st.integers(-128, 255), seed=st.integers(0, 2**32 - 1))
def test_mean(case, in_scale, ratio, out_scale, out_zp, seed):
    shape, axes, keep, dtype, zp = case
    info = np.iinfo(dtype)
    if ratio == 1.0:                   # equal quantization is a path of its own in TFLite
        out_scale, out_zp = in_scale, zp
    out_zp = int(np.clip(out_zp, info.min, info.max))
    model = _reduce_model("MEAN", shape, axes, keep, dtype, (in_scale, zp), (out_scale, out_zp))
    check(model, [_data(np.random.default_rng(seed), shape, dtype)])


@settings(max_examples=300, deadline=None)
@given(case=reductions(), in_scale=scales, log_ratio=st.floats(-1.0, 3.0),
       out_zp=st.integers(-128, 255), seed=st.integers(0, 2**32 - 1), same=st.booleans())
def test_sum(case, in_scale, log_ratio, out_zp, seed, same):
    shape, axes, keep, dtype, zp = case
    info = np.iinfo(dtype)
    out_scale = in_scale * 10.0 ** log_ratio
    out_zp = int(np.clip(out_zp, info.min, info.max))
    if same:
        out_scale, out_zp = in_scale, zp
    model = _reduce_model("SUM", shape, axes, keep, dtype, (in_scale, zp), (out_scale, out_zp))
    check(model, [_data(np.random.default_rng(seed), shape, dtype)])


@settings(max_examples=200, deadline=None)
@given(case=reductions(), op=st.sampled_from(["REDUCE_MAX", "REDUCE_MIN"]), scale=scales,
       seed=st.integers(0, 2**32 - 1))
def test_max_min(case, op, scale, seed):
    shape, axes, keep, dtype, zp = case
    model = _reduce_model(op, shape, axes, keep, dtype, (scale, zp), (scale, zp))
    check(model, [_data(np.random.default_rng(seed), shape, dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axes", [[1, 2], [2, 1], [-3, -2], [1, 2, 1]])
@pytest.mark.parametrize("quant", [(0.02, 5, 0.02, 5), (0.02, 5, 0.013, -3),
                                   (0.5, 0, 0.001, 0), (0.001, -100, 0.5, 90)])
def test_mean_spatial_4d(dtype, axes, quant):
    # The global-average-pool shape that has dedicated kernels in TFLite's
    # optimized resolver; the reference resolver uses its generic path.
    rng = np.random.default_rng(len(axes))
    shape = (2, 9, 13, 7)
    shift = 128 if dtype == np.uint8 else 0     # zero points given in int8 terms
    s_in, z_in, s_out, z_out = quant
    model = _reduce_model("MEAN", shape, axes, True, dtype, (s_in, z_in + shift),
                          (s_out, z_out + shift))
    check(model, [_data(rng, shape, dtype)])


@pytest.mark.parametrize("op", ["MEAN", "SUM"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scales_", [(0.01, 0.02), (0.3, 0.001), (1e-7, 1.0)])
def test_large_reductions(op, dtype, scales_):
    # Many elements: large shifts for MEAN (the last case hits the clamp of
    # the count's shift by the multiplier's), saturation for SUM.
    rng = np.random.default_rng(3)
    shape = (1, 64, 64, 3)
    out_zp = 4 if dtype == np.uint8 else -4
    model = _reduce_model(op, shape, [0, 1, 2], False, dtype, (scales_[0], 10),
                          (scales_[1], out_zp))
    check(model, [_data(rng, shape, dtype)])


def test_mean_rounds_instead_of_truncating():
    # (1+2+3+4+6+7)/6 = 3.83: TFLite's reference rounds to 4 even with equal
    # input and output quantization.
    x = np.array([1, 2, 3, 4, 6, 7], np.uint8).reshape(1, 1, 6, 1)
    model = _reduce_model("MEAN", x.shape, [2], True, np.uint8, (0.1, 0), (0.1, 0))
    assert check(model, [x])[0].item() == 4


def test_sum_saturates_with_equal_quantization():
    x = np.array([[200, 100]], np.uint8)
    model = _reduce_model("SUM", x.shape, [1], True, np.uint8, (0.1, 0), (0.1, 0))
    assert check(model, [x])[0].item() == 255


@pytest.mark.parametrize("op", ["REDUCE_MAX", "REDUCE_MIN"])
def test_max_min_reject_requantization(op):
    model = _reduce_model(op, (2, 3), [1], False, np.int8, (0.1, 0), (0.2, 0))
    with pytest.raises(ModelError, match="equal input and output quantization"):
        run_sim(model.to_bytes(), [np.zeros((2, 3), np.int8)])
