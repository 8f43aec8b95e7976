"""The CPU backend against the real LiteRT interpreter and the shared test models."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest
litert = pytest.importorskip("ai_edge_litert.interpreter",
                             reason="ai-edge-litert is not installed")
from conftest import MODELS_DIR, model_params, shared_model

from coralrt import _backends as backends
from coralrt._backends.litert import LiteRTBackend, _translate
from coralrt.errors import (
    BackendUnavailableError,
    ConfigError,
    InferenceError,
    InputError,
    ModelError,
    UnsupportedOperatorError,
)

# Top-level models that need an operator no runtime ships.
NEEDS_PLUGIN = {"custom_sinh.tflite": "Sinh"}
PLAIN_MODELS = sorted(
    p.name for p in MODELS_DIR.glob("*.tflite") if p.name not in NEEDS_PLUGIN
)
RESOLVERS = {
    "optimized": litert.OpResolverType.AUTO,
    "reference": litert.OpResolverType.BUILTIN_REF,
}


def random_inputs(details, seed=0):
    rng = np.random.default_rng(seed)
    arrays = []
    for d in details:
        shape, dtype = tuple(int(s) for s in d["shape"]), np.dtype(d["dtype"])
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            arrays.append(rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True))
        elif dtype == np.bool_:
            arrays.append(rng.integers(0, 2, size=shape).astype(np.bool_))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


def direct_run(data, kernels, inputs):
    interp = litert.Interpreter(model_content=data, experimental_op_resolver_type=RESOLVERS[kernels])
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


@pytest.fixture(scope="module")
def backend():
    return backends.get_backend("litert")


def test_shared_models_are_there(models_dir):
    # Guards the parametrization below against silently testing nothing.
    assert len(PLAIN_MODELS) >= 10, PLAIN_MODELS


@pytest.mark.parametrize("kernels", ["optimized", "reference"])
@pytest.mark.parametrize("name", model_params(PLAIN_MODELS))
def test_bit_identical_to_direct_litert(backend, name, kernels):
    data = shared_model(name).read_bytes()
    program = backend.load(data, kernels=kernels)
    inputs = random_inputs(program.input_details, seed=1234)
    got = program.run(inputs)
    want = direct_run(data, kernels, inputs)
    assert len(got) == len(want) == len(program.output_details) >= 1
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, i
        assert np.array_equal(g, w), f"output {i} differs from the direct interpreter"


def test_details_are_the_interpreters(backend):
    data = shared_model("split_concat.tflite").read_bytes()
    program = backend.load(data)
    interp = litert.Interpreter(model_content=data)
    names = [d["name"] for d in interp.get_input_details()]
    assert [d["name"] for d in program.input_details] == names == ["input1", "inputs/rnn1", "inputs/rnn2"]
    assert len(program.output_details) == 5
    assert {"index", "shape", "shape_signature", "dtype", "quantization_parameters"} <= set(
        program.input_details[0]
    )


@pytest.mark.parametrize("kernels", ["optimized", "reference"])
@pytest.mark.parametrize(
    "name, op",
    [
        ("custom_sinh.tflite", "Sinh"),
        ("invalid/model_invoking_error.tflite", "fake-op-double"),
        ("edgetpu/split_concat_edgetpu.tflite", "edgetpu-custom-op"),
    ],
)
def test_unresolved_custom_op(backend, name, op, kernels):
    with pytest.raises(UnsupportedOperatorError) as info:
        backend.load(shared_model(name).read_bytes(), kernels=kernels)
    err = info.value
    assert err.op_name == op
    assert err.where == "operator 0"
    assert f"'{op}'" in str(err) and "Encountered unresolved custom op" in str(err)
    assert "See instructions" not in str(err)
    assert isinstance(err, ModelError) and isinstance(err, ValueError)
    assert isinstance(err.__cause__, RuntimeError)


def test_builtin_version_too_new(backend):
    schema = pytest.importorskip("ai_edge_litert.schema_py_generated")
    flatbuffers = pytest.importorskip("flatbuffers")
    buf = shared_model("add_float.tflite").read_bytes()
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(buf, 0))
    for code in model.operatorCodes:
        code.version = 99
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    with pytest.raises(UnsupportedOperatorError) as info:
        backend.load(bytes(builder.Output()))
    assert info.value.op_name == "ADD"
    assert "version 99" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


@pytest.mark.parametrize("name", ["invalid/broken_model.tflite", "invalid/not_a_model.bin"])
def test_invalid_model(backend, name):
    with pytest.raises(ModelError) as info:
        backend.load(shared_model(name).read_bytes())
    assert str(info.value).startswith("the CPU backend rejected the model: ")
    assert "not a valid Flatbuffer" in str(info.value)
    assert not isinstance(info.value, UnsupportedOperatorError)
    assert info.value.__cause__ is not None


def test_empty_bytes(backend):
    with pytest.raises(ModelError, match="^the CPU backend rejected the model: .*empty"):
        backend.load(b"")


def test_model_without_tensors_runs(backend):
    program = backend.load(shared_model("invalid/empty_model.tflite").read_bytes())
    assert program.input_details == [] and program.output_details == []
    assert program.run([]) == []


def test_accepts_bytes_like(backend):
    data = shared_model("add_float.tflite").read_bytes()
    program = backend.load(memoryview(bytearray(data)))
    x = random_inputs(program.input_details)
    assert np.array_equal(program.run(x)[0], direct_run(data, "optimized", x)[0])


def test_outputs_are_copies(backend):
    program = backend.load(shared_model("add_quantized_uint8.tflite").read_bytes())
    x = random_inputs(program.input_details)
    first = program.run(x)[0]
    keep = first.copy()
    first[...] = 0
    second = program.run(x)[0]
    assert np.array_equal(second, keep) and not np.shares_memory(first, second)


def test_run_rejects_wrong_inputs(backend):
    program = backend.load(shared_model("split_concat.tflite").read_bytes())
    x = random_inputs(program.input_details)
    with pytest.raises(InputError, match="3 input"):
        program.run(x[:2])
    with pytest.raises(InputError, match="rejected the inputs"):
        program.run([x[0], x[0], x[2]])
    # Still usable afterwards.
    assert len(program.run(x)) == 5


def test_resize_dynamic_batch(backend):
    program = backend.load(shared_model("hello_world_int8.tflite").read_bytes())
    assert tuple(program.input_details[0]["shape_signature"]) == (-1, 1)
    batch = random_inputs([{"shape": (4, 1), "dtype": np.int8}], seed=7)[0]
    singles = [program.run([batch[i : i + 1]])[0] for i in range(4)]
    program.resize_inputs([(4, 1)])
    assert tuple(program.input_details[0]["shape"]) == (4, 1)
    assert tuple(program.output_details[0]["shape"]) == (4, 1)
    out = program.run([batch])[0]
    assert np.array_equal(out, np.concatenate(singles))
    program.resize_inputs([(4, 1)])  # same shape: no-op


def test_resize_rejects_fixed_dims(backend):
    program = backend.load(shared_model("hello_world_int8.tflite").read_bytes())
    x = random_inputs(program.input_details)
    before = program.run(x)
    for bad in ([(4, 2)], [(4, 1, 1)], [(1, 1), (1, 1)]):
        with pytest.raises(InputError):
            program.resize_inputs(bad)
    assert tuple(program.input_details[0]["shape"]) == (1, 1)
    assert np.array_equal(program.run(x)[0], before[0])


def test_concurrent_runs_match_sequential(backend):
    program = backend.load(shared_model("mobilenet_v1_0.25_128_quant.tflite").read_bytes())
    feeds = [random_inputs(program.input_details, seed=s) for s in range(4 * 6)]
    expected = [program.run(f)[0] for f in feeds]
    assert len({e.tobytes() for e in expected}) > 1  # distinct inputs give distinct outputs
    results = [None] * len(feeds)
    errors = []
    barrier = threading.Barrier(4)

    def worker(t):
        try:
            barrier.wait()
            for i in range(t, len(feeds), 4):
                results[i] = program.run(feeds[i])[0]
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    for i, (got, want) in enumerate(zip(results, expected)):
        assert got is not None and np.array_equal(got, want), i


def test_get_backend_default_and_unknown():
    assert isinstance(backends.get_backend(), LiteRTBackend)
    assert backends.get_backend() is backends.get_backend("litert")
    assert "litert" in backends.available_backends()
    assert backends.backend_names() == ["litert", "tflite_runtime", "numpy"]
    with pytest.raises(ConfigError) as info:
        backends.get_backend("nope")
    assert isinstance(info.value, ValueError)
    assert "'nope'" in str(info.value)
    assert "litert" in str(info.value) and "tflite_runtime" in str(info.value)


def test_no_backend_installed(monkeypatch):
    class Missing(LiteRTBackend):
        name = "missing"
        _module = "coralrt_no_such_interpreter.interpreter"
        _package = "coralrt-no-such-interpreter"

    monkeypatch.setattr(backends, "_REGISTRY", {"missing": Missing})
    monkeypatch.setattr(backends, "_instances", {})
    with pytest.raises(BackendUnavailableError, match="pip install ai-edge-litert") as info:
        backends.get_backend()
    assert isinstance(info.value, ImportError)
    assert backends.available_backends() == []


def test_tflite_runtime_backend_reports_why_unusable():
    if "tflite_runtime" in backends.available_backends():
        pytest.skip("tflite_runtime is installed and usable here")
    with pytest.raises(BackendUnavailableError, match="tflite"):
        backends.get_backend("tflite_runtime")


def test_bad_options(backend):
    data = shared_model("add_float.tflite").read_bytes()
    with pytest.raises(ConfigError, match="optimized, reference"):
        backend.load(data, kernels="fast")
    with pytest.raises(ConfigError, match="num_threads"):
        backend.load(data, num_threads=0)
    assert len(backend.load(data, num_threads=1).run(random_inputs(backend.load(data).input_details))) == 1


def test_translate_stages():
    exc = RuntimeError("Node number 3 (CONV_2D) failed to invoke.")
    err = _translate(exc, "invoke")
    assert isinstance(err, InferenceError) and "failed to invoke" in str(err)
    err = _translate(RuntimeError("tensor too big"), "allocate")
    assert isinstance(err, ModelError) and str(err).startswith("the CPU backend rejected the model: ")
    assert isinstance(_translate(ValueError("Dimension mismatch"), "set_input"), InputError)


def test_importing_coralrt_backends_does_not_import_litert():
    code = "import sys, coralrt._backends; assert 'ai_edge_litert' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_model_only_the_xnnpack_delegate_refuses_runs_without_it(caplog):
    # A uint8 RESIZE_BILINEAR whose output is quantized differently from its
    # input (as in an older DeepLab file of Coral's test data): the XNNPACK
    # delegate of LiteRT's default kernels refuses to prepare it, TFLite's
    # builtin kernels run it.
    import logging

    from coralrt import InferenceSession
    from coralrt.testing import ModelBuilder
    from tests.conftest import run_litert

    b = ModelBuilder()
    x = b.input("x", (1, 1, 1, 8), np.uint8, scale=0.0123, zero_point=0)
    y = b.tensor("y", (1, 5, 5, 8), np.uint8, scale=0.029, zero_point=0)
    b.op("RESIZE_BILINEAR", [x, b.constant("size", np.array([5, 5], np.int32))], [y],
         align_corners=True)
    b.output(y)
    data = b.build().to_bytes()
    feeds = [np.arange(8, dtype=np.uint8).reshape(1, 1, 1, 8) * 30]
    with pytest.raises(RuntimeError, match="TfLiteXNNPackDelegate"):
        run_litert(data, feeds)                      # LiteRT's defaults refuse it
    with caplog.at_level(logging.INFO, logger="coralrt.backends"):
        got = InferenceSession(data, target="cpu").run(feeds)["y"]
    np.testing.assert_array_equal(got, run_litert(data, feeds, kernels="builtin")[0])
    assert any("without it" in r.getMessage() for r in caplog.records)
