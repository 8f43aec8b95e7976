"""CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED and TRANSPOSE_CONV against LiteRT's
reference kernels, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coralrt.testing import ModelBuilder
from coralrt._ops.arith.common import compute_out_size
from coralrt._ops.arith.fixedpoint import multiply_by_quantized_multiplier, quantize_multiplier
from coralrt._ops.arith.requant import Requantizer
from coralrt._sim.kernels.gemm import ExactGemm

from .harness import check

DTYPES = (np.uint8, np.int8)
ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6")


def _ints(rng, shape, dtype, lo=None, hi=None):
    info = np.iinfo(dtype)
    lo = int(info.min) if lo is None else lo
    hi = int(info.max) if hi is None else hi
    return rng.integers(lo, hi + 1, size=shape, dtype=np.int64).astype(dtype)


def _weights(rng, shape, dtype, spread, int8_zp=0):
    """Weights around their zero point (as trained weights are), or over the full range.

    ``int8_zp``: a zero point on int8 weights, which DEPTHWISE_CONV_2D and
    TRANSPOSE_CONV accept and their reference kernels ignore."""
    if dtype == np.uint8:
        zp = int(rng.integers(0, 256))
        if spread is None:
            return _ints(rng, shape, dtype), zp
        w = np.clip(zp + rng.integers(-spread, spread + 1, size=shape), 0, 255)
        return w.astype(np.uint8), zp
    if spread is None:
        return _ints(rng, shape, dtype, -127, 127), int8_zp
    w = np.clip(rng.integers(-spread, spread + 1, size=shape), -127, 127).astype(np.int8)
    return w, int8_zp


class Quant:
    """Random but sensible quantization: output scale near the accumulator's spread."""

    def __init__(self, rng, dtype, channels, per_channel, depth):
        info = np.iinfo(dtype)
        self.in_scale = float(rng.uniform(0.004, 0.05))
        self.in_zp = int(rng.integers(info.min, info.max + 1))
        n = channels if per_channel else 1
        self.w_scales = rng.uniform(0.002, 0.03, size=n).astype(np.float32)
        spread = float(self.in_scale * self.w_scales.mean() * 60.0 * np.sqrt(max(depth, 1)))
        self.out_scale = float(spread * rng.uniform(0.3, 3.0))
        self.out_zp = int(rng.integers(info.min, info.max + 1))

    def bias(self, rng, channels, magnitude=3000):
        data = rng.integers(-magnitude, magnitude + 1, size=channels).astype(np.int32)
        scale = (np.float32(self.in_scale) * self.w_scales).astype(np.float32)
        if scale.size == 1:
            scale = scale[0]
        return data, scale


def _build(op, x_shape, dtype, q, w, w_zp, bias, out_shape, axis=0, extra_inputs=(),
           **options):
    b = ModelBuilder()
    x = b.input("x", x_shape, dtype, scale=q.in_scale, zero_point=q.in_zp)
    scales = q.w_scales if q.w_scales.size > 1 else float(q.w_scales[0])
    wt = b.constant("w", w, scale=scales, zero_point=w_zp, axis=axis)
    ins = [x, wt]
    if bias is not None:
        data, bscale = bias
        ins.append(b.constant("b", data, scale=bscale, zero_point=0))
    y = b.tensor("y", out_shape, dtype, scale=q.out_scale, zero_point=q.out_zp)
    if op == "TRANSPOSE_CONV":
        shape = b.constant("shape", np.array(out_shape, np.int32))
        ins = [shape, wt, x] + ins[2:]
    b.op(op, ins, [y], **options)
    b.output(y)
    return b.build()


# -- CONV_2D -----------------------------------------------------------------------------------


