"""Data-movement kernels against LiteRT's reference kernels.

CONCATENATION, RESHAPE, SQUEEZE, EXPAND_DIMS, PACK, SPLIT, SLICE,
STRIDED_SLICE, PAD, SPACE_TO_DEPTH, TRANSPOSE and TILE on uint8 and int8 tensors.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from coralrt.errors import ModelError
from coralrt.testing import ModelBuilder

from .harness import check, random_data, run_reference, run_sim

DTYPES = (np.uint8, np.int8)
Q = (0.05, 3)                       # default quantization (scale, zero point)

dtypes = st.sampled_from(DTYPES)
seeds = st.integers(0, 2**32 - 1)


_data = random_data


@st.composite
def shapes(draw, min_rank=1, max_rank=4, max_side=6):
    rank = draw(st.integers(min_rank, max_rank))
    return tuple(draw(st.lists(st.integers(1, max_side), min_size=rank, max_size=rank)))


def _single(op, x_shape, out_shape, dtype, consts=(), *, in_q=Q, out_q=Q, version=1,
            **options):
    """A model with one data input, constant extra inputs and one output."""
    b = ModelBuilder()
    x = b.input("x", x_shape, dtype, scale=in_q[0], zero_point=in_q[1])
    ins = [x] + [b.constant(f"c{k}", c) for k, c in enumerate(consts)]
    y = b.tensor("y", out_shape, dtype, scale=out_q[0], zero_point=out_q[1])
    b.op(op, ins, [y], version=version, **options)
    b.output(y)
    return b.build()


def _zero_point(dtype, z8: int) -> int:
    """A zero point given in int8 terms, for ``dtype``."""
    return z8 + 128 if dtype == np.uint8 else z8


# -- CONCATENATION ------------------------------------------------------------------


def _concat_model(shapes_, axis, dtype, quants, out_q):
    b = ModelBuilder()
    xs = [b.input(f"x{k}", s, dtype, scale=q[0], zero_point=q[1])
          for k, (s, q) in enumerate(zip(shapes_, quants))]
    rank = len(shapes_[0])
    a = axis % rank
    out = list(shapes_[0])
    out[a] = sum(s[a] for s in shapes_)
    y = b.tensor("y", out, dtype, scale=out_q[0], zero_point=out_q[1])
    b.op("CONCATENATION", xs, [y], axis=axis)
    b.output(y)
    return b.build()


@settings(max_examples=200, deadline=None)
@given(dtype=dtypes, base=shapes(), n=st.integers(1, 4), data=st.data(), seed=seeds,
       requantize=st.booleans())
def test_concatenation(dtype, base, n, data, seed, requantize):
    rank = len(base)
    axis = data.draw(st.integers(-rank, rank - 1))
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=n, max_size=n))
    shapes_ = [tuple(s if d != axis % rank else k for d, s in enumerate(base)) for k in sizes]
    out_q = (0.05, _zero_point(dtype, 3))
    quants = [out_q] * n
    if requantize and dtype == np.uint8:
        # uint8 inputs with their own quantization are requantized in float.
        quants = [(data.draw(st.floats(0.001, 0.5)), data.draw(st.integers(0, 255)))
                  if data.draw(st.booleans()) else out_q for _ in range(n)]
        out_q = (data.draw(st.floats(0.001, 0.5)), data.draw(st.integers(0, 255)))
    rng = np.random.default_rng(seed)
    model = _concat_model(shapes_, axis, dtype, quants, out_q)
    check(model, [_data(rng, s, dtype) for s in shapes_])


def test_concatenation_requantize_fixed():
    rng = np.random.default_rng(1)
    shapes_ = [(2, 3, 4), (2, 5, 4), (2, 1, 4)]
    quants = [(0.1, 128), (0.0123, 7), (1.0, 255)]
    model = _concat_model(shapes_, -2, np.uint8, quants, (0.05, 100))
    check(model, [_data(rng, s, np.uint8) for s in shapes_])


def test_concatenation_requantize_rounding_ties():
    # 0.5 * q lands exactly on .5 for odd q: float rounding is half away from zero.
    x = np.arange(256, dtype=np.uint8).reshape(1, 256)
    model = _concat_model([(1, 256), (1, 256)], 0, np.uint8, [(0.5, 0), (0.5, 11)],
                          (1.0, 0))
    check(model, [x, x])


def test_concatenation_int8_requires_equal_quantization():
    model = _concat_model([(1, 2), (1, 2)], 1, np.int8, [(0.1, 0), (0.2, 0)], (0.1, 0))
    _assert_both_refuse(model, [np.zeros((1, 2), np.int8)] * 2)


# -- RESHAPE, SQUEEZE, EXPAND_DIMS ---------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(dtype=dtypes, shape=shapes(), data=st.data(), seed=seeds)
def test_reshape(dtype, shape, data, seed):
    flat = data.draw(st.permutations(list(shape)))
    # Regroup the same factors into a new shape, maybe with one -1.
    cut = sorted(data.draw(st.lists(st.integers(0, len(flat)), max_size=3)))
    groups = [flat[a:b] for a, b in zip([0, *cut], [*cut, len(flat)])]
    new = [int(np.prod(g)) for g in groups] or [1]
    spec = list(new)
    if data.draw(st.booleans()):
        spec[data.draw(st.integers(0, len(spec) - 1))] = -1
    from_option = data.draw(st.booleans())
    if from_option:
        model = _single("RESHAPE", shape, new, dtype, new_shape=spec)
    else:
        model = _single("RESHAPE", shape, new, dtype, [np.array(spec, np.int32)])
    check(model, [_data(np.random.default_rng(seed), shape, dtype)])


@settings(max_examples=80, deadline=None)
@given(dtype=dtypes, shape=shapes(max_side=3), data=st.data(), seed=seeds)
def test_squeeze(dtype, shape, data, seed):
    ones = [d for d, s in enumerate(shape) if s == 1]
    dims = data.draw(st.lists(st.sampled_from(ones), unique=True)) if ones else []
    rank = len(shape)
    dims = [d - rank if data.draw(st.booleans()) else d for d in dims]
    gone = {d % rank for d in dims} if dims else set(ones)
    out = [s for d, s in enumerate(shape) if d not in gone]
    model = _single("SQUEEZE", shape, out, dtype, squeeze_dims=dims)
    check(model, [_data(np.random.default_rng(seed), shape, dtype)])


@settings(max_examples=80, deadline=None)
@given(dtype=dtypes, shape=shapes(max_rank=3), data=st.data(), seed=seeds)
def test_expand_dims(dtype, shape, data, seed):
    rank = len(shape)
    axis = data.draw(st.integers(-rank - 1, rank))
    out = list(shape)
    out.insert(axis % (rank + 1), 1)
    model = _single("EXPAND_DIMS", shape, out, dtype, [np.array([axis], np.int32)])
    check(model, [_data(np.random.default_rng(seed), shape, dtype)])


# -- PACK, SPLIT ------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(dtype=dtypes, shape=shapes(max_rank=3), n=st.integers(1, 4), data=st.data(),
       seed=seeds)
def test_pack(dtype, shape, n, data, seed):
    rank = len(shape)
    axis = data.draw(st.integers(-rank - 1, rank))
    out = list(shape)
    out.insert(axis % (rank + 1), n)
    b = ModelBuilder()
    xs = [b.input(f"x{k}", shape, dtype, scale=Q[0], zero_point=Q[1]) for k in range(n)]
    y = b.tensor("y", out, dtype, scale=Q[0], zero_point=Q[1])
    b.op("PACK", xs, [y], values_count=n, axis=axis)
    b.output(y)
    rng = np.random.default_rng(seed)
    check(b.build(), [_data(rng, shape, dtype) for _ in range(n)])


@settings(max_examples=80, deadline=None)
@given(dtype=dtypes, shape=shapes(), data=st.data(), seed=seeds)
def test_split(dtype, shape, data, seed):
    rank = len(shape)
    axis = data.draw(st.integers(-rank, rank - 1))
    dim = shape[axis]
    n = data.draw(st.sampled_from([k for k in range(1, dim + 1) if dim % k == 0]))
    part = list(shape)
    part[axis] = dim // n
    b = ModelBuilder()
    a = b.constant("axis", np.array(axis, np.int32))
    x = b.input("x", shape, dtype, scale=Q[0], zero_point=Q[1])
    ys = [b.tensor(f"y{k}", part, dtype, scale=Q[0], zero_point=Q[1]) for k in range(n)]
    b.op("SPLIT", [a, x], ys, num_splits=n)
    b.output(*ys)
    check(b.build(), [_data(np.random.default_rng(seed), shape, dtype)])


# -- SLICE, STRIDED_SLICE -----------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(dtype=dtypes, shape=shapes(), data=st.data(), seed=seeds,
       index_type=st.sampled_from([np.int32, np.int64]))
def test_slice(dtype, shape, data, seed, index_type):
    begin, size, out = [], [], []
    for dim in shape:
        b0 = data.draw(st.integers(0, dim - 1))
        s = data.draw(st.integers(1, dim - b0)) if data.draw(st.booleans()) else -1
        begin.append(b0)
        size.append(s)
        out.append(dim - b0 if s == -1 else s)
    model = _single("SLICE", shape, out, dtype,
                    [np.array(begin, index_type), np.array(size, index_type)])
    check(model, [_data(np.random.default_rng(seed), shape, dtype)])


@st.composite
def strided_slices(draw):
    shape = draw(shapes(max_side=8))
    rank = len(shape)
    n = draw(st.integers(1, rank))           # begin/end/strides may cover fewer axes
    begin, end, strides = [], [], []
    begin_mask = end_mask = shrink = 0
    for d in range(n):
        dim = shape[d]
        stride = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
        if draw(st.integers(0, 5)) == 0:
            shrink |= 1 << d
            begin.append(draw(st.integers(-dim, dim - 1)))
            end.append(draw(st.integers(-dim - 2, dim + 2)))
            strides.append(draw(st.sampled_from([1, 2])))
            if draw(st.booleans()):       # shrinking wins over the end mask
                end_mask |= 1 << d
            continue
        begin.append(draw(st.integers(-dim - 2, dim + 2)))
        end.append(draw(st.integers(-dim - 2, dim + 2)))
        strides.append(stride)
        if draw(st.booleans()):
            begin_mask |= 1 << d
        if draw(st.booleans()):
            end_mask |= 1 << d
    return shape, begin, end, strides, begin_mask, end_mask, shrink


def _python_slice(shape, begin, end, strides, begin_mask, end_mask, shrink):
    """The same slice with Python's indexing rules (they agree with TFLite's)."""
    index = []
    for d in range(len(shape)):
        if d >= len(begin):
            index.append(slice(None))
        elif shrink & (1 << d):
            index.append(begin[d])
        else:
            index.append(slice(None if begin_mask & (1 << d) else begin[d],
                               None if end_mask & (1 << d) else end[d], strides[d]))
    return tuple(index)


@settings(max_examples=400, deadline=None)
@given(dtype=dtypes, case=strided_slices(), seed=seeds)
def test_strided_slice(dtype, case, seed):
    shape, begin, end, strides, begin_mask, end_mask, shrink = case
    x = _data(np.random.default_rng(seed), shape, dtype)
    want = x[_python_slice(*case)]
    assume(want.size > 0)                 # LiteRT and numpy agree on empty slices too,
    model = _single(                      # but an empty output tensor is of no use here
        "STRIDED_SLICE", shape, want.shape, dtype,
        [np.array(begin, np.int32), np.array(end, np.int32), np.array(strides, np.int32)],
        begin_mask=begin_mask, end_mask=end_mask, shrink_axis_mask=shrink)
    got = check(model, [x])
    np.testing.assert_array_equal(got[0], want)


@settings(max_examples=100, deadline=None)
@given(dtype=dtypes, shape=shapes(max_side=8), data=st.data(), seed=seeds)
def test_strided_slice_offset(dtype, shape, data, seed):
    # With ``offset`` the end input holds sizes relative to the begin.  Only
    # in-bounds sizes are generated: beyond them LiteRT's output shape and the
    # elements it copies disagree.
    begin, size, strides, index, out = [], [], [], [], []
    for dim in shape:
        b0 = data.draw(st.integers(-dim, dim - 1))
        start = b0 % dim
        n = data.draw(st.integers(1, dim - start))
        k = data.draw(st.integers(1, 3))
        begin.append(b0)
        size.append(n)
        strides.append(k)
        index.append(slice(start, start + n, k))
        out.append(-(-n // k))
    x = _data(np.random.default_rng(seed), shape, dtype)
    model = _single(
        "STRIDED_SLICE", shape, out, dtype,
        [np.array(begin, np.int32), np.array(size, np.int32), np.array(strides, np.int32)],
        offset=True, version=4)
    np.testing.assert_array_equal(check(model, [x])[0], x[tuple(index)])


def test_strided_slice_fixed():
    x = np.arange(4 * 7 * 5, dtype=np.int64).reshape(1, 4, 7, 5).astype(np.uint8)
    cases = [  # begin, end, strides, begin_mask, end_mask, shrink
        ([0, 1, -1, 0], [1, 4, -8, 5], [1, 2, -2, 2], 0, 0, 0),
        ([0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 3, 1], 0b1111, 0b1111, 0),
        ([0, 2, 0, 0], [1, 3, 7, 5], [1, 1, 1, 1], 0, 0b1100, 0b0011),
        ([0, -1, 6, -2], [1, -5, 0, 0], [1, -1, -3, -1], 0b0001, 0b1000, 0),
    ]
    for begin, end, strides, bm, em, sm in cases:
        case = (x.shape, begin, end, strides, bm, em, sm)
        want = x[_python_slice(*case)]
        model = _single(
            "STRIDED_SLICE", x.shape, want.shape, np.uint8,
            [np.array(begin, np.int32), np.array(end, np.int32), np.array(strides, np.int32)],
            begin_mask=bm, end_mask=em, shrink_axis_mask=sm)
        check(model, [x])


# -- PAD, SPACE_TO_DEPTH, TRANSPOSE -----------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(dtype=dtypes, shape=shapes(), data=st.data(), seed=seeds, z8=st.integers(-128, 127),
       index_type=st.sampled_from([np.int32, np.int64]))
def test_pad(dtype, shape, data, seed, z8, index_type):
    pads = [[data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))] for _ in shape]
    if len(shape) == 4 and data.draw(st.booleans()):
        pads[0] = pads[3] = [0, 0]        # the "image style" layout TFLite special-cases
    out = [s + a + b for s, (a, b) in zip(shape, pads)]
    zp = _zero_point(dtype, z8)
    model = _single("PAD", shape, out, dtype, [np.array(pads, index_type)],
                    in_q=(0.05, zp), out_q=(0.05, zp))
    check(model, [_data(np.random.default_rng(seed), shape, dtype)])


@settings(max_examples=80, deadline=None)
@given(dtype=dtypes, bs=st.integers(1, 3), n=st.integers(1, 2), h=st.integers(1, 3),
       w=st.integers(1, 3), c=st.integers(1, 4), seed=seeds)
def test_space_to_depth(dtype, bs, n, h, w, c, seed):
    shape = (n, h * bs, w * bs, c)
    model = _single("SPACE_TO_DEPTH", shape, (n, h, w, c * bs * bs), dtype, block_size=bs)
    check(model, [_data(np.random.default_rng(seed), shape, dtype)])


@settings(max_examples=100, deadline=None)
@given(dtype=dtypes, shape=shapes(max_rank=5), data=st.data(), seed=seeds)
def test_transpose(dtype, shape, data, seed):
    perm = data.draw(st.permutations(list(range(len(shape)))))
    out = [shape[p] for p in perm]
    model = _single("TRANSPOSE", shape, out, dtype, [np.array(perm, np.int32)])
    check(model, [_data(np.random.default_rng(seed), shape, dtype)])


# -- differing input and output quantization ----------------------------------------------


def _assert_both_refuse(model, inputs):
    data = model.to_bytes()
    with pytest.raises(Exception):
        run_reference(data, inputs)
    with pytest.raises(ModelError):
        run_sim(data, inputs)


def _mismatched(op, dtype):
    """``op`` on a small tensor with output quantization unlike the input's."""
    in_q, out_q = (0.05, _zero_point(dtype, 3)), (0.1, _zero_point(dtype, -7))
    shape = (1, 4, 4, 2)
    if op == "RESHAPE":
        return _single(op, shape, (4, 8), dtype, [np.array([4, 8], np.int32)],
                       in_q=in_q, out_q=out_q)
    if op == "SQUEEZE":
        return _single(op, shape, (4, 4, 2), dtype, in_q=in_q, out_q=out_q, squeeze_dims=[0])
    if op == "EXPAND_DIMS":
        return _single(op, shape, (1, 4, 4, 2, 1), dtype, [np.array([4], np.int32)],
                       in_q=in_q, out_q=out_q)
    if op == "SLICE":
        return _single(op, shape, (1, 2, 3, 2), dtype, [np.array([0, 1, 1, 0], np.int32),
                                                        np.array([1, 2, 3, 2], np.int32)],
                       in_q=in_q, out_q=out_q)
    if op == "STRIDED_SLICE":
        return _single(op, shape, (1, 2, 4, 2), dtype,
                       [np.array([0, 0, 0, 0], np.int32), np.array([1, 4, 4, 2], np.int32),
                        np.array([1, 2, 1, 1], np.int32)], in_q=in_q, out_q=out_q)
    if op == "PAD":
        return _single(op, shape, (1, 6, 5, 2), dtype,
                       [np.array([[0, 0], [1, 1], [0, 1], [0, 0]], np.int32)],
                       in_q=in_q, out_q=out_q)
    if op == "SPACE_TO_DEPTH":
        return _single(op, shape, (1, 2, 2, 8), dtype, in_q=in_q, out_q=out_q, block_size=2)
    if op == "TRANSPOSE":
        return _single(op, shape, (2, 4, 4, 1), dtype, [np.array([3, 1, 2, 0], np.int32)],
                       in_q=in_q, out_q=out_q)
    if op == "PACK":
        return _single(op, shape, (1, 1, 4, 4, 2), dtype, in_q=in_q, out_q=out_q,
                       values_count=1, axis=0)
    b = ModelBuilder()                                       # SPLIT
    a = b.constant("axis", np.array(1, np.int32))
    x = b.input("x", shape, dtype, scale=in_q[0], zero_point=in_q[1])
    ys = [b.tensor(f"y{k}", (1, 2, 4, 2), dtype, scale=out_q[0], zero_point=out_q[1])
          for k in range(2)]
    b.op("SPLIT", [a, x], ys, num_splits=2)
    b.output(*ys)
    return b.build()


