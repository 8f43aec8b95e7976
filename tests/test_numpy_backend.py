"""The NumPy CPU backend against LiteRT's reference kernels (``BUILTIN_REF``).

Integer outputs must be bit-exact; float outputs agree within
``rtol=1e-5, atol=1e-6`` (FLOAT_TOL).  Every shared model runs through both (those
tests skip without LiteRT; the refusals and checks at the end do not);
a model is skipped, with the reason, only when LiteRT cannot run it or the
NumPy backend refuses one of its operators.  The float kernels are checked one
by one on small built models.
"""

from __future__ import annotations

import numpy as np
import pytest
from flatbuffers import flexbuffers

from conftest import (
    extra_model_paths, litert_module, random_inputs, run_litert, shared_model, shared_model_names,
)

from coralrt._backends.numpy_backend import NumpyBackend
from coralrt.errors import (
    ConfigError, InferenceError, InputError, ModelError, SegmentTooLargeError,
    UnsupportedOperatorError,
)
from coralrt._formats.segment import build_segment
from coralrt import load_model
from coralrt.testing import ModelBuilder
from coralrt._model.types import numpy_dtype

FLOAT_TOL = {"rtol": 1e-5, "atol": 1e-6}
SSD_HEAD = "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite"


def _compare(ours: list, ref: list) -> None:
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a.dtype == b.dtype and a.shape == b.shape, (k, a.dtype, a.shape, b.dtype, b.shape)
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, err_msg=f"output {k}", **FLOAT_TOL)
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"output {k}")


def _both(data: bytes, inputs: list) -> tuple[list, list]:
    ours = NumpyBackend().load(data).run(inputs)
    return ours, run_litert(data, inputs, kernels="reference")


def _inputs(data: bytes, seed: int = 0) -> list:
    sg = load_model(data).main
    return random_inputs([sg.tensors[i] for i in sg.inputs], seed=seed)


# -- every shared model ----------------------------------------------------------------------


@pytest.mark.parametrize("path", extra_model_paths(compiled=False))
def test_extra_model_matches_litert_reference(path):
    """The same on the real models of CORALRT_EXTRA_MODELS (Coral's test data has 17
    distinct ones that LiteRT runs; MoveNet needs CAST, FLOOR_DIV, GATHER_ND, UNPACK,
    SQRT, DIV)."""
    _check_model(path.read_bytes(), path.name)


@pytest.mark.parametrize("name", shared_model_names())
def test_shared_model_matches_litert_reference(name):
    _check_model(shared_model(name).read_bytes(), name)


def _check_model(data: bytes, name: str) -> None:
    inputs = _inputs(data)
    try:
        ref = run_litert(data, inputs, kernels="reference")
    except (ValueError, RuntimeError) as e:
        pytest.skip(f"LiteRT cannot run {name}: {' '.join(str(e).split())[:160]}")
    try:
        program = NumpyBackend().load(data)
    except UnsupportedOperatorError as e:
        pytest.skip(f"the numpy backend refuses {name}: {e}")
    ours = program.run(inputs)
    _compare(ours, ref)
    assert [tuple(d["shape"]) for d in program.output_details] == [r.shape for r in ref]


def test_details_match_litert():
    from conftest import litert
    data = shared_model("mobilenet_v1_0.25_128_quant.tflite").read_bytes()
    program, interp = NumpyBackend().load(data), litert(data)
    for ours, ref in ((program.input_details, interp.get_input_details()),
                      (program.output_details, interp.get_output_details())):
        for a, b in zip(ours, ref):
            assert set(a) == set(b)
            for key in ("name", "index", "dtype", "quantization"):
                assert a[key] == b[key], key
            for key in ("shape", "shape_signature"):
                np.testing.assert_array_equal(a[key], b[key])
            for key in ("scales", "zero_points"):
                np.testing.assert_array_equal(a["quantization_parameters"][key],
                                              b["quantization_parameters"][key])