@st.composite
def conv_cases(draw, depthwise=False):
    dtype = draw(st.sampled_from(DTYPES))
    n = draw(st.integers(1, 2))
    h, w = draw(st.integers(1, 11)), draw(st.integers(1, 11))
    # Depthwise: also enough channels for the einsum form (64 or more output channels).
    c = draw(st.one_of(st.integers(1, 6), st.integers(22, 70))) if depthwise \
        else draw(st.integers(1, 6))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.sampled_from([1, 1, 2, 3])), draw(st.sampled_from([1, 1, 2]))
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    pad_code = 0 if padding == "SAME" else 1
    oh = compute_out_size(pad_code, h, kh, sh, dh)
    ow = compute_out_size(pad_code, w, kw, sw, dw)
    if oh < 1 or ow < 1:
        # VALID with a filter larger than the input: nothing to compute.
        kh = kw = dh = dw = 1
        oh = compute_out_size(pad_code, h, 1, sh)
        ow = compute_out_size(pad_code, w, 1, sw)
    # CONV_2D: also enough output channels for the compiled kernels' 16-lane
    # requantization and their blocks of 32 columns (with a remainder).
    mult = draw(st.integers(1, 3)) if depthwise \
        else draw(st.one_of(st.integers(1, 7), st.integers(14, 70)))
    return dict(
        dtype=dtype, n=n, h=h, w=w, c=c, kh=kh, kw=kw, sh=sh, sw=sw, dh=dh, dw=dw,
        padding=padding, oh=oh, ow=ow, mult=mult,
        act=draw(st.sampled_from(ACTIVATIONS)), bias=draw(st.booleans()),
        per_channel=dtype == np.int8 and draw(st.booleans()),
        w_zp=draw(st.sampled_from([0, 0, 11])),
        spread=draw(st.sampled_from([None, 20, 60])), seed=draw(st.integers(0, 2**32 - 1)))


def _conv_model(case, rng):
    dtype, oc = case["dtype"], case["mult"]
    kh, kw, c = case["kh"], case["kw"], case["c"]
    q = Quant(rng, dtype, oc, case["per_channel"], kh * kw * c)
    w, w_zp = _weights(rng, (oc, kh, kw, c), dtype, case["spread"])
    # LiteRT refuses quantized CONV_2D without a bias (absent or an empty slot).
    bias = q.bias(rng, oc)
    x_shape = (case["n"], case["h"], case["w"], c)
    model = _build("CONV_2D", x_shape, dtype, q, w, w_zp, bias,
                   (case["n"], case["oh"], case["ow"], oc), padding=case["padding"],
                   stride_h=case["sh"], stride_w=case["sw"], dilation_h_factor=case["dh"],
                   dilation_w_factor=case["dw"], fused_activation_function=case["act"])
    return model, [_ints(rng, x_shape, dtype)]


@settings(max_examples=400, deadline=None)
@given(case=conv_cases())
def test_conv_2d(case):
    rng = np.random.default_rng(case["seed"])
    model, inputs = _conv_model(case, rng)
    check(model, inputs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel,stride,padding", [(3, 2, "SAME"), (1, 1, "VALID"),
                                                   (3, 1, "SAME"), (5, 2, "VALID")])
def test_conv_2d_deep(dtype, kernel, stride, padding):
    """Reductions far beyond 2^24 / 255^2 terms: the float32 GEMM must be chunked."""
    rng = np.random.default_rng(kernel * 10 + stride)
    c, oc, h = 96, 24, 9
    q = Quant(rng, dtype, oc, dtype == np.int8, kernel * kernel * c)
    w, w_zp = _weights(rng, (oc, kernel, kernel, c), dtype, None)
    out = compute_out_size(0 if padding == "SAME" else 1, h, kernel, stride)
    model = _build("CONV_2D", (1, h, h, c), dtype, q, w, w_zp, q.bias(rng, oc),
                   (1, out, out, oc), padding=padding, stride_h=stride, stride_w=stride,
                   fused_activation_function="RELU6")
    check(model, [_ints(rng, (1, h, h, c), dtype)])


@pytest.mark.parametrize("dtype,per_channel", [(np.uint8, False), (np.int8, True),
                                               (np.int8, False)])
@pytest.mark.parametrize("size,c,oc,stride", [(14, 24, 144, 1), (7, 96, 40, 1), (9, 45, 33, 2),
                                              (1, 160, 70, 1), (5, 16, 16, 1)])
