"""CPU overhead of InferenceSession against the bare LiteRT interpreter.

Same model, same input, one thread, same kernels (the interpreter's default
resolver) in the same pytest run; the conftest prints the ratio of medians.
Run with ``python -m pytest tests/bench --benchmark-only``.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_model

from coralrt import InferenceSession

pytestmark = pytest.mark.bench

BENCH_MODEL = "mobilenet_v2_1.0_224_quant.tflite"
GROUP = "mobilenet_v2_1.0_224_quant cpu 1 thread"
ROUNDS, WARMUP = 100, 5


@pytest.fixture(scope="module")
def model_path():
    # Skips with the reason when shared/models is absent.
    return shared_model(BENCH_MODEL)


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(0).integers(0, 256, size=(1, 224, 224, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def reference(model_path, image):
    from ai_edge_litert.interpreter import Interpreter
    interp = Interpreter(model_path=str(model_path), num_threads=1)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], image)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


@pytest.mark.benchmark(group=GROUP)
def test_litert_interpreter(benchmark, record_median, model_path, image, reference):
    from ai_edge_litert.interpreter import Interpreter
    interp = Interpreter(model_path=str(model_path), num_threads=1)
    interp.allocate_tensors()
    in_idx = interp.get_input_details()[0]["index"]
    out_idx = interp.get_output_details()[0]["index"]
    set_tensor, invoke, get_tensor = interp.set_tensor, interp.invoke, interp.get_tensor

    def run():
        set_tensor(in_idx, image)
        invoke()
        return get_tensor(out_idx)

    out = benchmark.pedantic(run, rounds=ROUNDS, warmup_rounds=WARMUP, iterations=1)
    record_median("litert", benchmark)
    np.testing.assert_array_equal(out, reference)


@pytest.mark.benchmark(group=GROUP)
def test_inference_session(benchmark, record_median, model_path, image, reference):
    sess = InferenceSession(model_path, target="cpu", num_threads=1)
    name = sess.get_outputs()[0].name
    out = benchmark.pedantic(sess.run, args=(image,), rounds=ROUNDS, warmup_rounds=WARMUP,
                             iterations=1)
    record_median("session", benchmark)
    # The overhead figure only means something if both compute the same thing.
    np.testing.assert_array_equal(out[name], reference)