def test_ssd_head_has_postprocess_and_detects():
    data = shared_model(SSD_HEAD).read_bytes()
    assert "TFLite_Detection_PostProcess" in [op.name for op in load_model(data).main.operators]
    for seed in range(3):
        inputs = _inputs(data, seed)
        ours, ref = _both(data, inputs)
        _compare(ours, ref)
        assert ours[3][0] == ref[3][0] > 0


# -- float kernels, one by one -------------------------------------------------------------


def _unary(op, x_spec, y_spec, **options):
    b = ModelBuilder()
    x = b.input("x", *x_spec[:2], **x_spec[2])
    y = b.tensor("y", *y_spec[:2], **y_spec[2])
    b.op(op, [x], [y], **options)
    b.output(y)
    return b.build().to_bytes()


@pytest.mark.parametrize("dtype,zp", [(np.uint8, 128), (np.int8, -3)])
def test_quantize_rounds_ties_away_from_zero(dtype, zp):
    scale = 0.25      # x / scale is exact: every k + 0.5 is a tie
    data = _unary("QUANTIZE", ((1, 64), np.float32, {}),
                  ((1, 64), dtype, {"scale": scale, "zero_point": zp}))
    k = np.arange(-32, 32, dtype=np.float32)
    x = ((k + 0.5) * scale).reshape(1, 64).astype(np.float32)
    ours, ref = _both(data, [x])
    _compare(ours, ref)
    # Ties away from zero: 0.5 -> 1, -0.5 -> -1 (not to even).
    assert ours[0][0, 32] == zp + 1 and ours[0][0, 31] == zp - 1


@pytest.mark.parametrize("dtype,zp", [(np.uint8, 100), (np.int8, 5)])
def test_quantize_random_and_clamped(dtype, zp):
    data = _unary("QUANTIZE", ((4, 50), np.float32, {}),
                  ((4, 50), dtype, {"scale": 0.0173, "zero_point": zp}))
    x = (np.random.default_rng(1).standard_normal((4, 50)) * 3).astype(np.float32)
    _compare(*_both(data, [x]))


@pytest.mark.parametrize("dtype,zp", [(np.uint8, 131), (np.int8, -7)])
def test_dequantize(dtype, zp):
    data = _unary("DEQUANTIZE", ((2, 128), dtype, {"scale": 0.0371, "zero_point": zp}),
                  ((2, 128), np.float32, {}))
    x = np.arange(256).astype(np.int64).reshape(2, 128)
    x = (x if dtype == np.uint8 else x - 128).astype(dtype)
    ours, ref = _both(data, [x])
    np.testing.assert_array_equal(ours[0], ref[0])     # bit-exact


def test_logistic_float():
    data = _unary("LOGISTIC", ((1, 400), np.float32, {}), ((1, 400), np.float32, {}))
    x = np.linspace(-20, 20, 400, dtype=np.float32).reshape(1, 400)
    _compare(*_both(data, [x]))


@pytest.mark.parametrize("beta", [1.0, 0.37])
def test_softmax_float(beta):
    data = _unary("SOFTMAX", ((3, 17), np.float32, {}), ((3, 17), np.float32, {}), beta=beta)
    x = (np.random.default_rng(2).standard_normal((3, 17)) * 4).astype(np.float32)
    _compare(*_both(data, [x]))


def test_reshape_and_concatenation_float():
    b = ModelBuilder()
    x = b.input("x", (2, 6), np.float32)
    z = b.input("z", (3, 2, 1), np.float32)
    shape = b.constant("shape", np.array([3, 2, 2], np.int32))
    y = b.tensor("y", (3, 2, 2), np.float32)
    c = b.tensor("c", (3, 2, 3), np.float32)
    b.op("RESHAPE", [x, shape], [y], new_shape=[3, 2, 2])
    b.op("CONCATENATION", [y, z], [c], axis=-1)
    b.output(c)
    data = b.build().to_bytes()
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((2, 6)).astype(np.float32),
              rng.standard_normal((3, 2, 1)).astype(np.float32)]
    ours, ref = _both(data, inputs)
    np.testing.assert_array_equal(ours[0], ref[0])


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL"])
@pytest.mark.parametrize("activation", ["NONE", "RELU", "RELU6", "RELU_N1_TO_1"])
def test_binary_float_broadcast(op, activation):
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4), np.float32)
    w = b.constant("w", np.linspace(-2, 3, 4, dtype=np.float32))
    y = b.tensor("y", (2, 3, 4), np.float32)
    b.op(op, [x, w], [y], fused_activation_function=activation)
    b.output(y)
    x = (np.random.default_rng(4).standard_normal((2, 3, 4)) * 5).astype(np.float32)
    ours, ref = _both(b.build().to_bytes(), [x])
    np.testing.assert_array_equal(ours[0], ref[0])