def test_conv_2d_pointwise_shapes(dtype, per_channel, size, c, oc, stride):
    """1x1 convolutions as in MobileNet v2: output channels in blocks of 32 and
    lanes of 16 with remainders, pixel counts not a multiple of 4, odd depths."""
    rng = np.random.default_rng(size * 1000 + c * 10 + oc)
    q = Quant(rng, dtype, oc, per_channel, c)
    w, w_zp = _weights(rng, (oc, 1, 1, c), dtype, None)
    out = compute_out_size(0, size, 1, stride)
    model = _build("CONV_2D", (1, size, size, c), dtype, q, w, w_zp, q.bias(rng, oc),
                   (1, out, out, oc), padding="SAME", stride_h=stride, stride_w=stride,
                   fused_activation_function="RELU6")
    check(model, [_ints(rng, (1, size, size, c), dtype)])


@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D"])
@pytest.mark.parametrize("dtype,per_channel", [(np.uint8, False), (np.int8, True)])
def test_multipliers_above_one(op, dtype, per_channel):
    """An output scale below input scale times weight scale: multipliers above 1,
    whose left shift the reference applies to the sum before the high
    multiplication (some channels of per-channel models have them)."""
    rng = np.random.default_rng(11 if op == "CONV_2D" else 12)
    c, size = 40, 6
    oc = 36 if op == "CONV_2D" else c
    q = Quant(rng, dtype, oc, per_channel, 9 * c if op == "CONV_2D" else 9)
    q.out_scale = float(q.in_scale * q.w_scales.min() / 5.0)
    shape = (oc, 3, 3, c) if op == "CONV_2D" else (1, 3, 3, oc)
    w, w_zp = _weights(rng, shape, dtype, 6)
    bias = q.bias(rng, oc, magnitude=40)
    options = {"stride_h": 1, "stride_w": 1}
    if op != "CONV_2D":
        options["depth_multiplier"] = 1
    model = _build(op, (1, size, size, c), dtype, q, w, w_zp, bias, (1, size, size, oc),
                   axis=0 if op == "CONV_2D" else 3, padding="SAME", **options)
    # Inputs near their zero point: small sums, so that outputs do not all saturate.
    info = np.iinfo(dtype)
    x = np.clip(q.in_zp + rng.integers(-4, 5, size=(1, size, size, c)), info.min, info.max)
    check(model, [x.astype(dtype)])


def test_conv_2d_mobilenet_stem():
    """A MobileNet stem: 224x224x3, 3x3 stride 2 SAME, uint8, RELU6."""
    rng = np.random.default_rng(7)
    dtype = np.uint8
    q = Quant(rng, dtype, 32, False, 27)
    w, w_zp = _weights(rng, (32, 3, 3, 3), dtype, 40)
    model = _build("CONV_2D", (1, 224, 224, 3), dtype, q, w, w_zp, q.bias(rng, 32),
                   (1, 112, 112, 32), padding="SAME", stride_h=2, stride_w=2,
                   fused_activation_function="RELU6")
    check(model, [_ints(rng, (1, 224, 224, 3), dtype)])


