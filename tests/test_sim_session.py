"""target="sim" end to end: JIT -> simulated Edge TPU + LiteRT CPU steps."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import model_params, random_inputs, run_litert, shared_model

from coralrt import InferenceSession
from coralrt._cli.main import main
from coralrt._formats.segment import build_segment
from coralrt.testing import ModelBuilder, simulated_stick, LatencyModel

# Every plain quantized model in the shared folder; the float ones (add_float,
# custom_sinh, multi_signatures) have nothing for the Edge TPU.
QUANTIZED = ["add_quantized_int8.tflite", "add_quantized_uint8.tflite",
             "deeplabv3_mnv2_dm05_pascal_quant.tflite", "hello_world_int8.tflite",
             "keras_lstm_mnist_ptq.tflite", "mobilenet_v1_0.25_128_quant.tflite",
             "mobilenet_v2_1.0_224_quant.tflite", "split_concat.tflite",
             "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite"]

# Documented tolerances (in units of the output's last bit), with the reason.
TOLERANCE = {
    # Softmax: TFLite's 8-bit reference softmax computes exp through a table
    # built in float at prepare time; see tests/kernels/test_activations.py.
}


@pytest.mark.parametrize("mode", ["compat", "multi"])
@pytest.mark.parametrize("name", model_params(QUANTIZED))
def test_sim_matches_litert_reference_kernels(name, mode):
    path = shared_model(name)
    sess = InferenceSession(path, target="sim", partition_mode=mode, cpu_kernels="reference")
    feeds = random_inputs(sess.get_inputs(), seed=21)
    want = run_litert(path.read_bytes(), feeds, kernels="reference")
    got = sess.run(feeds)
    lsb = TOLERANCE.get(name, 0)
    for w, (out_name, g) in zip(want, got.items()):
        assert g.shape == w.shape and g.dtype == w.dtype, out_name
        diff = np.abs(g.astype(np.int64) - w.astype(np.int64)) if w.dtype.kind in "iu" \
            else np.abs(g - w)
        assert diff.max(initial=0) <= lsb, f"{out_name}: {int((diff > lsb).sum())} values differ"


def test_sim_runs_tpu_and_cpu_steps_in_one_program():
    sess = InferenceSession(shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite"),
                            target="sim")
    sess.run(random_inputs(sess.get_inputs(), seed=1))
    kinds = [s["kind"] for s in sess.profile()]
    assert kinds == ["tpu", "cpu", "tpu", "cpu"]
    for step in sess.profile():
        assert step["host_seconds"] > 0
        assert (step["device_seconds"] is None) == (step["kind"] == "cpu")


def test_parameters_are_uploaded_once_per_loaded_segment():
    device = simulated_stick()
    device.open()
    loads = lambda: sum(1 for e in device.backend.transcript if e["op"] == "load")  # noqa: E731
    path = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    sess = InferenceSession(path, target="sim", device=device)
    x = random_inputs(sess.get_inputs(), seed=2)
    sess.run(x)
    first = sess.profile()[0]["device_seconds"]
    sess.run(x)
    warm = sess.profile()[0]["device_seconds"]
    assert loads() == 1 and first > warm > 0
    # A second session of the same model on the same device reuses the loaded program.
    InferenceSession(path, target="sim", device=device).run(x)
    assert loads() == 1
    device.close()


def test_latency_estimate_for_mobilenet_v2_matches_published_figure():
    # coral.ai/docs/edgetpu/benchmarks: MobileNet v2 224, USB 3, max clock: 2.6 ms.
    from coralrt import load_model
    seg = build_segment(load_model(shared_model("mobilenet_v2_1.0_224_quant.tflite")))
    est = LatencyModel().estimate(seg)
    assert est.per_run == pytest.approx(2.6e-3, rel=0.05)
    slow = LatencyModel(usb="usb2").estimate(seg)
    assert slow.per_run > 3 * est.per_run  # USB 2 is several times slower (reported 3-4x)


def mobilenet_v1_224():
    """MobileNet v1 1.0 224's layer structure with random weights (for MAC counts)."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    q = dict(scale=0.02, zero_point=128)
    x = b.input("input", (1, 224, 224, 3), np.uint8, **q)

    def conv(x, cin, cout, k, stride, size, depthwise=False):
        shape = (1, k, k, cin) if depthwise else (cout, k, k, cin)
        w = b.constant("w", rng.integers(0, 256, shape, dtype=np.uint8), **q)
        bias = b.constant("b", np.zeros(cout, np.int32), scale=0.0004, zero_point=0)
        y = b.tensor("y", (1, size, size, cout), np.uint8, **q)
        if depthwise:
            b.op("DEPTHWISE_CONV_2D", [x, w, bias], [y], stride_w=stride, stride_h=stride,
                 depth_multiplier=1, padding="SAME")
        else:
            b.op("CONV_2D", [x, w, bias], [y], stride_w=stride, stride_h=stride,
                 padding="SAME")
        return y

    x = conv(x, 3, 32, 3, 2, 112)
    size, c = 112, 32
    for cout, stride in [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
                         *[(512, 1)] * 5, (1024, 2), (1024, 1)]:
        size //= stride
        x = conv(x, c, c, 3, stride, size, depthwise=True)
        x = conv(x, c, cout, 1, 1, size)
        c = cout
    pooled = b.tensor("pool", (1, 1, 1, 1024), np.uint8, **q)
    b.op("AVERAGE_POOL_2D", [x], [pooled], filter_width=7, filter_height=7, stride_w=1,
         stride_h=1, padding="VALID")
    logits = conv(pooled, 1024, 1001, 1, 1, 1)
    flat = b.tensor("flat", (1, 1001), np.uint8, **q)
    b.op("RESHAPE", [logits], [flat], new_shape=[1, 1001])
    probs = b.tensor("probs", (1, 1001), np.uint8, scale=1 / 256, zero_point=0)
    b.op("SOFTMAX", [flat], [probs], beta=1.0)
    b.output(probs)
    return b.build()