def test_arg_max_first_of_ties():
    b = ModelBuilder()
    x = b.input("x", (2, 3, 5), np.uint8, scale=0.1, zero_point=0)
    axis = b.constant("axis", np.array([2], np.int32))
    y = b.tensor("y", (2, 3), np.int64)
    b.op("ARG_MAX", [x, axis], [y], output_type=4)          # INT64
    b.output(y)
    x = np.random.default_rng(5).integers(0, 3, (2, 3, 5)).astype(np.uint8)
    ours, ref = _both(b.build().to_bytes(), [x])
    np.testing.assert_array_equal(ours[0], ref[0])


@pytest.mark.parametrize("op", ["RELU", "RELU6", "RELU_N1_TO_1", "ABS", "NEG", "TANH"])
def test_float_elementwise(op):
    data = _unary(op, ((2, 200), np.float32, {}), ((2, 200), np.float32, {}))
    x = np.linspace(-9, 9, 400, dtype=np.float32).reshape(2, 200)
    ours, ref = _both(data, [x])
    if op == "TANH":
        _compare(ours, ref)
    else:
        np.testing.assert_array_equal(ours[0], ref[0])


@pytest.mark.parametrize("axes,keep", [([1, 2], True), ([-1], False), ([0, 3, 3], False)])
def test_mean_float(axes, keep):
    shape = (2, 5, 6, 7)
    out = tuple(1 if d in [a % 4 for a in axes] else n for d, n in enumerate(shape)) \
        if keep else tuple(n for d, n in enumerate(shape) if d not in [a % 4 for a in axes])
    b = ModelBuilder()
    x = b.input("x", shape, np.float32)
    a = b.constant("axes", np.array(axes, np.int32))
    y = b.tensor("y", out, np.float32)
    b.op("MEAN", [x, a], [y], keep_dims=keep)
    b.output(y)
    x = (np.random.default_rng(8).standard_normal(shape) * 3).astype(np.float32)
    _compare(*_both(b.build().to_bytes(), [x]))


@pytest.mark.parametrize("keep,bias,activation",
                         [(False, True, "NONE"), (True, False, "RELU"), (False, True, "RELU6")])
def test_fully_connected_float(keep, bias, activation):
    b = ModelBuilder()
    rng = np.random.default_rng(9)
    x = b.input("x", (2, 3, 40), np.float32)
    w = b.constant("w", rng.standard_normal((16, 40)).astype(np.float32) / 6)
    c = b.constant("c", rng.standard_normal(16).astype(np.float32)) if bias else -1
    y = b.tensor("y", (2, 3, 16) if keep else (6, 16), np.float32)
    b.op("FULLY_CONNECTED", [x, w, c], [y], keep_num_dims=keep,
         fused_activation_function=activation)
    b.output(y)
    ours, ref = _both(b.build().to_bytes(), [rng.standard_normal((2, 3, 40)).astype(np.float32)])
    assert ours[0].shape == ref[0].shape
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,axis", [(np.float32, 0), (np.int8, 1), (np.int32, -1)])
def test_gather(dtype, axis):
    b = ModelBuilder()
    values = np.arange(4 * 5 * 6).reshape(4, 5, 6) % 120 - 60
    q = {"scale": 0.5, "zero_point": -2} if dtype == np.int8 else {}
    p = b.constant("p", values.astype(dtype), **q)
    n = values.shape[axis]
    i = b.input("i", (2, 3), np.int32)
    out = list(values.shape)
    out[axis % 3:axis % 3 + 1] = [2, 3]
    y = b.tensor("y", tuple(out), dtype, **q)
    b.op("GATHER", [p, i], [y], axis=axis)
    b.output(y)
    idx = np.random.default_rng(10).integers(0, n, (2, 3)).astype(np.int32)
    ours, ref = _both(b.build().to_bytes(), [idx])
    np.testing.assert_array_equal(ours[0], ref[0])