# -- DEPTHWISE_CONV_2D -------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(case=conv_cases(depthwise=True))
def test_depthwise_conv_2d(case):
    rng = np.random.default_rng(case["seed"])
    dtype, c, dm = case["dtype"], case["c"], case["mult"]
    kh, kw = case["kh"], case["kw"]
    oc = c * dm
    q = Quant(rng, dtype, oc, case["per_channel"], kh * kw)
    w, w_zp = _weights(rng, (1, kh, kw, oc), dtype, case["spread"], case["w_zp"])
    bias = q.bias(rng, oc) if case["bias"] else None
    x_shape = (case["n"], case["h"], case["w"], c)
    model = _build("DEPTHWISE_CONV_2D", x_shape, dtype, q, w, w_zp, bias,
                   (case["n"], case["oh"], case["ow"], oc), axis=3, padding=case["padding"],
                   stride_h=case["sh"], stride_w=case["sw"], depth_multiplier=dm,
                   dilation_h_factor=case["dh"], dilation_w_factor=case["dw"],
                   fused_activation_function=case["act"])
    check(model, [_ints(rng, x_shape, dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size,stride", [(56, 1), (28, 2), (7, 1)])
@pytest.mark.parametrize("c", [48, 96, 288])     # einsum along flat rows, and along channels
def test_depthwise_mobilenet_shapes(dtype, size, stride, c):
    rng = np.random.default_rng(size + stride + c)
    q = Quant(rng, dtype, c, dtype == np.int8, 9)
    w, w_zp = _weights(rng, (1, 3, 3, c), dtype, None)
    out = compute_out_size(0, size, 3, stride)
    model = _build("DEPTHWISE_CONV_2D", (1, size, size, c), dtype, q, w, w_zp, q.bias(rng, c),
                   (1, out, out, c), axis=3, padding="SAME", stride_h=stride,
                   stride_w=stride, depth_multiplier=1, fused_activation_function="RELU6")
    check(model, [_ints(rng, (1, size, size, c), dtype)])


# -- FULLY_CONNECTED ---------------------------------------------------------------------------


@st.composite
def fc_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    rank = draw(st.integers(1, 4))
    depth = draw(st.integers(1, 40))
    lead = tuple(draw(st.lists(st.integers(1, 4), min_size=rank - 1, max_size=rank - 1)))
    keep = draw(st.booleans())
    flatten = rank > 2 and not keep and draw(st.booleans())
    if flatten:
        # Rows of `depth` made from several trailing dimensions, as TFLite flattens.
        split = draw(st.sampled_from([d for d in range(1, depth + 1) if depth % d == 0]))
        x_shape = lead[:-1] + (depth // split, split) if lead else (depth // split, split)
    else:
        x_shape = lead + (depth,)
    return dict(dtype=dtype, x_shape=x_shape, depth=depth, units=draw(st.integers(1, 20)),
                keep=keep, act=draw(st.sampled_from(ACTIVATIONS)), bias=draw(st.booleans()),
                per_channel=dtype == np.int8 and draw(st.booleans()),
                w_zp=draw(st.sampled_from([0, 0, 5, -9])),
                spread=draw(st.sampled_from([None, 30])), seed=draw(st.integers(0, 2**32 - 1)))


def _fc_model(case, rng):
    dtype, depth, units = case["dtype"], case["depth"], case["units"]
    q = Quant(rng, dtype, units, case["per_channel"], depth)
    w, w_zp = _weights(rng, (units, depth), dtype, case["spread"])
    if dtype == np.int8 and not case["per_channel"] and case["w_zp"]:
        w_zp = case["w_zp"]          # per-tensor int8 weights keep their zero point
    bias = q.bias(rng, units) if case["bias"] else None
    size = int(np.prod(case["x_shape"]))
    if case["keep"]:
        out_shape = tuple(case["x_shape"][:-1]) + (units,)
    else:
        out_shape = (size // depth, units)
    model = _build("FULLY_CONNECTED", case["x_shape"], dtype, q, w, w_zp, bias, out_shape,
                   keep_num_dims=case["keep"], fused_activation_function=case["act"])
    return model, [_ints(rng, case["x_shape"], dtype)]


@settings(max_examples=400, deadline=None)
@given(case=fc_cases())
def test_fully_connected(case):
    rng = np.random.default_rng(case["seed"])
    model, inputs = _fc_model(case, rng)
    check(model, inputs)


@pytest.mark.parametrize("dtype,per_channel", [(np.uint8, False), (np.int8, False),
                                               (np.int8, True)])
def test_fully_connected_classifier(dtype, per_channel):
    """A MobileNet head: 1280 -> 1001, deep enough to need several float32 chunks."""
    rng = np.random.default_rng(1001)
    q = Quant(rng, dtype, 1001, per_channel, 1280)
    w, w_zp = _weights(rng, (1001, 1280), dtype, None)
    model = _build("FULLY_CONNECTED", (1, 1280), dtype, q, w, w_zp, q.bias(rng, 1001),
                   (1, 1001))
    check(model, [_ints(rng, (1, 1280), dtype)])


def test_fully_connected_rounding_ties():
    """Accumulators landing exactly on .5 after scaling tell the double-precision
    rounding of the reference apart from the fixed-point one."""
    rng = np.random.default_rng(3)
    dtype = np.uint8
    b = ModelBuilder()
    x = b.input("x", (64, 1), dtype, scale=0.5, zero_point=0)
    w = b.constant("w", np.array([[129], [131]], np.uint8), scale=0.25, zero_point=128)
    y = b.tensor("y", (64, 2), dtype, scale=1.0, zero_point=100)
    b.op("FULLY_CONNECTED", [x, w], [y])
    b.output(y)
    check(b.build(), [np.arange(64, dtype=np.uint8).reshape(64, 1) * 3 + int(rng.integers(0, 2))])


# -- TRANSPOSE_CONV ----------------------------------------------------------------------------


@st.composite
def tconv_cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    ih, iw = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    padding = draw(st.sampled_from(["SAME", "VALID"]))
    if padding == "SAME":
        oh, ow = ih * sh, iw * sw
    else:
        oh, ow = (ih - 1) * sh + kh, (iw - 1) * sw + kw
    return dict(dtype=dtype, n=draw(st.integers(1, 2)), ih=ih, iw=iw, c=draw(st.integers(1, 5)),
                oc=draw(st.integers(1, 5)), kh=kh, kw=kw, sh=sh, sw=sw, padding=padding,
                oh=oh, ow=ow, act=draw(st.sampled_from(ACTIVATIONS)), bias=draw(st.booleans()),
                per_channel=dtype == np.int8 and draw(st.booleans()),
                w_zp=draw(st.sampled_from([0, 0, -6])),
                spread=draw(st.sampled_from([None, 25])), seed=draw(st.integers(0, 2**32 - 1)))


@settings(max_examples=400, deadline=None)
@given(case=tconv_cases())
def test_transpose_conv(case):
    rng = np.random.default_rng(case["seed"])
    dtype, c, oc = case["dtype"], case["c"], case["oc"]
    q = Quant(rng, dtype, oc, case["per_channel"], case["kh"] * case["kw"] * c)
    w, w_zp = _weights(rng, (oc, case["kh"], case["kw"], c), dtype, case["spread"],
                       case["w_zp"])
    bias = q.bias(rng, oc) if case["bias"] else None
    x_shape = (case["n"], case["ih"], case["iw"], c)
    model = _build("TRANSPOSE_CONV", x_shape, dtype, q, w, w_zp, bias,
                   (case["n"], case["oh"], case["ow"], oc), padding=case["padding"],
                   stride_h=case["sh"], stride_w=case["sw"],
                   fused_activation_function=case["act"])
    check(model, [_ints(rng, x_shape, dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose_conv_decoder(dtype):
    """A segmentation-decoder upsampling: 2x, 4x4 kernel, 64 -> 32 channels."""
    rng = np.random.default_rng(64)
    q = Quant(rng, dtype, 32, dtype == np.int8, 16 * 64)
    w, w_zp = _weights(rng, (32, 4, 4, 64), dtype, None)
    model = _build("TRANSPOSE_CONV", (1, 8, 8, 64), dtype, q, w, w_zp, q.bias(rng, 32),
                   (1, 16, 16, 32), padding="SAME", stride_h=2, stride_w=2)
    check(model, [_ints(rng, (1, 8, 8, 64), dtype)])


# -- multiplier precision -----------------------------------------------------------------------


def _scales_where_product_precision_shows():
    """Scales and an accumulator for which the multiplier from ``float(in * w)`` and
    the one from ``double(in) * double(w)`` give different outputs."""
    rng = np.random.default_rng(11)
    accs = np.arange(-2**17, 2**17, dtype=np.int64)
    while True:
        s_in = np.float32(rng.uniform(0.001, 0.05))
        s_w = np.float32(rng.uniform(0.001, 0.05))
        s_out = np.float32(s_in * s_w * 1000 * rng.uniform(1.0, 4.0))
        by_float = quantize_multiplier(float(s_in * s_w) / float(s_out))
        by_double = quantize_multiplier(float(s_in) * float(s_w) / float(s_out))
        if by_float == by_double:
            continue
        rf = multiply_by_quantized_multiplier(accs, *by_float)
        rd = multiply_by_quantized_multiplier(accs, *by_double)
        hits = np.nonzero((rf != rd) & (np.abs(rf) < 100))[0]
        if hits.size:
            return float(s_in), float(s_w), float(s_out), int(accs[hits[0]])


@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_multiplier_precision(op, dtype):
    """uint8 kernels multiply the scales in float, int8 (per-channel) ones in double."""
    s_in, s_w, s_out, acc = _scales_where_product_precision_shows()
    uint8 = dtype == np.uint8
    b = ModelBuilder()
    x_zp = 128 if uint8 else 0
    w_zp = 77 if uint8 else 0
    x = b.input("x", (1, 16, 16, 1), dtype, scale=s_in, zero_point=x_zp)
    # One weight of value 1 (after its zero point): acc = bias + (x - x_zp).
    w = b.constant("w", np.full((1, 1, 1, 1), w_zp + 1, dtype), scale=s_w, zero_point=w_zp)
    bias = b.constant("b", np.array([acc], np.int32), scale=np.float32(s_in) * np.float32(s_w),
                      zero_point=0)
    y = b.tensor("y", (1, 16, 16, 1), dtype, scale=s_out, zero_point=x_zp)
    if op == "TRANSPOSE_CONV":
        shape = b.constant("shape", np.array([1, 16, 16, 1], np.int32))
        b.op(op, [shape, w, x, bias], [y], padding="SAME", stride_h=1, stride_w=1)
    elif op == "DEPTHWISE_CONV_2D":
        b.op(op, [x, w, bias], [y], padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1)
    else:
        b.op(op, [x, w, bias], [y], padding="SAME", stride_h=1, stride_w=1)
    b.output(y)
    info = np.iinfo(dtype)
    check(b.build(), [np.arange(info.min, info.max + 1).astype(dtype).reshape(1, 16, 16, 1)])


# -- the exact GEMM ----------------------------------------------------------------------------


def test_exact_gemm_chunks_and_is_exact():
    rng = np.random.default_rng(0)
    b = rng.integers(-255, 256, size=(3000, 7))
    a = rng.integers(-255, 256, size=(5, 3000))
    gemm = ExactGemm(b, 255)
    assert len(gemm.bounds) > 1
    got = gemm(a.astype(np.float32))
    assert np.array_equal(got.astype(np.int64), a @ b)


@settings(max_examples=300, deadline=None)
@given(channels=st.integers(1, 6), shifts=st.lists(st.integers(-31, 3), min_size=1, max_size=6),
       act=st.sampled_from([(0, 255), (-128, 127), (-128, -100), (3, 90), (-20, 40)]),
       zp=st.integers(-128, 255), with_bias=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_requantizer_matches_fixed_point(channels, shifts, act, zp, with_bias, seed):
    """The folded one-shift requantization against TFLite's two-step arithmetic."""
    rng = np.random.default_rng(seed)
    mult = rng.integers(1 << 30, 1 << 31, size=channels)
    shift = np.resize(np.array(shifts), channels)
    bias = rng.integers(-2**24, 2**24, size=channels) if with_bias else None
    scale = 2 ** int(rng.integers(4, 31))
    acc = rng.integers(-scale, scale, size=(257, channels))
    acc[:8] = rng.integers(-3, 4, size=(8, channels))            # around zero
    dtype = np.uint8 if act[0] >= 0 else np.int8
    zp = int(np.clip(zp, *act))
    rq = Requantizer(mult, shift, zp, act[0], act[1], dtype, bias)
    total = acc + (0 if bias is None else bias)
    want = multiply_by_quantized_multiplier(total, mult, shift) + zp
    want = np.clip(want, act[0], act[1]).astype(dtype)
    assert np.array_equal(rq(acc.astype(np.float64)), want)
