"""The ``fast`` extra's compiled kernels: chosen automatically when numba works,
NumPy's otherwise (forced by the environment variable, or numba missing), and
bit-exact with LiteRT's reference kernels end to end on the shared models.

Set CORALRT_REQUIRE_COMPILED=1 (the CI job that installs the extra) to make the
tests that need numba fail, rather than skip, when it is not usable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import random_inputs, run_litert, shared_model

from coralrt import InferenceSession, load_model
from coralrt._formats.segment import build_segment
from coralrt._sim import compiled
from coralrt._sim.runner import SegmentRunner
from coralrt.testing import ModelBuilder

from .harness import compiled_usable

REQUIRED = os.environ.get("CORALRT_REQUIRE_COMPILED") == "1"


def _need_compiled():
    if not compiled_usable():
        if REQUIRED:
            pytest.fail(f"compiled kernels required but unusable: {compiled.status()}")
        pytest.skip("numba is not installed (the fast extra)")


def _conv_model(dtype=np.uint8) -> bytes:
    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 3), dtype, scale=0.02, zero_point=3)
    w = np.arange(4 * 27, dtype=np.int64).reshape(4, 3, 3, 3) % 200 - 90
    w = (w + 128).astype(np.uint8) if dtype == np.uint8 else w.astype(np.int8)
    w = b.constant("w", w, scale=0.01, zero_point=128 if dtype == np.uint8 else 0)
    bias = b.constant("b", np.array([5, -7, 100, 0], np.int32), scale=0.0002, zero_point=0)
    y = b.tensor("y", (1, 6, 6, 4), dtype, scale=0.05, zero_point=-2 if dtype == np.int8 else 7)
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_h=1, stride_w=1,
         dilation_h_factor=1, dilation_w_factor=1)
    b.output(y)
    return b.build().to_bytes()


def _step_modules(data: bytes) -> list[str]:
    runner = SegmentRunner(build_segment(load_model(data)))
    return [run.__module__ for run, _, _ in runner._steps]


def test_compiled_kernels_are_chosen_when_numba_works(monkeypatch):
    _need_compiled()
    monkeypatch.delenv(compiled.ENV, raising=False)
    assert _step_modules(_conv_model()) == ["coralrt._sim.compiled.ops"]
    s = compiled.status()
    assert s["kernels"] == "compiled" and s["numba"] and s["first_use_seconds"] > 0
    assert compiled.summary().startswith("compiled (numba ")


def test_environment_variable_forces_the_numpy_kernels(monkeypatch):
    monkeypatch.setenv(compiled.ENV, "0")
    assert _step_modules(_conv_model()) == ["coralrt._sim.kernels.conv"]
    assert compiled.status()["kernels"] == "numpy"
    assert compiled.summary().startswith("NumPy (CORALRT_COMPILED_KERNELS=0")


def test_without_numba_the_numpy_kernels_run_with_one_log_line(tmp_path):
    """numba unimportable (as where the extra has no wheel): same results, NumPy kernels."""
    data = _conv_model(np.int8)
    (tmp_path / "m.tflite").write_bytes(data)
    script = f"""
import logging, sys
sys.modules["numba"] = None          # any import of numba now raises ImportError
logging.basicConfig(level=logging.INFO, format="LOG %(name)s %(message)s")
import numpy as np
from coralrt import load_model
from coralrt._formats.segment import build_segment
from coralrt._sim.runner import SegmentRunner
from coralrt._sim import compiled
data = open({str(tmp_path / 'm.tflite')!r}, 'rb').read()
runner = SegmentRunner(build_segment(load_model(data)))
SegmentRunner(build_segment(load_model(data)))     # a second load logs nothing more
x = (np.arange(108) % 256 - 128).astype(np.int8).reshape(1, 6, 6, 3)
np.save({str(tmp_path / 'out.npy')!r}, runner.run([x])[0])
print("MODULE", runner._steps[0][0].__module__)
print("STATUS", compiled.status()["kernels"])
"""
    env = {k: v for k, v in os.environ.items() if k != compiled.ENV}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "MODULE coralrt._sim.kernels.conv" in proc.stdout
    assert "STATUS numpy" in proc.stdout
    logs = [ln for ln in proc.stderr.splitlines() if "compiled kernels unavailable" in ln]
    assert len(logs) == 1 and "numba is not installed" in logs[0]
    x = (np.arange(108) % 256 - 128).astype(np.int8).reshape(1, 6, 6, 3)
    want = run_litert(data, [x], kernels="reference")[0]
    np.testing.assert_array_equal(np.load(tmp_path / "out.npy"), want)


# Shared models with convolutions, depthwise convolutions and a fully-connected
# layer: uint8 per-tensor, int8 per-channel from TensorFlow 2's converter, and
# DeepLab's dilated depthwise convolutions.
MODELS = ["mobilenet_v2_1.0_224_quant.tflite", "tf2_mobilenet_v2_1.0_224_ptq.tflite",
          "deeplabv3_mnv2_dm05_pascal_quant.tflite", "mobilenet_v1_0.25_128_quant.tflite"]


@pytest.mark.parametrize("path", ["numpy", "compiled"])
@pytest.mark.parametrize("name", MODELS)
def test_shared_models_match_litert_reference_on_both_paths(name, path, monkeypatch):
    if path == "compiled":
        _need_compiled()
    monkeypatch.setenv(compiled.ENV, "0" if path == "numpy" else "1")
    model = shared_model(name)
    sess = InferenceSession(model, target="sim", cpu_kernels="reference")
    feeds = random_inputs(sess.get_inputs(), seed=33)
    want = run_litert(model.read_bytes(), feeds, kernels="reference")
    got = sess.run(feeds)
    for w, (out_name, g) in zip(want, got.items()):
        assert g.dtype == w.dtype and g.shape == w.shape, out_name
        np.testing.assert_array_equal(g, w, err_msg=f"{name} on {path} kernels: {out_name}")


@pytest.mark.parametrize("forced_off", [False, True])
def test_doctor_says_which_kernels_run(forced_off, monkeypatch):
    if forced_off:
        monkeypatch.setenv(compiled.ENV, "0")
    else:
        monkeypatch.delenv(compiled.ENV, raising=False)
    env = dict(os.environ)
    proc = subprocess.run([sys.executable, "-m", "coralrt", "doctor", "--simulated", "1",
                           "--json"], capture_output=True, text=True, env=env, timeout=300)
    checks = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    found = checks["kernels"]["found"]
    if forced_off or not compiled_usable():
        assert found.startswith("NumPy (")
    else:
        assert found.startswith("compiled (numba ") and "first use in this process" in found