def _binary_model(op, a, b, out_dtype=None, **options):
    m = ModelBuilder()
    x = m.input("a", a.shape, a.dtype)
    y = m.input("b", b.shape, b.dtype)
    z = m.tensor("z", np.broadcast_shapes(a.shape, b.shape), out_dtype or a.dtype)
    m.op(op, [x, y], [z], **options)
    m.output(z)
    return m.build().to_bytes()


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_floor_div(dtype):
    rng = np.random.default_rng(12)
    a = rng.integers(-50, 50, (3, 8)).astype(dtype)
    b = rng.choice([-7, -3, -1, 1, 2, 5], (3, 8)).astype(dtype)
    ours, ref = _both(_binary_model("FLOOR_DIV", a, b), [a, b])
    np.testing.assert_array_equal(ours[0], ref[0])
    if dtype == np.int32:
        with pytest.raises(InferenceError, match="division by zero"):
            NumpyBackend().load(_binary_model("FLOOR_DIV", a, b)).run([a, b * 0])


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL"])
def test_wide_int_arithmetic(op):
    rng = np.random.default_rng(13)
    a = rng.integers(-2**31, 2**31, (2, 5), dtype=np.int64).astype(np.int32)   # wraps
    b = rng.integers(-2**31, 2**31, (1, 5), dtype=np.int64).astype(np.int32)
    ours, ref = _both(_binary_model(op, a, b, fused_activation_function="RELU"), [a, b])
    np.testing.assert_array_equal(ours[0], ref[0])


def test_div_and_sqrt_float():
    rng = np.random.default_rng(14)
    a = (rng.standard_normal((4, 9)) * 3).astype(np.float32)
    b = (rng.standard_normal((1, 9)) + 3).astype(np.float32)
    ours, ref = _both(_binary_model("DIV", a, b), [a, b])
    np.testing.assert_array_equal(ours[0], ref[0])
    data = _unary("SQRT", ((2, 100), np.float32, {}), ((2, 100), np.float32, {}))
    x = np.linspace(0, 50, 200, dtype=np.float32).reshape(2, 100)
    ours, ref = _both(data, [x])
    np.testing.assert_array_equal(ours[0], ref[0])


@pytest.mark.parametrize("src,dst", [(np.uint8, np.float32), (np.int32, np.float32),
                                     (np.float32, np.int32), (np.int8, np.int32)])
def test_cast(src, dst):
    x = np.linspace(-300.7, 300.7, 64).reshape(1, 64)
    x = x.astype(src) if np.dtype(src).kind == "f" else \
        np.clip(x, np.iinfo(src).min, np.iinfo(src).max).astype(src)
    data = _unary("CAST", ((1, 64), src, {}), ((1, 64), dst, {}))
    ours, ref = _both(data, [x])
    np.testing.assert_array_equal(ours[0], ref[0])


def test_unpack_and_gather_nd():
    m = ModelBuilder()
    x = m.input("x", (3, 4, 5), np.int8, scale=0.1, zero_point=2)
    idx = m.input("i", (2, 2), np.int32)
    parts = [m.tensor(f"p{k}", (3, 5), np.int8, scale=0.1, zero_point=2) for k in range(4)]
    g = m.tensor("g", (2, 5), np.int8, scale=0.1, zero_point=2)
    m.op("UNPACK", [x], parts, num=4, axis=1)
    m.op("GATHER_ND", [x, idx], [g])
    for t in (*parts, g):
        m.output(t)
    data = m.build().to_bytes()
    v = np.random.default_rng(15).integers(-128, 128, (3, 4, 5)).astype(np.int8)
    i = np.array([[2, 3], [0, 1]], np.int32)
    ours, ref = _both(data, [v, i])
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(InferenceError, match="GATHER_ND index 4 is out of range"):
        NumpyBackend().load(data).run([v, np.array([[2, 4], [0, 1]], np.int32)])


