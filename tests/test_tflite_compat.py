"""coralrt.tflite against LiteRT's interpreter (the same API as tflite_runtime's)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import MODELS_DIR, random_inputs, shared_model, shared_model_names
from coralrt import InferenceSession
from coralrt.errors import ConfigError, InputError, ModelError
from coralrt import load_model
import coralrt.tflite as tflite
from coralrt.tflite import EdgeTpuDelegate, Interpreter, load_delegate

litert = pytest.importorskip("ai_edge_litert.interpreter")

PLAIN = shared_model_names(compiled=False)


def both(name: str, **kw):
    path = shared_model(name)
    try:
        ours = Interpreter(model_path=str(path), **kw)
    except ModelError as e:        # operators coralrt cannot run without a plugin
        pytest.skip(f"coralrt does not load {name}: {e}")
    return ours, litert.Interpreter(model_path=str(path))


def assert_details_equal(ours: dict, theirs: dict) -> None:
    assert list(ours) == list(theirs)
    for key, want in theirs.items():
        got = ours[key]
        assert type(got) is type(want), key
        if isinstance(want, np.ndarray):
            assert got.dtype == want.dtype and np.array_equal(got, want), key
        elif isinstance(want, dict):
            assert_details_equal(got, want)
        elif isinstance(want, tuple):
            assert [type(v) for v in got] == [type(v) for v in want], key
            assert got == want, key
        else:
            assert got == want, key


@pytest.mark.parametrize("name", PLAIN)
def test_details_equal_litert(name):
    ours, theirs = both(name)
    for got, want in [(ours.get_input_details(), theirs.get_input_details()),
                      (ours.get_output_details(), theirs.get_output_details()),
                      (ours.get_tensor_details(), theirs.get_tensor_details())]:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_details_equal(g, w)
    assert ours.get_signature_list() == theirs.get_signature_list()
    assert ours.num_subgraphs() == theirs.num_subgraphs()


@pytest.mark.parametrize("name", PLAIN)
def test_outputs_equal_litert_on_cpu(name):
    ours, theirs = both(name)
    assert ours.session.target == "cpu"
    for it in (ours, theirs):
        it.allocate_tensors()
    infos = ours.session.get_inputs()
    for d, value in zip(ours.get_input_details(), random_inputs(infos, seed=3)):
        ours.set_tensor(d["index"], value)
        theirs.set_tensor(d["index"], value)
    ours.invoke()
    theirs.invoke()
    for d in theirs.get_output_details():
        got = ours.get_tensor(d["index"])
        want = theirs.get_tensor(d["index"])
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_tensor_views():
    it = Interpreter(model_path=str(shared_model("add_float.tflite")))
    it.allocate_tensors()
    i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    view = it.tensor(i)
    view()[0] = 1.5                        # pycoral's input_tensor(...)[:] = x style
    assert view().flags.writeable and np.all(it.get_tensor(i) == 1.5)
    out = it.tensor(o)
    it.invoke()
    want = it.get_tensor(o)
    assert np.array_equal(out(), want)
    copy = it.get_tensor(o)
    copy[...] = -7                         # get_tensor is a copy
    assert np.array_equal(it.get_tensor(o), want)
    view().fill(0.0)
    it.invoke()
    assert not np.array_equal(out(), want)


def test_errors_match_litert_types_and_texts():
    ours, theirs = both("add_float.tflite")
    for it in (ours, theirs):
        with pytest.raises(ValueError, match="Tensor data is null"):
            it.get_tensor(1)
        with pytest.raises(ValueError, match="Tensor is unallocated"):
            it.set_tensor(1, np.zeros((1, 8, 8, 3), np.float32))
        with pytest.raises(RuntimeError, match="not ready"):
            it.invoke()
        it.allocate_tensors()
        for bad in (1000, -1):
            with pytest.raises(ValueError, match=f"Invalid tensor index {bad} exceeds max "
                                                 f"tensor index 3"):
                it.get_tensor(bad)
        with pytest.raises(TypeError):
            it.get_tensor("1")
        with pytest.raises(ValueError):
            it.set_tensor(1, np.zeros((1, 8, 8, 3), np.float64))
        with pytest.raises(ValueError):
            it.set_tensor(1, np.zeros((7,), np.float32))
    # coralrt's own texts, and InputError is a ValueError
    with pytest.raises(InputError, match="input 'input' expects dtype float32, got float64"):
        ours.set_tensor(1, np.zeros((1, 8, 8, 3), np.float64))
    with pytest.raises(InputError, match=r"expects shape \[1, 8, 8, 3\], got \[7\]"):
        ours.set_tensor(1, np.zeros((7,), np.float32))
    with pytest.raises(ValueError, match="not an input or output .* intermediate"):
        ours.get_tensor(0)
    with pytest.raises(ValueError, match="not an input or output"):
        Interpreter(model_path=str(shared_model("add_float.tflite")),
                    experimental_preserve_all_tensors=True).tensor(0)()


def test_constructor_errors_match_litert():
    path = str(shared_model("add_float.tflite"))
    for cls in (Interpreter, litert.Interpreter):
        with pytest.raises(ValueError, match="Can't both provide"):
            cls(model_path=path, model_content=b"x")
        with pytest.raises(ValueError, match="must be specified"):
            cls()
        with pytest.raises(ValueError, match="num_threads should >= 1"):
            cls(model_path=path, num_threads=0)
        with pytest.raises(ValueError):
            cls(model_content=b"garbage" * 10)
    it = Interpreter(model_content=shared_model("add_float.tflite").read_bytes(), num_threads=2,
                     experimental_op_resolver_type=litert.OpResolverType.BUILTIN_REF,
                     experimental_disable_delegate_clustering=True)
    assert it.session.target == "cpu"
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        Interpreter(model_path=path, bogus=1)
    with pytest.raises(ValueError, match="only the Edge TPU delegate"):
        Interpreter(model_path=path, experimental_delegates=[object()])


def test_resize_dynamic_batch_like_litert():
    ours, theirs = both("hello_world_int8.tflite")
    x = np.arange(4, dtype=np.int8).reshape(4, 1)
    for it in (ours, theirs):
        i = it.get_input_details()[0]["index"]
        it.resize_tensor_input(i, [4, 1], strict=True)
        it.allocate_tensors()
        it.set_tensor(i, x)
    for got, want in [(ours.get_input_details(), theirs.get_input_details()),
                      (ours.get_output_details(), theirs.get_output_details())]:
        assert_details_equal(got[0], want[0])
    ours.invoke()
    theirs.invoke()
    o = theirs.get_output_details()[0]["index"]
    assert np.array_equal(ours.get_tensor(o), theirs.get_tensor(o))
    for it in (ours, theirs):
        with pytest.raises(RuntimeError, match="dimension 1"):
            it.resize_tensor_input(0, [4, 2], strict=True)
    with pytest.raises(ValueError, match="not an input"):
        ours.resize_tensor_input(9, [4, 1])
    ours.resize_tensor_input(0, [2, 1])
    with pytest.raises(RuntimeError, match="not ready"):    # until allocate_tensors()
        ours.invoke()


# -- delegates ---------------------------------------------------------------------------

@pytest.mark.parametrize("library", ["libedgetpu.so.1", "libedgetpu.so.1.0",
                                     "libedgetpu.1.dylib", "edgetpu.dll",
                                     "/usr/lib/x86_64-linux-gnu/libedgetpu.so.1"])
def test_load_delegate_accepts_libedgetpu(library, monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "sim")     # no stick here: the simulated ones
    d = load_delegate(library)
    assert isinstance(d, EdgeTpuDelegate) and d.device is None and d.library == library


@pytest.mark.parametrize("spec, device", [("usb", "usb:0"), ("usb:1", "usb:1"), (":0", ":0"),
                                          (":2", ":2"), ("", None)])
def test_delegate_device_strings(spec, device, monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "sim")
    assert load_delegate("libedgetpu.so.1", {"device": spec}).device == device


@pytest.mark.parametrize("library", ["libfoo.so", "libedgetpu.so", "libGLESv2.so",
                                     "/tmp/libedgetpu.so.1.x"])
def test_load_delegate_refuses_other_libraries(library):
    with pytest.raises(ValueError, match=rf"^Failed to load delegate from {library}\n"
                                         r"coralrt provides only the Edge TPU delegate"):
        load_delegate(library)


@pytest.mark.parametrize("spec", ["pci", "pci:0", "usb:x", "cuda"])
def test_delegate_refuses_pci_and_unknown_devices(spec):
    with pytest.raises(ValueError, match="Failed to load delegate from libedgetpu.so.1\n"
                                         "device '" + spec + "'"):
        load_delegate("libedgetpu.so.1", {"device": spec})


def test_delegate_on_sim_runs_through_the_simulated_edge_tpu(monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "sim")
    path = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    it = Interpreter(model_path=str(path),
                     experimental_delegates=[load_delegate("libedgetpu.so.1",
                                                           {"device": "usb:0"})])
    assert it.session.target == "sim"
    reference = litert.Interpreter(model_path=str(path))
    for got, want in [(it.get_input_details(), reference.get_input_details()),
                      (it.get_output_details(), reference.get_output_details())]:
        assert_details_equal(got[0], want[0])      # the file's indices, not the JIT's
    it.allocate_tensors()
    x = random_inputs(it.session.get_inputs(), seed=1)[0]
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    assert any(row["kind"] == "tpu" for row in it.session.profile())
    with InferenceSession(path, target="sim") as sess:
        want = list(sess.run([x]).values())[0]
    assert np.array_equal(it.get_tensor(it.get_output_details()[0]["index"]), want)
    it.close()


def test_without_delegate_the_target_is_cpu(monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "sim")
    it = Interpreter(model_path=str(shared_model("mobilenet_v1_0.25_128_quant.tflite")))
    assert it.session.target == "cpu"


def test_compiled_model_with_delegate_on_sim_is_refused(monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "sim")
    path = shared_model("edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite")
    with pytest.raises(ModelError, match="Coral"):
        Interpreter(model_path=str(path), experimental_delegates=[load_delegate("edgetpu.dll")])


def test_bad_target_variable_is_a_config_error(monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "gpu")
    with pytest.raises(ConfigError, match="CORALRT_TARGET='gpu'"):
        Interpreter(model_path=str(shared_model("add_float.tflite")),
                    experimental_delegates=[load_delegate("libedgetpu.so.1")])


# -- signatures --------------------------------------------------------------------------

def test_signature_runners_equal_litert():
    ours, theirs = both("multi_signatures.tflite")
    assert ours.get_signature_list() == theirs.get_signature_list()
    x = np.array([1.0, 2.0, 5.0], np.float32)
    for key in ("add", "sub"):
        mine, ref = ours.get_signature_runner(key), theirs.get_signature_runner(key)
        got, want = mine(x=x), ref(x=x)
        assert list(got) == list(want)
        assert all(np.array_equal(got[k], want[k]) for k in want)
        for g, w in [(mine.get_input_details(), ref.get_input_details()),
                     (mine.get_output_details(), ref.get_output_details())]:
            assert list(g) == list(w)
            for k in w:
                assert_details_equal(g[k], w[k])
    for it in (ours, theirs):
        with pytest.raises(ValueError, match="model has 2 Signatures"):
            it.get_signature_runner()
        with pytest.raises(ValueError, match='Invalid signature_key provided: "mul"'):
            it.get_signature_runner("mul")
        runner = it.get_signature_runner("add")
        with pytest.raises(ValueError, match=r"Invalid Input name \(y\)"):
            runner(y=x)
        with pytest.raises(ValueError, match="expected 1 vs provided 0"):
            runner()


def test_signature_runner_default_key_and_no_signatures():
    ours, _ = both("add_float.tflite")
    assert set(ours.get_signature_runner()(a=np.zeros((1, 8, 8, 3), np.float32))) == {"x"}
    plain, theirs = both("split_concat.tflite")
    for it in (plain, theirs):
        with pytest.raises(ValueError, match="model has 0 Signatures"):
            it.get_signature_runner()


def test_module_layout_and_version():
    import coralrt
    import coralrt.tflite.interpreter as mod
    assert tflite.__version__ == coralrt.__version__
    assert mod.Interpreter is Interpreter and mod.load_delegate is load_delegate
    assert MODELS_DIR is not None and load_model is not None


def test_set_tensor_on_an_output_checks_dtype_and_shape():
    it = Interpreter(model_path=str(shared_model("add_float.tflite")))
    it.allocate_tensors()
    it.set_tensor(2, np.ones((1, 8, 8, 3), np.float32))     # allowed, as in LiteRT
    assert np.all(it.get_tensor(2) == 1)
    with pytest.raises(ValueError, match=r"output 'output' takes a float32 array of shape"):
        it.set_tensor(2, np.ones((1, 8, 8, 3), np.float64))


def test_a_missing_model_file_is_reported_in_tflite_runtimes_words(tmp_path):
    # Programs match on "Could not open" (tflite_runtime's message; LiteRT's
    # starts the same way), not on coralrt's "model file not found".
    from coralrt.tflite import Interpreter
    missing = tmp_path / "x.tflite"
    with pytest.raises(ValueError, match=r"^Could not open '.*x\.tflite'\.$"):
        Interpreter(model_path=str(missing))
    with pytest.raises(ValueError, match=r"^Could not open "):
        Interpreter(model_path=missing)
    try:
        from ai_edge_litert.interpreter import Interpreter as LiteRT
    except ImportError:
        return
    with pytest.raises(ValueError, match=rf"^Could not open '{missing}'\."):
        LiteRT(model_path=str(missing))