def test_latency_estimate_for_mobilenet_v1_matches_published_figure():
    # coral.ai/docs/edgetpu/benchmarks: MobileNet v1 224, USB 3, max clock: 2.4 ms.
    est = LatencyModel().estimate(build_segment(mobilenet_v1_224()))
    assert est.per_run == pytest.approx(2.4e-3, rel=0.05)


def test_bench_cli_reports_host_time_and_device_estimate(capsys):
    path = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    assert main(["bench", str(path), "--target", "sim", "--repeat", "3", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["host_ms"]["runs"] == 3 and r["host_ms"]["min"] > 0
    est = r["estimate_ms"]
    assert est["usb"] == "usb3" and 0 < est["edgetpu"] < est["first_run_edgetpu"]
    assert main(["bench", str(path), "--target", "cpu", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "median" in out and "estimated" not in out


def test_sim_outputs_are_deterministic_across_sessions():
    path = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    x = random_inputs(InferenceSession(path, target="sim").get_inputs(), seed=9)
    a = InferenceSession(path, target="sim").run(x)
    b = InferenceSession(path, target="sim").run(x)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_state_tensor_returned_as_an_output_matches_the_cpu_on_sim():
    # An LSTM's state (a variable tensor) added to the model's outputs: LiteRT returns
    # it; on sim the operator stays on the CPU and its piece returns the state too.
    from coralrt._compile.cache import CompileCache
    from coralrt import load_model

    model = load_model(shared_model("keras_lstm_mnist_ptq.tflite"))
    state = next(i for i, t in enumerate(model.main.tensors) if t.is_variable)
    model.main.outputs.append(state)
    data = model.to_bytes()
    cpu = InferenceSession(data, target="cpu")
    sim = InferenceSession(data, target="sim", cache=CompileCache(enabled=False))
    assert any("state the model also returns" in row[2]
               for row in sim.compile_info["placement"])
    x = random_inputs(cpu.get_inputs(), seed=3)
    for _ in range(2):     # the state carries over between runs on both targets
        want, got = cpu.run(x), sim.run(x)
        assert want.keys() == got.keys()
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])


def test_open_simulated_sticks_gives_open_sticks_on_one_bus():
    from coralrt.testing import open_simulated_sticks

    sticks = open_simulated_sticks(3)
    try:
        assert [s.path for s in sticks] == ["usb:0", "usb:1", "usb:2"]
        assert all(s.is_open for s in sticks)
    finally:
        for s in sticks:
            s.close()
    with pytest.raises(ValueError):
        open_simulated_sticks(0)


def test_simulated_steps_say_they_are_simulated():
    # A step on the simulated stick is not "on usb:0", which names a real stick.
    session = InferenceSession(shared_model("mobilenet_v1_0.25_128_quant.tflite"), target="sim")
    session.run(random_inputs(session.get_inputs(), seed=1))
    tpu = [row for row in session.profile() if row["kind"] == "tpu"]
    assert tpu and all(row["label"].endswith("on simulated usb:0") for row in tpu), tpu