@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_batch_matmul(dtype, adj_x, adj_y):
    rng = np.random.default_rng(16)
    a_shape = (2, 3, 24, 5) if adj_x else (2, 3, 5, 24)
    b_shape = (1, 3, 7, 24) if adj_y else (1, 3, 24, 7)       # batch 1 broadcasts
    m = ModelBuilder()
    qa = {"scale": 0.05, "zero_point": 3} if dtype == np.int8 else {}
    qb = {"scale": 0.02, "zero_point": -9} if dtype == np.int8 else {}
    qo = {"scale": 0.09, "zero_point": -4} if dtype == np.int8 else {}
    a = m.input("a", a_shape, dtype, **qa)
    b = m.input("b", b_shape, dtype, **qb)
    y = m.tensor("y", (2, 3, 5, 7), dtype, **qo)
    m.op("BATCH_MATMUL", [a, b], [y], adj_x=adj_x, adj_y=adj_y)
    m.output(y)
    if dtype == np.int8:
        inputs = [rng.integers(-128, 128, s).astype(np.int8) for s in (a_shape, b_shape)]
    else:
        inputs = [rng.standard_normal(s).astype(np.float32) for s in (a_shape, b_shape)]
    ours, ref = _both(m.build().to_bytes(), inputs)
    if dtype == np.int8:
        np.testing.assert_array_equal(ours[0], ref[0])
        assert len(np.unique(ours[0])) > 50             # not saturated
    else:
        np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float32])
def test_leaky_relu(dtype):
    rng = np.random.default_rng(20)
    off = 128 if dtype == np.uint8 else 0
    for trial in range(1 if dtype == np.float32 else 12):
        alpha = float(rng.uniform(0.01, 0.5))
        q_in = {"scale": float(rng.uniform(0.005, 0.1)), "zero_point": int(rng.integers(-30, 30)) + off}
        q_out = {"scale": float(rng.uniform(0.005, 0.1)), "zero_point": int(rng.integers(-30, 30)) + off}
        if dtype == np.float32:
            q_in = q_out = {}
            x = np.linspace(-5, 5, 256, dtype=np.float32).reshape(1, 256)
        else:
            x = np.arange(256, dtype=np.uint8).view(dtype).reshape(1, 256)     # every code
        data = _unary("LEAKY_RELU", ((1, 256), dtype, q_in), ((1, 256), dtype, q_out),
                      alpha=alpha)
        ours, ref = _both(data, [x])
        np.testing.assert_array_equal(ours[0], ref[0], err_msg=f"{alpha} {q_in} {q_out}")


@pytest.mark.parametrize("dtype", [np.int8, np.float32])
def test_split_v_and_depth_to_space(dtype):
    q = {"scale": 0.1, "zero_point": 3} if dtype == np.int8 else {}
    m = ModelBuilder()
    x = m.input("x", (1, 3, 4, 8), dtype, **q)
    sizes = m.constant("sizes", np.array([2, -1, 3], np.int32))
    axis = m.constant("axis", np.array([3], np.int32))
    parts = [m.tensor(f"p{k}", (1, 3, 4, n), dtype, **q) for k, n in enumerate((2, 3, 3))]
    d = m.tensor("d", (1, 6, 8, 2), dtype, **q)
    m.op("SPLIT_V", [x, sizes, axis], parts, num_splits=3)
    m.op("DEPTH_TO_SPACE", [x], [d], block_size=2)
    for t in (*parts, d):
        m.output(t)
    v = np.random.default_rng(21).integers(-100, 100, (1, 3, 4, 8)).astype(dtype)
    ours, ref = _both(m.build().to_bytes(), [v])
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)


