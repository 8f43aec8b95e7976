"""InferenceSession on the CPU target."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from conftest import model_params, random_inputs, run_litert, shared_model
from test_model import RUNNABLE, per_channel_conv_model

import coralrt
from coralrt import InferenceSession, TensorInfo, dequantize, quantize
from coralrt.errors import (
    ConfigError, DeviceNotFoundError, InputError, ModelError, UnsupportedOperatorError,
)
from coralrt import load_model
from coralrt.testing import ModelBuilder


@pytest.mark.parametrize("kernels", ["optimized", "reference"])
@pytest.mark.parametrize("name", model_params(RUNNABLE))
def test_outputs_bit_identical_to_litert(name, kernels):
    path = shared_model(name)
    sess = InferenceSession(path, cpu_kernels=kernels)
    feeds = random_inputs(sess.get_inputs(), seed=11)
    want = run_litert(path.read_bytes(), feeds, kernels=kernels)
    got = sess.run(feeds)
    assert list(got) == [o.name for o in sess.get_outputs()]
    for w, g in zip(want, got.values()):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def test_model_as_path_bytes_or_model_object():
    path = shared_model("add_quantized_int8.tflite")
    m = load_model(path)
    x = random_inputs([m.main.tensors[m.main.inputs[0]]], seed=2)[0]
    results = [InferenceSession(src).run(x) for src in
               (path, str(path), path.read_bytes(), load_model(path))]
    for r in results[1:]:
        for k in r:
            np.testing.assert_array_equal(r[k], results[0][k])


def test_tensor_info():
    sess = InferenceSession(shared_model("mobilenet_v1_0.25_128_quant.tflite"))
    (inp,) = sess.get_inputs()
    assert isinstance(inp, TensorInfo)
    assert (inp.name, inp.shape, inp.dtype) == ("input", (1, 128, 128, 3), np.dtype(np.uint8))
    assert inp.quantization == (0.0078125, 128)
    np.testing.assert_array_equal(inp.scales, [0.0078125])
    (out,) = sess.get_outputs()
    assert out.shape == (1, 1001) and out.is_quantized


def test_per_channel_tensor_info():
    m = per_channel_conv_model()
    w = TensorInfo.from_tensor(m.main.tensors[1], 1)
    assert w.quantization == (0.0, 0)
    assert w.scales.shape == (4,) and w.quantized_dimension == 0
    q = w.quantize(np.ones((4, 3, 3, 3)))
    np.testing.assert_array_equal(q[:, 0, 0, 0], np.round(1 / w.scales).clip(-128, 127))


def test_input_forms():
    sess = InferenceSession(shared_model("split_concat.tflite"))
    names = [i.name for i in sess.get_inputs()]
    feeds = random_inputs(sess.get_inputs(), seed=5)
    by_list = sess.run(feeds)
    by_dict = sess.run(dict(zip(reversed(names), reversed(feeds))))
    for k in by_list:
        np.testing.assert_array_equal(by_list[k], by_dict[k])
    one = InferenceSession(shared_model("add_quantized_uint8.tflite"))
    x = random_inputs(one.get_inputs(), seed=1)[0]
    np.testing.assert_array_equal(list(one.run(x).values())[0],
                                  list(one.run([x]).values())[0])
    # Python lists take the input's dtype when every value fits.
    np.testing.assert_array_equal(list(one.run([x.tolist()]).values())[0],
                                  list(one.run(x).values())[0])


def test_selected_outputs():
    sess = InferenceSession(shared_model("split_concat.tflite"))
    feeds = random_inputs(sess.get_inputs())
    names = [o.name for o in sess.get_outputs()]
    picked = sess.run(feeds, outputs=[names[3], names[1]])
    assert list(picked) == [names[3], names[1]]
    np.testing.assert_array_equal(picked[names[1]], sess.run(feeds)[names[1]])
    with pytest.raises(InputError, match="unknown output 'nope'"):
        sess.run(feeds, outputs=["nope"])


@pytest.mark.parametrize("bad, match", [
    (lambda f, n: {"nope": f[0]}, r"missing \['input.*unknown \['nope'\]"),
    (lambda f, n: f[:2], "has 3 input"),
    (lambda f, n: f[0], "has 3 inputs"),
    (lambda f, n: [f[0].astype(np.float32), *f[1:]], "expects dtype uint8, got float32.*quantize"),
    (lambda f, n: [f[0][..., :1], *f[1:]], r"expects shape \[.*\], got \["),
    (lambda f, n: "text", "must be a dict"),
    (lambda f, n: [[300] * 3, *f[1:]], "do not fit dtype uint8"),
])
def test_input_errors_name_expected_and_received(bad, match):
    sess = InferenceSession(shared_model("split_concat.tflite"))
    feeds = random_inputs(sess.get_inputs())
    names = [i.name for i in sess.get_inputs()]
    with pytest.raises(InputError, match=match):
        sess.run(bad(feeds, names))


@pytest.mark.needs_litert("dynamic input shapes: the numpy backend runs static shapes only")
def test_dynamic_batch_follows_the_signature():
    path = shared_model("hello_world_int8.tflite")
    sess = InferenceSession(path)
    (info,) = sess.get_inputs()
    assert info.shape_signature == (-1, 1)
    x = np.arange(-8, 8, dtype=np.int8).reshape(16, 1)
    got = sess.run(x)
    (out,) = got.values()
    assert out.shape == (16, 1)
    for i in (0, 7, 15):  # each row equals a batch-1 run
        np.testing.assert_array_equal(out[i:i + 1], list(sess.run(x[i:i + 1]).values())[0])
    with pytest.raises(InputError, match="expects shape"):
        sess.run(np.zeros((2, 2), np.int8))


def test_unknown_custom_operators_are_named():
    for name, op in (("custom_sinh.tflite", "Sinh"),
                     ("invalid/model_invoking_error.tflite", "fake-op-double")):
        with pytest.raises(UnsupportedOperatorError) as e:
            InferenceSession(shared_model(name))
        assert e.value.op_name == op
        assert str(e.value).startswith(f"operator 0: operator {op!r} is not provided")
        assert "plugin" in str(e.value)


def test_edgetpu_compiled_model_on_cpu_says_why():
    with pytest.raises(ModelError, match="compiled by edgetpu_compiler"):
        InferenceSession(shared_model("edgetpu/split_concat_edgetpu.tflite"))


def test_targets():
    path = shared_model("add_quantized_uint8.tflite")
    with pytest.raises(ConfigError, match="unknown target 'gpu'"):
        InferenceSession(path, target="gpu")
    with pytest.raises(DeviceNotFoundError, match="^no Coral USB Accelerator found"):
        InferenceSession(path, target="coral")      # no stick here: said before any compiler
    assert InferenceSession(path, target="auto").target == "cpu"
    with pytest.raises(ConfigError, match="unknown CPU backend"):
        InferenceSession(path, backend="nope")


def test_invalid_models_raise_model_error():
    for name in ("invalid/not_a_model.bin", "invalid/broken_model.tflite",
                 "invalid/empty_model.tflite"):
        with pytest.raises(ModelError):
            InferenceSession(shared_model(name))


def test_concurrent_runs_match_sequential():
    sess = InferenceSession(shared_model("mobilenet_v1_0.25_128_quant.tflite"), num_threads=1)
    feeds = [random_inputs(sess.get_inputs(), seed=s)[0] for s in range(8)]
    want = [sess.run(f) for f in feeds]
    got: dict[int, dict] = {}

    def work(i):
        got[i] = sess.run(feeds[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        for k in want[i]:
            np.testing.assert_array_equal(got[i][k], want[i][k])


def test_quantize_matches_tflite_rounding():
    # Half away from zero, then clamp, as TFLite's quantize kernel does.
    q = quantize([0.25, -0.25, 0.75, 100.0, -100.0], 0.5, 10, np.uint8)
    np.testing.assert_array_equal(q, [11, 9, 12, 210, 0])
    q8 = quantize([[1.0, 1.0], [1.0, 1.0]], [0.5, 0.25], [0, 1], np.int8, axis=1)
    np.testing.assert_array_equal(q8, [[2, 5], [2, 5]])
    np.testing.assert_allclose(dequantize(q8, [0.5, 0.25], [0, 1], axis=1), 1.0)


def test_quantize_round_trip_through_a_session():
    sess = InferenceSession(shared_model("add_quantized_uint8.tflite"))
    (inp,) = sess.get_inputs()
    lo = -inp.quantization[1] * inp.quantization[0]
    x = np.linspace(lo, lo + 255 * inp.quantization[0], int(np.prod(inp.shape))).reshape(inp.shape)
    q = inp.quantize(x)
    assert q.dtype == np.uint8
    assert np.max(np.abs(inp.dequantize(q) - x)) <= inp.quantization[0] / 2 + 1e-7
    (out,) = sess.get_outputs()
    y = out.dequantize(list(sess.run(q).values())[0])
    assert y.dtype == np.float32


def test_public_facade():
    assert set(coralrt.__all__) >= {"InferenceSession", "load_model", "TensorInfo",
                                    "quantize", "dequantize", "__version__"}
    assert coralrt.__version__.count(".") >= 2


# -- feeds in the other byte order, and None -------------------------------------------------

_ADD_QUANT = {np.float32: {}, np.uint8: dict(scale=0.5, zero_point=128),
              np.int8: dict(scale=0.5, zero_point=0), np.int16: dict(scale=1.0, zero_point=0),
              np.int32: {}}


def add_model(dtype):
    """``y = x + x`` on a (2, 3) input of ``dtype``."""
    b = ModelBuilder()
    x = b.input("x", (2, 3), dtype, **_ADD_QUANT[dtype])
    y = b.tensor("y", (2, 3), dtype, **_ADD_QUANT[dtype])
    b.op("ADD", [x, x], [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("dtype", [
    pytest.param(d, marks=pytest.mark.needs_litert("the numpy backend has no int16 ADD"))
    if d == np.int16 else d for d in _ADD_QUANT], ids=lambda d: np.dtype(d).name)
def test_feed_in_the_other_byte_order_gives_the_native_outputs(dtype):
    sess = InferenceSession(add_model(dtype))
    (info,) = sess.get_inputs()
    native = np.dtype(dtype)
    values = np.array([[-3, -2, -1], [0, 1, 2]]) * (1000 if native.itemsize > 1 else 20) + 7
    x = values.astype(native)
    swapped = x.astype(native.newbyteorder("S"))
    np.testing.assert_array_equal(swapped, x)
    if native.itemsize == 1:   # '|u1', '|i1': no byte order, the very same dtype
        assert swapped.dtype == native
    else:
        assert swapped.dtype != native and not swapped.dtype.isnative
    assert sess._check(info, x) is x                  # the common path copies nothing
    want = sess.run(x)["y"]
    for feed in (swapped, [swapped], {"x": swapped}):
        got = sess.run(feed)["y"]
        assert got.dtype == native
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(sess.submit(swapped).result()["y"], want)
    np.testing.assert_array_equal(swapped, x)         # the caller's array is untouched


def test_other_byte_order_of_another_type_is_still_refused():
    sess = InferenceSession(add_model(np.float32))
    big = np.zeros((2, 3), np.dtype(np.float64).newbyteorder("S"))
    with pytest.raises(InputError, match="input 'x' expects dtype float32, got float64"):
        sess.run(big)
    with pytest.raises(InputError, match="expects shape"):   # converted, then shape-checked
        sess.run(np.zeros((3, 2), np.dtype(np.float32).newbyteorder("S")))


@pytest.mark.parametrize("dtype", [np.float32, np.uint8], ids=["float32", "uint8"])
@pytest.mark.parametrize("feed, match", [
    (lambda: {"x": None}, r"input 'x' is None; pass a \w+ array of shape \[2, 3\]"),
    (lambda: [None], r"input 'x' is None"),
    (lambda: None, r"inputs must be a dict"),
    (lambda: [[[1, None, 2], [3, 4, 5]]], r"input 'x': .*holding None"),
    (lambda: {"x": [None] * 3}, r"input 'x': .*holding None"),
], ids=["dict", "list", "bare", "nested", "row"])
def test_none_feed_is_an_input_error_naming_the_input(dtype, feed, match):
    sess = InferenceSession(add_model(dtype))
    with pytest.raises(InputError, match=match):
        sess.run(feed())
    with pytest.raises(InputError, match=match):
        sess.submit(feed())


@pytest.mark.parametrize("dtype", [np.uint8, pytest.param(np.float32, marks=pytest.mark.needs_litert(
    "the numpy backend has no float DEPTHWISE_CONV_2D"))])
@pytest.mark.parametrize("kernels", ["optimized", "reference"])
def test_depthwise_conv_without_bias_runs_instead_of_crashing(dtype, kernels):
    # LiteRT's optimized kernels die with SIGSEGV on a two-input DEPTHWISE_CONV_2D;
    # coralrt hands it an explicit zero bias (coralrt/_model/fixups.py). Run in a
    # child process, so that a regression fails the test instead of the suite.
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent(f"""
        import numpy as np
        from coralrt import InferenceSession
        from coralrt.testing import ModelBuilder
        dt = np.dtype({np.dtype(dtype).name!r})
        q = dict(scale=0.1, zero_point=128) if dt == np.uint8 else {{}}
        b = ModelBuilder()
        x = b.input("x", (1, 6, 6, 3), dt, **q)
        w = b.constant("w", np.arange(27, dtype=dt).reshape(1, 3, 3, 3) % 7 + 120,
                       **(dict(scale=0.02, zero_point=128) if dt == np.uint8 else {{}}))
        y = b.tensor("y", (1, 6, 6, 3), dt, **(dict(scale=0.5, zero_point=100) if dt == np.uint8 else {{}}))
        b.op("DEPTHWISE_CONV_2D", [x, w], [y], padding="SAME", stride_w=1, stride_h=1,
             depth_multiplier=1)
        b.output(y)
        feed = (np.arange(108) % 50 + 100).astype(dt).reshape(1, 6, 6, 3)
        from coralrt._model.fixups import with_explicit_biases
        model = b.build()
        explicit = with_explicit_biases(model)
        assert explicit is not None and len(explicit.main.operators[0].inputs) == 3
        out = InferenceSession(model, cpu_kernels={kernels!r}).run(feed)["y"]
        # The same kernels with a zero bias written into the model give the same result,
        # and the reference kernels (which accept two inputs) agree within a rounding step.
        same = InferenceSession(explicit, cpu_kernels={kernels!r}).run(feed)["y"]
        ref = InferenceSession(model, cpu_kernels="reference").run(feed)["y"]
        assert out.shape == (1, 6, 6, 3) and np.array_equal(out, same)
        assert np.allclose(out.astype(np.float64), ref.astype(np.float64), atol=1, rtol=1e-5)
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-1500:]