ACCEPTING = ["RESHAPE", "SQUEEZE", "SLICE", "STRIDED_SLICE", "PAD", "TRANSPOSE", "SPLIT",
             "SPACE_TO_DEPTH"]
REFUSING = ["EXPAND_DIMS", "PACK"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ACCEPTING)
def test_mismatched_quantization_copies_bytes(op, dtype):
    # LiteRT moves the stored integers unchanged (PAD fills with the output's
    # zero point); so does the simulated Edge TPU.
    x = _data(np.random.default_rng(5), (1, 4, 4, 2), dtype)
    check(_mismatched(op, dtype), [x])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", REFUSING)
def test_mismatched_quantization_refused(op, dtype):
    _assert_both_refuse(_mismatched(op, dtype), [np.zeros((1, 4, 4, 2), dtype)])


# -- TILE ---------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(dtype=dtypes, shape=shapes(max_rank=4, max_side=4), data=st.data(), seed=seeds,
       index_type=st.sampled_from([np.int32, np.int64]))
def test_tile(dtype, shape, data, seed, index_type):
    reps = [data.draw(st.integers(1, 3)) for _ in shape]
    out = [s * r for s, r in zip(shape, reps)]
    # Different input and output quantization: TILE copies the stored values anyway.
    model = _single("TILE", shape, out, dtype, [np.array(reps, index_type)],
                    in_q=(0.05, 3), out_q=(0.1, 7))
    check(model, [_data(np.random.default_rng(seed), shape, dtype)])