def test_abs_int8():
    rng = np.random.default_rng(19)
    for trial in range(12):
        q_in = {"scale": float(rng.uniform(0.005, 0.1)), "zero_point": int(rng.integers(-30, 30))}
        q_out = dict(q_in, zero_point=-128) if trial % 4 == 0 else \
            {"scale": float(rng.uniform(0.005, 0.1)), "zero_point": int(rng.integers(-128, -60))}
        data = _unary("ABS", ((1, 256), np.int8, q_in), ((1, 256), np.int8, q_out))
        x = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)       # every code
        ours, ref = _both(data, [x])
        np.testing.assert_array_equal(ours[0], ref[0], err_msg=f"{q_in} {q_out}")


@pytest.mark.parametrize("approximate", [False, True])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.float32])
def test_gelu(dtype, approximate):
    rng = np.random.default_rng(17)
    for trial in range(1 if dtype == np.float32 else 12):
        q_in = {"scale": float(rng.uniform(0.005, 0.3)),
                "zero_point": int(rng.integers(-20, 20)) + (128 if dtype == np.uint8 else 0)}
        q_out = {"scale": float(rng.uniform(0.005, 0.08)),
                 "zero_point": int(rng.integers(-128, -60)) + (128 if dtype == np.uint8 else 0)}
        if dtype == np.float32:
            q_in = q_out = {}
        data = _unary("GELU", ((1, 256), dtype, q_in), ((1, 256), dtype, q_out),
                      approximate=approximate)
        if dtype == np.float32:
            x = np.linspace(-8, 8, 256, dtype=np.float32).reshape(1, 256)
        else:     # every code
            x = np.arange(256, dtype=np.uint8).view(dtype).reshape(1, 256)
        ours, ref = _both(data, [x])
        if dtype == np.float32:
            _compare(ours, ref)
        else:
            np.testing.assert_array_equal(ours[0], ref[0], err_msg=f"{q_in} {q_out}")


@pytest.mark.parametrize("gelu", ["builtin", "tanh"])
def test_int8_bert_encoder(gelu):
    """A transformer on the CPU: embeddings (GATHER), int8 attention (BATCH_MATMUL,
    4-D SOFTMAX), LayerNorm as MEAN/SQUARED_DIFFERENCE/RSQRT, int8 GELU or its tanh form."""
    from support.bert_models import bert_encoder
    data = bert_encoder(layers=1, seq=32, gelu=gelu)
    sg = load_model(data).main
    tokens = np.random.default_rng(18).integers(0, 1000, tuple(sg.tensors[sg.inputs[0]].shape))
    inputs = [tokens.astype(numpy_dtype(sg.tensors[sg.inputs[0]].type))]
    ours, ref = _both(data, inputs)
    np.testing.assert_array_equal(ours[0], ref[0])


