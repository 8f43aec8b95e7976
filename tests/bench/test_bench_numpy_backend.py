"""The NumPy CPU backend against LiteRT's default kernels, one thread each.

Both run through ``InferenceSession(target="cpu")`` on the same input in the
same pytest run; the conftest prints ``numpy / litert`` per model.  The NumPy
backend's outputs must equal LiteRT's reference kernels' (``BUILTIN_REF``) bit
for bit: the ratio means nothing if the two compute different things.  (LiteRT's
default kernels may differ from the reference ones by a few LSB, 6 on the TF2
int8 MobileNet v2, so they are not the yardstick.)
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
from conftest import random_inputs, run_litert, shared_model

from coralrt import InferenceSession

pytestmark = pytest.mark.bench

#: key -> shared model; the keys are the ones tests/bench/conftest.py reports.
MODELS = {"mobilenet_v2": "mobilenet_v2_1.0_224_quant.tflite",
          "mobilenet_v2_int8_tf2": "tf2_mobilenet_v2_1.0_224_ptq.tflite",
          "deeplabv3": "deeplabv3_mnv2_dm05_pascal_quant.tflite",
          "ssd_head": "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite"}
ROUNDS = {"mobilenet_v2": 30, "mobilenet_v2_int8_tf2": 30, "deeplabv3": 8, "ssd_head": 100}
WARMUP = 3


@pytest.fixture(scope="module", params=list(MODELS))
def case(request):
    path = shared_model(MODELS[request.param])
    litert = InferenceSession(path, target="cpu", backend="litert", num_threads=1)
    numpy = InferenceSession(path, target="cpu", backend="numpy", num_threads=1)
    feed = dict(zip([i.name for i in litert.get_inputs()],
                    random_inputs(litert.get_inputs(), seed=0)))
    want = run_litert(path.read_bytes(), list(feed.values()), kernels="reference")
    return request.param, litert, numpy, feed, want


@pytest.mark.parametrize("backend", ["litert", "numpy"])
def test_numpy_backend_vs_litert(benchmark, record_median, case, backend):
    key, litert, numpy, feed, want = case
    sess = litert if backend == "litert" else numpy
    benchmark.group = f"{key} cpu 1 thread: numpy backend vs LiteRT"
    out = benchmark.pedantic(sess.run, args=(feed,), rounds=ROUNDS[key],
                             warmup_rounds=WARMUP, iterations=1)
    record_median(f"{backend} backend {key}", benchmark)
    if backend == "numpy":
        for (name, value), ref in zip(out.items(), want):
            np.testing.assert_array_equal(value, ref, err_msg=f"{key}: {name}")


#: Models whose NumPy backend is compared with the simulator, run by run.
SIM_MODELS = ("mobilenet_v2", "mobilenet_v2_int8_tf2", "deeplabv3")


@pytest.mark.parametrize("key", SIM_MODELS)
def test_numpy_backend_vs_sim_interleaved(benchmark, record_value, key):
    path = shared_model(MODELS[key])
    numpy = InferenceSession(path, target="cpu", backend="numpy", num_threads=1)
    sim = InferenceSession(path, target="sim", num_threads=1)
    feed = dict(zip([i.name for i in numpy.get_inputs()],
                    random_inputs(numpy.get_inputs(), seed=0)))
    for _ in range(WARMUP):
        numpy.run(feed)
        sim.run(feed)
    sim_times: list[float] = []

    def setup():   # untimed by pytest-benchmark: the simulator's half of each round
        t0 = time.perf_counter()
        sim.run(feed)
        sim_times.append(time.perf_counter() - t0)
        return (feed,), {}

    benchmark.group = f"{key} 1 thread: numpy backend vs sim, interleaved"
    # At least 20 rounds: a ratio near 1 needs more than DeepLab's 8.
    out = benchmark.pedantic(numpy.run, setup=setup, rounds=max(ROUNDS[key], 20),
                             iterations=1, warmup_rounds=0)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:
        record_value(f"interleaved numpy {key}", stats.stats.median)
        record_value(f"interleaved numpy-vs-sim sim {key}", statistics.median(sim_times))
    want = sim.run(feed)
    for name, value in out.items():
        np.testing.assert_array_equal(value, want[name], err_msg=f"{key}: {name}")

