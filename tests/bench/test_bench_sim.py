"""Simulated Edge TPU speed: MobileNet v2 on target="sim" against LiteRT's
reference kernels (BUILTIN_REF, the semantics it reproduces; goal: faster)
and LiteRT's default kernels, in the same run.  The conftest prints the
ratios and the latency the simulator estimates for a real USB stick."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_model

from coralrt import InferenceSession

pytestmark = pytest.mark.bench

BENCH_MODEL = "mobilenet_v2_1.0_224_quant.tflite"
GROUP = "mobilenet_v2_1.0_224_quant sim vs LiteRT"
ROUNDS = 20


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(0).integers(0, 256, size=(1, 224, 224, 3), dtype=np.uint8)


def _litert(kernels: str):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    resolver = OpResolverType.BUILTIN_REF if kernels == "reference" else OpResolverType.AUTO
    interp = Interpreter(model_path=str(shared_model(BENCH_MODEL)), num_threads=1,
                         experimental_op_resolver_type=resolver)
    interp.allocate_tensors()
    i, o = interp.get_input_details()[0]["index"], interp.get_output_details()[0]["index"]

    def run(x):
        interp.set_tensor(i, x)
        interp.invoke()
        return interp.get_tensor(o)
    return run


@pytest.fixture(scope="module")
def reference_output(image):
    return _litert("reference")(image)


@pytest.mark.benchmark(group=GROUP)
def test_litert_reference_kernels(benchmark, record_median, image, reference_output):
    out = benchmark.pedantic(_litert("reference"), args=(image,), rounds=5, iterations=1,
                             warmup_rounds=1)
    record_median("litert_reference", benchmark)
    np.testing.assert_array_equal(out, reference_output)


@pytest.mark.benchmark(group=GROUP)
def test_litert_default_kernels(benchmark, record_median, image):
    benchmark.pedantic(_litert("optimized"), args=(image,), rounds=ROUNDS, iterations=1,
                       warmup_rounds=2)
    record_median("litert_default", benchmark)


@pytest.mark.benchmark(group=GROUP)
def test_sim_session(benchmark, record_median, record_value, image, reference_output):
    sess = InferenceSession(shared_model(BENCH_MODEL), target="sim", num_threads=1)
    name = sess.get_outputs()[0].name
    out = benchmark.pedantic(sess.run, args=(image,), rounds=ROUNDS, iterations=1,
                             warmup_rounds=2)
    record_median("sim", benchmark)
    np.testing.assert_array_equal(out[name], reference_output)  # same semantics, bit-exact
    device = sum(s["device_seconds"] for s in sess.profile() if s["kind"] == "tpu")
    record_value("sim estimated Coral USB 3 latency", device)