def test_state_the_model_also_returns_carries_over():
    model = load_model(shared_model("keras_lstm_mnist_ptq.tflite"))
    state = next(i for i, t in enumerate(model.main.tensors) if t.is_variable)
    model.main.outputs.append(state)
    data = model.to_bytes()
    inputs = _inputs(data, seed=11)
    program = NumpyBackend().load(data)
    first, second = program.run(inputs), program.run(inputs)
    assert not np.array_equal(first[-1], second[-1])     # the state moved on
    Interpreter, OpResolverType = litert_module().Interpreter, litert_module().OpResolverType
    interp = Interpreter(model_content=data,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    interp.allocate_tensors()
    for ours in (first, second):
        for d, v in zip(interp.get_input_details(), inputs):
            interp.set_tensor(d["index"], v)
        interp.invoke()
        _compare(ours, [interp.get_tensor(d["index"]) for d in interp.get_output_details()])


def _detection_model(regular: bool, per_detection: int, boxes: int = 60, classes: int = 5,
                     max_det: int = 7, per_class: int = 4, flat: int = 0):
    opts = flexbuffers.Dumps({
        "max_detections": max_det, "max_classes_per_detection": per_detection,
        "detections_per_class": per_class, "use_regular_nms": regular, "num_classes": classes,
        "nms_score_threshold": 0.25, "nms_iou_threshold": 0.5,
        "y_scale": 10.0, "x_scale": 10.0, "h_scale": 5.0, "w_scale": 5.0})
    rng = np.random.default_rng(6)
    centers = rng.uniform(0.2, 0.8, (boxes, 2))
    sizes = rng.uniform(0.1, 0.4, (boxes, 2))
    sizes[:flat, 0] = 0           # anchors of height 0: boxes of area 0
    anchors = np.concatenate([centers, sizes], axis=1).astype(np.float32)
    b = ModelBuilder()
    enc = b.input("boxes", (1, boxes, 4), np.float32)
    sco = b.input("scores", (1, boxes, classes + 1), np.float32)
    anc = b.constant("anchors", anchors)
    outs = [b.tensor(n, (), np.float32) for n in ("det_boxes", "det_classes", "det_scores",
                                                  "num")]
    b.op("TFLite_Detection_PostProcess", [enc, sco, anc], outs, custom_options=opts)
    b.output(*outs)
    inputs = [(rng.standard_normal((1, boxes, 4)) * 2).astype(np.float32),
              rng.uniform(0, 1, (1, boxes, classes + 1)).astype(np.float32)]
    return b.build().to_bytes(), inputs


@pytest.mark.parametrize("regular,per_detection", [(False, 1), (False, 3), (True, 1)])
def test_detection_postprocess_float(regular, per_detection):
    data, inputs = _detection_model(regular, per_detection)
    ours, ref = _both(data, inputs)
    _compare(ours, ref)
    assert ours[3][0] > 0


@pytest.mark.parametrize("regular", [False, True])
def test_detection_postprocess_crowded(regular):
    """500 overlapping boxes and up to 40 detections: most candidates are suppressed."""
    data, inputs = _detection_model(regular, 1, boxes=500, max_det=40, per_class=40, flat=100)
    ours, ref = _both(data, inputs)
    _compare(ours, ref)
    assert 10 < ours[3][0] <= 40
    # Boxes of area 0 (a fifth of the anchors) overlap nothing and are kept.
    assert (ours[0][0, :, 0] == ours[0][0, :, 2]).sum() > 0


# -- what the backend refuses or checks ---------------------------------------------------


def test_float_operator_without_kernel_is_refused_at_load():
    data = _unary("SIN", ((1, 4), np.float32, {}), ((1, 4), np.float32, {}))
    with pytest.raises(UnsupportedOperatorError, match="SIN") as info:
        NumpyBackend().load(data)
    assert info.value.op_name == "SIN" and "no float kernel" in str(info.value)


def test_dynamic_range_weights_are_refused_at_load():
    b = ModelBuilder()
    x = b.input("x", (1, 8), np.float32)
    w = b.constant("w", np.ones((4, 8), np.int8), scale=0.1, zero_point=0)
    y = b.tensor("y", (1, 4), np.float32)
    b.op("FULLY_CONNECTED", [x, w, -1], [y])
    b.output(y)
    with pytest.raises(ModelError, match="dynamic-range quantization"):
        NumpyBackend().load(b.build().to_bytes())


def test_gather_index_out_of_range_fails_the_run():
    b = ModelBuilder()
    p = b.constant("p", np.arange(12, dtype=np.float32).reshape(4, 3))
    i = b.input("i", (2,), np.int32)
    y = b.tensor("y", (2, 3), np.float32)
    b.op("GATHER", [p, i], [y], axis=0)
    b.output(y)
    program = NumpyBackend().load(b.build().to_bytes())
    np.testing.assert_array_equal(program.run([np.array([3, 0], np.int32)])[0],
                                  [[9, 10, 11], [0, 1, 2]])
    for bad in ([4, 0], [-1, 0]):      # NumPy would wrap -1; TFLite refuses it
        with pytest.raises(InferenceError, match="out of range"):
            program.run([np.array(bad, np.int32)])


def test_model_without_operators_returns_its_input():
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.uint8, scale=0.5, zero_point=3)
    b.output(x)
    x = np.arange(4, dtype=np.uint8).reshape(1, 4)
    np.testing.assert_array_equal(NumpyBackend().load(b.build().to_bytes()).run([x])[0], x)


