"""RELU family, LOGISTIC, TANH, HARD_SWISH, QUANTIZE, RSQRT, SOFTMAX and
L2_NORMALIZATION against LiteRT's reference kernels (uint8 and int8).

The unary operators are fed tensors that hold every one of the 256 input
codes, so each example checks the whole mapping.  LOGISTIC and TANH are
float lookup tables in TFLite; the simulator builds them with the same C
library functions, so they are compared bit for bit too.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coralrt.errors import InferenceError
from coralrt.testing import ModelBuilder

from .harness import check, quant_strategy, random_data, run_sim

DTYPES = (np.uint8, np.int8)
seeds = st.integers(0, 2**32 - 1)


_data = random_data


def _every_code(rng, dtype, shape=(2, 4, 32)):
    """All 256 codes of ``dtype`` in a random order, shaped ``shape``."""
    return rng.permutation(np.arange(256, dtype=np.uint8)).view(dtype).reshape(shape)


def _unary_model(op, shape, dtype, qi, qo, out_dtype=None, out_shape=None, **options):
    b = ModelBuilder()
    x = b.input("x", shape, dtype, scale=qi[0], zero_point=qi[1])
    z = b.tensor("z", out_shape or shape, out_dtype or dtype, scale=qo[0], zero_point=qo[1])
    b.op(op, [x], [z], **options)
    b.output(z)
    return b.build()


quant = quant_strategy()


@st.composite
def shapes(draw, max_rank=4, max_dim=9):
    rank = draw(st.integers(1, max_rank))
    return tuple(draw(st.lists(st.integers(1, max_dim), min_size=rank, max_size=rank)))


# -- LUT-style unary operators --------------------------------------------------------------

@settings(max_examples=250, deadline=None)
@given(op=st.sampled_from(["RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1"]),
       dtype=st.sampled_from(DTYPES), data=st.data(), seed=seeds)
def test_relu_family(op, dtype, data, seed):
    qi, qo = data.draw(quant(dtype)), data.draw(quant(dtype))
    if data.draw(st.booleans()):               # same quantization, the common case
        qo = qi
    model = _unary_model(op, (2, 4, 32), dtype, qi, qo)
    check(model, [_every_code(np.random.default_rng(seed), dtype)])


def _fixed_output(op, dtype):
    if op == "LOGISTIC":
        return (1.0 / 256, 0 if dtype == np.uint8 else -128)
    return (1.0 / 128, 128 if dtype == np.uint8 else 0)


@settings(max_examples=200, deadline=None)
@given(op=st.sampled_from(["LOGISTIC", "TANH"]), dtype=st.sampled_from(DTYPES),
       data=st.data(), seed=seeds)
def test_logistic_tanh(op, dtype, data, seed):
    qi = data.draw(quant(dtype, -3.0, 0.5))
    model = _unary_model(op, (2, 4, 32), dtype, qi, _fixed_output(op, dtype))
    check(model, [_every_code(np.random.default_rng(seed), dtype)])


@settings(max_examples=250, deadline=None)
@given(dtype=st.sampled_from(DTYPES), data=st.data(), seed=seeds)
def test_hard_swish(dtype, data, seed):
    qi = data.draw(quant(dtype, -3.5, 0.5))
    # Output scales from just above input/128 (LiteRT rejects smaller) up to
    # far larger than the input scale, where the int16 rounding shift exceeds 15.
    ratio = 10.0 ** data.draw(st.floats(-2.0, 3.0))
    qo = (qi[0] * ratio, data.draw(quant(dtype))[1])
    assume(qo[0] > qi[0] / 128 * 1.0001)
    model = _unary_model("HARD_SWISH", (2, 4, 32), dtype, qi, qo)
    check(model, [_every_code(np.random.default_rng(seed), dtype)])


@settings(max_examples=250, deadline=None)
@given(din=st.sampled_from(DTYPES), dout=st.sampled_from(DTYPES), data=st.data(), seed=seeds)
def test_quantize_requantize(din, dout, data, seed):
    qi, qo = data.draw(quant(din)), data.draw(quant(dout))
    if data.draw(st.booleans()):          # uint8 <-> int8 with the same real values
        qo = (qi[0], qi[1] + (int(np.iinfo(dout).min) - int(np.iinfo(din).min)))
    model = _unary_model("QUANTIZE", (2, 4, 32), din, qi, qo, out_dtype=dout)
    check(model, [_every_code(np.random.default_rng(seed), din)])


@settings(max_examples=200, deadline=None)
@given(qi=quant(np.int8), qo=quant(np.int8, -3.0, 1.0), seed=seeds)
def test_rsqrt(qi, qo, seed):
    # Only inputs at or above the zero point are valid (LiteRT fails on the others).
    zp = qi[1]
    codes = np.arange(zp, 128, dtype=np.int64)
    rng = np.random.default_rng(seed)
    x = rng.permutation(np.resize(codes, 256)).astype(np.int8).reshape(2, 4, 32)
    model = _unary_model("RSQRT", (2, 4, 32), np.int8, qi, qo)
    check(model, [x])


def test_rsqrt_below_zero_point_fails():
    model = _unary_model("RSQRT", (4,), np.int8, (0.05, 10), (0.1, 0))
    with pytest.raises(InferenceError, match="zero point"):
        run_sim(model.to_bytes(), [np.array([10, 20, 9, 30], np.int8)])


# -- row-wise operators ---------------------------------------------------------------------

@settings(max_examples=250, deadline=None)
@given(shape=shapes(), dtype=st.sampled_from(DTYPES), out16=st.booleans(),
       beta=st.sampled_from([1.0, 0.5, 2.0, 0.123]), data=st.data(), seed=seeds)
def test_softmax(shape, dtype, out16, beta, data, seed):
    qi = data.draw(quant(dtype, -3.0, 0.5))
    if out16:                                  # 8-bit in, int16 out
        out_dtype, qo = np.int16, (1.0 / 32768, 0)
    else:
        out_dtype, qo = dtype, (1.0 / 256, 0 if dtype == np.uint8 else -128)
    model = _unary_model("SOFTMAX", shape, dtype, qi, qo, out_dtype=out_dtype, beta=beta)
    rng = np.random.default_rng(seed)
    x = _data(rng, shape, dtype)
    if data.draw(st.booleans()):               # narrow rows: many equal maxima
        x = np.clip(x, *np.sort(_data(rng, 2, dtype))).astype(dtype)
    check(model, [x])


@settings(max_examples=250, deadline=None)
@given(shape=shapes(max_dim=12), dtype=st.sampled_from(DTYPES), data=st.data(), seed=seeds)
def test_l2_normalization(shape, dtype, data, seed):
    qi = data.draw(quant(dtype))
    qo = (1.0 / 128, 128 if dtype == np.uint8 else 0)
    rng = np.random.default_rng(seed)
    x = _data(rng, shape, dtype)
    spread = data.draw(st.sampled_from([0, 1, 3, 300]))   # 0: rows equal to the zero point
    info = np.iinfo(dtype)
    x = np.clip(qi[1] + (x.astype(np.int64) % (spread + 1)) - spread // 2, info.min, info.max)
    model = _unary_model("L2_NORMALIZATION", shape, dtype, qi, qo)
    check(model, [x.astype(dtype)])


# -- fixed regression cases -----------------------------------------------------------------

def test_classifier_softmax_uint8():
    # A 1001-class head (MobileNet v1 style quantization).
    rng = np.random.default_rng(3)
    model = _unary_model("SOFTMAX", (1, 1001), np.uint8, (0.0988, 58), (1.0 / 256, 0),
                         beta=1.0)
    check(model, [_data(rng, (1, 1001), np.uint8)])


def test_l2_normalization_large_depth_int8():
    rng = np.random.default_rng(5)
    x = _data(rng, (3, 2000), np.int8)
    x[1] = -3                                          # a row equal to the zero point
    model = _unary_model("L2_NORMALIZATION", (3, 2000), np.int8, (0.05, -3), (1.0 / 128, 0))
    check(model, [x])


@pytest.mark.parametrize("dtype", DTYPES)
def test_hard_swish_mobilenet_v3_scales(dtype):
    rng = np.random.default_rng(11)
    zp = 128 if dtype == np.uint8 else 0
    model = _unary_model("HARD_SWISH", (2, 4, 32), dtype, (0.1173, zp - 5), (0.0621, zp - 100))
    check(model, [_every_code(rng, dtype)])
