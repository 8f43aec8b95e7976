"""The built-in demo model: deterministic, valid for LiteRT, and a real classifier."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
Interpreter = pytest.importorskip("ai_edge_litert.interpreter",
                                  reason="ai-edge-litert is not installed").Interpreter

from coralrt import InferenceSession, load_model
from coralrt._cli.demo_model import DEMO_CLASSES, INPUT_SHAPE, build_demo_model, demo_input


def litert_run(model_bytes: bytes, x: np.ndarray, reference: bool = False) -> np.ndarray:
    from ai_edge_litert.interpreter import OpResolverType
    kw = {"experimental_op_resolver_type": OpResolverType.BUILTIN_REF} if reference else {}
    interp = Interpreter(model_content=model_bytes, **kw)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


@pytest.fixture(scope="module")
def demo_bytes() -> bytes:
    return build_demo_model().to_bytes()


def test_bytes_identical_on_every_call(demo_bytes):
    again = build_demo_model().to_bytes()
    assert hashlib.sha256(again).hexdigest() == hashlib.sha256(demo_bytes).hexdigest()


def test_weights_and_quantization_are_pinned():
    # Independent of the writer's layout: only the seeded Generator streams,
    # the calibration and the quantization decide these bytes.  A change here
    # means the demo model changed for every user (new numpy RNG stream?).
    h = hashlib.sha256()
    for t in build_demo_model().main.tensors:
        if t.is_constant:
            h.update(t.name.encode())
            h.update(t.buffer.data.tobytes())
        if t.quantization is not None:
            h.update(t.quantization.scale.tobytes())
            h.update(t.quantization.zero_point.tobytes())
    assert h.hexdigest() == "03f60da021f1600ef872320656ed2f11ad2d91de5415f82d7d1f124ff8fa4a3d"


def test_demo_input_is_deterministic_and_varied():
    a, b = demo_input(), demo_input()
    assert a.shape == INPUT_SHAPE and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    # An image, not a constant: the model needs something to classify.
    assert a.std() > 30
    assert not np.array_equal(demo_input(1), a)


def test_structure():
    model = build_demo_model()
    sg = model.main
    assert [op.name for op in sg.operators] == [
        "CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D", "AVERAGE_POOL_2D", "RESHAPE",
        "FULLY_CONNECTED", "SOFTMAX"]
    x, y = sg.tensors[sg.inputs[0]], sg.tensors[sg.outputs[0]]
    assert x.shape == INPUT_SHAPE and x.dtype == np.uint8
    assert y.shape == (1, DEMO_CLASSES) and y.dtype == np.uint8
    # TFLite's uint8 softmax only accepts this output quantization.
    assert y.quantization.params == (1.0 / 256.0, 0)
    for op in sg.operators:
        if op.name in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
            inp, w, b = (sg.tensors[i] for i in op.inputs)
            assert w.dtype == np.uint8 and b.dtype == np.int32
            expected = inp.quantization.params[0] * w.quantization.params[0]
            assert b.quantization.params[0] == pytest.approx(expected, rel=1e-6)
    assert not model.is_edgetpu_compiled


def test_litert_runs_it_and_output_is_not_degenerate(demo_bytes):
    probs = litert_run(demo_bytes, demo_input()).reshape(-1)
    assert probs.dtype == np.uint8 and probs.size == DEMO_CLASSES
    # A softmax: the dequantized probabilities sum to about 1.
    assert abs(probs.sum() / 256.0 - 1.0) < 0.05
    assert len(set(probs.tolist())) > 2
    assert probs.max() < 250  # not a one-hot output either


def test_different_images_get_different_answers(demo_bytes):
    winners = {int(np.argmax(litert_run(demo_bytes, demo_input(v)))) for v in range(8)}
    assert len(winners) >= 2


def test_optimized_and_reference_kernels_agree(demo_bytes):
    x = demo_input()
    a = litert_run(demo_bytes, x).astype(int)
    b = litert_run(demo_bytes, x, reference=True).astype(int)
    assert np.abs(a - b).max() <= 2


def test_writer_round_trip_keeps_outputs(demo_bytes):
    rewritten = load_model(demo_bytes).to_bytes()
    for v in range(3):
        x = demo_input(v)
        np.testing.assert_array_equal(litert_run(rewritten, x), litert_run(demo_bytes, x))


def test_session_runs_the_model_object():
    sess = InferenceSession(build_demo_model(), target="cpu")
    out = sess.run(demo_input())["probabilities"]
    np.testing.assert_array_equal(out, litert_run(build_demo_model().to_bytes(), demo_input()))