def test_compiled_model_is_refused():
    data = shared_model("edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite").read_bytes()
    with pytest.raises(UnsupportedOperatorError, match="compiled for the Edge TPU"):
        NumpyBackend().load(data)


def test_activations_past_on_chip_memory_run():
    b = ModelBuilder()
    q = {"scale": 0.05, "zero_point": 10}
    x = b.input("x", (1, 1024, 1024, 16), np.uint8, **q)
    y = b.tensor("y", (1, 1024, 1024, 16), np.uint8, scale=0.1, zero_point=3)
    b.op("ADD", [x, x], [y])
    b.output(y)
    model = b.build()
    with pytest.raises(SegmentTooLargeError):
        build_segment(model)
    data = model.to_bytes()
    x = np.random.default_rng(7).integers(0, 256, (1, 1024, 1024, 16)).astype(np.uint8)
    _compare(*_both(data, [x]))


def test_arguments_and_inputs_are_checked():
    data = shared_model("add_float.tflite").read_bytes()
    backend = NumpyBackend()
    assert backend.name == "numpy" and "numpy" in backend.version
    with pytest.raises(ConfigError):
        backend.load(data, kernels="fast")
    with pytest.raises(ConfigError):
        backend.load(data, num_threads=0)
    program = backend.load(data, kernels="reference", num_threads=2)
    with pytest.raises(InputError):
        program.run([np.zeros((1, 8, 8, 3), np.float64)])
    with pytest.raises(InputError):
        program.run([])
    program.resize_inputs([(1, 8, 8, 3)])
    with pytest.raises(InputError):
        program.resize_inputs([(2, 8, 8, 3)])
    x = np.ones((1, 8, 8, 3), np.float32)
    first = program.run([x])
    first[0][...] = 99
    assert program.run([x])[0][0, 0, 0, 0] == 3.0 and program.last_seconds > 0
    assert program.operators == 2 and program.profile()[0]["operators"] == 2


def test_the_libedgetpu_driver_needs_an_interpreter_backend():
    from coralrt._backends import libedgetpu
    from coralrt._compile.jit import jit_compile
    model = jit_compile(shared_model("mobilenet_v1_0.25_128_quant.tflite")).model
    with pytest.raises(ConfigError, match="'numpy' cannot load delegates"):
        libedgetpu.load_program(model, backend=NumpyBackend())


def _retyped(data: bytes, tensor: str, type_name: str) -> bytes:
    from coralrt._model import flatbuf
    from coralrt._model.types import TENSOR_TYPES
    tree = flatbuf.decode(data)
    tensors = tree["subgraphs"][0]["tensors"]
    next(t for t in tensors if t["name"] == tensor)["type"] = TENSOR_TYPES[type_name]
    return flatbuf.encode(tree)


@pytest.mark.parametrize("type_name", ["STRING", "INT4"])
@pytest.mark.parametrize("which", ["input", "output"])
def test_model_input_or_output_without_numpy_type_is_refused_at_load(type_name, which):
    # Found by the model fuzzer: a STRING or INT4 model input or output (types
    # NumPy has no dtype for) raised a raw AttributeError while the backend
    # described the model's inputs and outputs.  LiteRT runs both models (it
    # takes and returns INT4 as int8 arrays, STRING as arrays of bytes).
    b = ModelBuilder()
    x = b.input("x", (1, 8), np.uint8, scale=0.5, zero_point=3)
    if which == "input":      # a model that returns its input
        b.output(x)
        name = "x"
    else:                     # a SPLIT output
        ys = [b.tensor(f"y{k}", (1, 4), np.uint8, scale=0.5, zero_point=3) for k in range(2)]
        b.op("SPLIT", [b.constant("axis", np.array(1, np.int32)), x], ys, num_splits=2)
        b.output(*ys)
        name = "y1"
    data = _retyped(b.build().to_bytes(), name, type_name)
    with pytest.raises(ModelError, match=f"{which} tensor '{name}' is {type_name}") as info:
        NumpyBackend().load(data)
    assert "litert" in str(info.value)
