"""Simulated Edge TPU speed against LiteRT.

1. MobileNet v2 on target="sim" against LiteRT's reference kernels
   (BUILTIN_REF, the semantics it reproduces; goal: faster) and LiteRT's
   default kernels, as separate benchmarks in the same run (keys "sim",
   "litert_reference", "litert_default"), plus the latency the simulator
   estimates for a real USB stick.

2. Interleaved sim / LiteRT default kernels (one thread each) per model: one
   LiteRT invoke, one sim run, one LiteRT invoke, ... on the same inputs, so
   both medians see the same machine load.  The sim side runs under
   pytest-benchmark (the LiteRT invoke is its untimed ``setup``, timed here
   with ``time.perf_counter``).  The conftest prints each ratio with its goal
   (tests/bench/conftest.py INTERLEAVED_GOALS); every model's sim output must
   also equal LiteRT BUILTIN_REF's bit for bit.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
from conftest import random_inputs, shared_model

from coralrt import InferenceSession
from support.int8_models import int8_per_channel_from_uint8

pytestmark = pytest.mark.bench

BENCH_MODEL = "mobilenet_v2_1.0_224_quant.tflite"
GROUP = "mobilenet_v2_1.0_224_quant sim vs LiteRT"
ROUNDS = 20


@pytest.fixture(scope="module")
def image():
    return np.random.default_rng(0).integers(0, 256, size=(1, 224, 224, 3), dtype=np.uint8)


def _interpreter(model, kernels: str = "optimized"):
    """A one-thread LiteRT Interpreter for a path or model bytes, tensors allocated."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    resolver = OpResolverType.BUILTIN_REF if kernels == "reference" else OpResolverType.AUTO
    source = ({"model_content": bytes(model)} if isinstance(model, (bytes, bytearray))
              else {"model_path": str(model)})
    interp = Interpreter(**source, num_threads=1, experimental_op_resolver_type=resolver)
    interp.allocate_tensors()
    return interp


def _litert(kernels: str):
    interp = _interpreter(shared_model(BENCH_MODEL), kernels)
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


# -- interleaved sim / LiteRT default kernels ---------------------------------

# (key in conftest INTERLEAVED_GOALS, shared model, rounds)
INTERLEAVED = [
    ("mobilenet_v2_uint8", "mobilenet_v2_1.0_224_quant.tflite", 20),
    ("mobilenet_v2_int8_per_channel", "mobilenet_v2_1.0_224_quant.tflite", 20),
    # Made by TensorFlow 2's converter (float in and out, int8 per-channel inside).
    ("mobilenet_v2_int8_tf2", "tf2_mobilenet_v2_1.0_224_ptq.tflite", 20),
    ("deeplabv3_mnv2_dm05", "deeplabv3_mnv2_dm05_pascal_quant.tflite", 6),
    ("keras_lstm_mnist", "keras_lstm_mnist_ptq.tflite", 40),
    ("ssd_mobilenet_v1_head", "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite", 40),
]
WARMUP = 2


def _model_bytes(key: str, name: str) -> bytes:
    data = shared_model(name).read_bytes()
    if key.endswith("_int8_per_channel"):
        # TF2's full-integer layout: float in -> QUANTIZE -> int8 per-channel -> DEQUANTIZE.
        data = int8_per_channel_from_uint8(data)
    return data


def _feeds(sess, interp) -> dict:
    """Deterministic random inputs by input name.

    Float inputs (the int8 model's, ahead of its QUANTIZE) are drawn from that
    QUANTIZE's grid: exact int8 values, never a rounding tie, where LiteRT's
    optimized QUANTIZE (on the CPU side of the session) rounds half to even
    and BUILTIN_REF half away from zero (see tests/test_int8_models.py).
    """
    infos = sess.get_inputs()
    feeds = dict(zip([t.name for t in infos], random_inputs(infos, seed=5)))
    by_name = {d["name"]: d for d in interp.get_input_details()}
    rng = np.random.default_rng(6)
    for t in infos:
        if np.dtype(t.dtype).kind == "f":
            quantize = _consumer_quantization(interp, by_name[t.name]["index"])
            if quantize is None:
                continue
            scale, zero_point = quantize
            q = rng.integers(-128, 127, t.shape, endpoint=True)
            feeds[t.name] = ((q - zero_point) * scale).astype(np.float32)
    return feeds


def _consumer_quantization(interp, tensor_index: int):
    """(scale, zero point) of the QUANTIZE output that reads ``tensor_index``, or None."""
    for op in interp._get_ops_details():
        if op["op_name"] == "QUANTIZE" and list(op["inputs"]) == [tensor_index]:
            scale, zero_point = interp._get_tensor_details(op["outputs"][0], 0)["quantization"]
            return scale, zero_point
    return None


def _litert_outputs(interp, feeds: dict) -> dict:
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], feeds[d["name"]])
    interp.invoke()
    return {d["name"]: interp.get_tensor(d["index"]) for d in interp.get_output_details()}


@pytest.mark.parametrize("key, name, rounds", [pytest.param(*m, id=m[0]) for m in INTERLEAVED])
def test_interleaved_sim_vs_litert(benchmark, record_value, key, name, rounds):
    benchmark.group = f"interleaved {key}"
    data = _model_bytes(key, name)
    interp = _interpreter(data)
    sess = InferenceSession(data, target="sim", num_threads=1)
    feeds = _feeds(sess, interp)
    in_details = interp.get_input_details()
    litert_feeds = [(d["index"], feeds[d["name"]]) for d in in_details]

    def litert_invoke():
        for index, value in litert_feeds:
            interp.set_tensor(index, value)
        interp.invoke()

    for _ in range(WARMUP):
        litert_invoke()
        sess.run(feeds)

    litert_times: list[float] = []

    def setup():   # untimed by pytest-benchmark: the LiteRT half of each round
        t0 = time.perf_counter()
        litert_invoke()
        litert_times.append(time.perf_counter() - t0)
        return (feeds,), {}

    benchmark.pedantic(sess.run, setup=setup, rounds=rounds, iterations=1,
                             warmup_rounds=0)
    stats = getattr(benchmark, "stats", None)
    if stats is not None:   # None with --benchmark-disable: one untimed call
        record_value(f"interleaved {key} sim", stats.stats.median)
        record_value(f"interleaved {key} litert", statistics.median(litert_times))

    # Same semantics as LiteRT's reference kernels, bit for bit, on every output.
    # Fresh session and interpreter: variable tensors (the LSTM's state) carry
    # over from one invoke to the next in both, so the timed session's last
    # output is not a first invoke's.
    out = InferenceSession(data, target="sim", num_threads=1).run(feeds)
    want = _litert_outputs(_interpreter(data, "reference"), feeds)
    assert sorted(out) == sorted(want)
    for out_name, value in want.items():
        np.testing.assert_array_equal(out[out_name], value, err_msg=f"{key}: {out_name}")
