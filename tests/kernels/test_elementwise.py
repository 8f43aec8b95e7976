"""ADD, SUB, MUL, MAXIMUM, MINIMUM, SQUARED_DIFFERENCE and PRELU against
LiteRT's reference kernels, on uint8 and int8 with broadcasting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coralrt.errors import ModelError
from coralrt.testing import ModelBuilder

from .harness import check, quant_strategy, random_data, run_sim

DTYPES = (np.uint8, np.int8)
ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6")


_data = random_data


def _binary_model(op, shapes, dtype, quants, **options):
    (s1, s2), (q1, q2, qo) = shapes, quants
    b = ModelBuilder()
    x = b.input("x", s1, dtype, scale=q1[0], zero_point=q1[1])
    y = b.input("y", s2, dtype, scale=q2[0], zero_point=q2[1])
    z = b.tensor("z", np.broadcast_shapes(s1, s2), dtype, scale=qo[0], zero_point=qo[1])
    b.op(op, [x, y], [z], version=2, **options)
    b.output(z)
    return b.build()


def _check_binary(op, shapes, dtype, quants, seed, **options):
    rng = np.random.default_rng(seed)
    model = _binary_model(op, shapes, dtype, quants, **options)
    check(model, [_data(rng, shapes[0], dtype), _data(rng, shapes[1], dtype)])


@st.composite
def broadcast_pairs(draw):
    """Two shapes that broadcast together: each drops leading dims and sets some to 1."""
    rank = draw(st.integers(1, 4))
    full = draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank))

    def side():
        ones = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
        shape = tuple(1 if one else d for one, d in zip(ones, full))
        return shape[draw(st.integers(0, rank - 1)):]

    if draw(st.booleans()):                       # same shapes: the non-broadcast path
        return tuple(full), tuple(full)
    return side(), side()


quant = quant_strategy()


@st.composite
def binary_cases(draw, dtypes=DTYPES):
    dtype = draw(st.sampled_from(dtypes))
    quants = tuple(draw(quant(dtype)) for _ in range(3))
    return draw(broadcast_pairs()), dtype, quants


seeds = st.integers(0, 2**32 - 1)


@settings(max_examples=300, deadline=None)
@given(op=st.sampled_from(["ADD", "SUB"]), case=binary_cases(),
       act=st.sampled_from(ACTIVATIONS), same_scale=st.booleans(), seed=seeds)
def test_add_sub(op, case, act, same_scale, seed):
    shapes, dtype, (q1, q2, qo) = case
    if same_scale:                     # equal input scales: both input multipliers are 1/2
        q2 = (q1[0], q2[1])
    _check_binary(op, shapes, dtype, (q1, q2, qo), seed, fused_activation_function=act)


@settings(max_examples=250, deadline=None)
@given(case=binary_cases(), act=st.sampled_from(ACTIVATIONS), seed=seeds)
def test_mul(case, act, seed):
    shapes, dtype, quants = case
    _check_binary("MUL", shapes, dtype, quants, seed, fused_activation_function=act)


@settings(max_examples=120, deadline=None)
@given(op=st.sampled_from(["MAXIMUM", "MINIMUM"]), case=binary_cases(), seed=seeds)
def test_maximum_minimum(op, case, seed):
    shapes, dtype, quants = case
    _check_binary(op, shapes, dtype, quants, seed)


@settings(max_examples=200, deadline=None)
@given(case=binary_cases(dtypes=(np.int8,)), seed=seeds)
def test_squared_difference(case, seed):
    shapes, dtype, quants = case
    _check_binary("SQUARED_DIFFERENCE", shapes, dtype, quants, seed)


def test_squared_difference_uint8_is_refused():
    # LiteRT fails at invoke for uint8; the simulator refuses at load.
    q = (0.05, 128)
    model = _binary_model("SQUARED_DIFFERENCE", ((2, 3), (2, 3)), np.uint8, (q, q, q))
    with pytest.raises(ModelError, match="int8"):
        run_sim(model.to_bytes(), [np.zeros((2, 3), np.uint8)] * 2)


@st.composite
def prelu_cases(draw):
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    ones = draw(st.lists(st.booleans(), min_size=rank, max_size=rank))
    alpha = tuple(1 if one else d for one, d in zip(ones, shape))
    alpha = alpha[draw(st.integers(0, rank - 1)):]
    dtype = draw(st.sampled_from(DTYPES))
    quants = tuple(draw(quant(dtype)) for _ in range(3))
    return shape, alpha, dtype, quants


@settings(max_examples=250, deadline=None)
@given(case=prelu_cases(), seed=seeds)
def test_prelu(case, seed):
    shape, alpha_shape, dtype, (qi, qa, qo) = case
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input("x", shape, dtype, scale=qi[0], zero_point=qi[1])
    a = b.constant("alpha", _data(rng, alpha_shape, dtype), scale=qa[0], zero_point=qa[1])
    z = b.tensor("z", shape, dtype, scale=qo[0], zero_point=qo[1])
    b.op("PRELU", [x, a], [z])
    b.output(z)
    check(b.build(), [_data(rng, shape, dtype)])


# -- fixed regression cases -----------------------------------------------------------------

def _all_pairs(dtype):
    """Every (a, b) code pair once: a (256, 1) and a (1, 256) tensor."""
    c = np.arange(256, dtype=np.uint8).view(dtype)
    return (256, 1), (1, 256), c.reshape(256, 1), c.reshape(1, 256)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,act", [("ADD", "RELU6"), ("SUB", "NONE"), ("MUL", "RELU"),
                                    ("MUL", "RELU_N1_TO_1")])
def test_every_code_pair(op, act, dtype):
    s1, s2, a, b = _all_pairs(dtype)
    zp = 128 if dtype == np.uint8 else 0
    quants = ((0.0235, zp - 17), (0.0117, zp + 40), (0.0421, zp + 3))
    model = _binary_model(op, (s1, s2), dtype, quants, fused_activation_function=act)
    check(model, [a, b])


def test_every_code_pair_squared_difference():
    s1, s2, a, b = _all_pairs(np.int8)
    model = _binary_model("SQUARED_DIFFERENCE", (s1, s2), np.int8,
                          ((0.02, -3), (0.05, 11), (0.9, -128)))
    check(model, [a, b])


def test_mobilenet_style_residual_add():
    # Two branches of a residual block on one scale, a wider output scale.
    rng = np.random.default_rng(7)
    q = ((0.1427, 133), (0.1427, 133), (0.2119, 129))
    shapes = ((1, 14, 14, 96), (1, 14, 14, 96))
    model = _binary_model("ADD", shapes, np.uint8, q)
    check(model, [_data(rng, shapes[0], np.uint8), _data(rng, shapes[1], np.uint8)])
