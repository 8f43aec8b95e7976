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
from conftest import random_inputs, run_litert, shared_model, shared_model_names

from coralrt import InferenceSession, load_model
from coralrt.errors import UnsupportedOperatorError
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


# Every plain shared model (found by listing the folder): uint8 per-tensor and
# int8 per-channel convolutions (TensorFlow 2's converter), DeepLab's dilated
# depthwise convolutions, SSD and YOLO detectors, an LSTM, small operator models.
@pytest.mark.parametrize("path", ["numpy", "compiled"])
@pytest.mark.parametrize("name", shared_model_names(compiled=False))
def test_shared_models_match_litert_reference_on_both_paths(name, path, monkeypatch):
    if path == "compiled":
        _need_compiled()
    monkeypatch.setenv(compiled.ENV, "0" if path == "numpy" else "1")
    model = shared_model(name)
    try:
        sess = InferenceSession(model, target="sim", cpu_kernels="reference")
    except UnsupportedOperatorError as exc:     # a custom operator no installed plugin has
        pytest.skip(f"{name} needs a plugin: {exc}")
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


# Each loop of the compiled kernels, on an operator it takes: the factory must
# choose it (not leave the operator to NumPy) and match BUILTIN_REF.
LOOPS = [
    # (operator, input shape, weights shape, options)
    ("CONV_2D", (1, 9, 9, 8), (12, 1, 1, 8), dict(stride_h=1, stride_w=1)),        # 1x1
    ("CONV_2D", (1, 9, 9, 3), (6, 3, 3, 3), dict(stride_h=2, stride_w=2)),        # im2col
    ("CONV_2D", (1, 9, 11, 4), (5, 3, 2, 4), dict(stride_h=1, stride_w=2,
                                                  dilation_h_factor=2, dilation_w_factor=3)),
    ("CONV_2D", (1, 5, 5, 300), (3, 3, 3, 300), dict(stride_h=1, stride_w=1)),    # deep sums
    ("DEPTHWISE_CONV_2D", (1, 8, 8, 10), (1, 3, 3, 10), dict(stride_h=1, stride_w=1,
                                                             depth_multiplier=1)),
    ("DEPTHWISE_CONV_2D", (1, 9, 9, 4), (1, 3, 3, 4), dict(stride_h=2, stride_w=1,
                                                           dilation_h_factor=2,
                                                           depth_multiplier=1)),
    ("DEPTHWISE_CONV_2D", (1, 7, 6, 3), (1, 5, 2, 6), dict(stride_h=1, stride_w=2,
                                                           depth_multiplier=2)),
    ("FULLY_CONNECTED", (2, 40), (7, 40), {}),
]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op, x_shape, w_shape, options, float32_sums", [
    (*row, f32) for row in LOOPS
    # Only the depthwise loops have a float32 form to forbid.
    for f32 in ((True, False) if row[0] == "DEPTHWISE_CONV_2D" else (True,))])
def test_each_compiled_loop_is_chosen_and_exact(op, x_shape, w_shape, options, dtype,
                                                float32_sums, monkeypatch):
    """``float32_sums=False`` forbids the float32 sums, so the int32 depthwise loop runs."""
    _need_compiled()
    monkeypatch.delenv(compiled.ENV, raising=False)
    if not float32_sums:
        from coralrt._sim.compiled import ops
        monkeypatch.setattr(ops, "F32_EXACT", 0)
    from coralrt._ops.arith.common import compute_out_size
    rng = np.random.default_rng(len(x_shape) * 7 + w_shape[0])
    uint8 = dtype == np.uint8
    channels = w_shape[3] if op == "DEPTHWISE_CONV_2D" else w_shape[0]
    per_channel = not uint8 and op != "FULLY_CONNECTED"
    b = ModelBuilder()
    x = b.input("x", x_shape, dtype, scale=0.03, zero_point=7 if uint8 else -5)
    w_scales = (rng.uniform(0.002, 0.02, channels).astype(np.float32) if per_channel
                else 0.01)
    lo, hi = (0, 255) if uint8 else (-127, 127)
    w = b.constant("w", rng.integers(lo, hi + 1, w_shape).astype(dtype), scale=w_scales,
                   zero_point=120 if uint8 else 0, axis=3 if op == "DEPTHWISE_CONV_2D" else 0)
    bias_scale = np.float32(0.03) * np.asarray(w_scales, np.float32)
    bias = b.constant("b", rng.integers(-5000, 5000, channels).astype(np.int32),
                      scale=bias_scale if per_channel else float(bias_scale), zero_point=0)
    if op == "FULLY_CONNECTED":
        out_shape = (x_shape[0], w_shape[0])
    else:
        opts = {"dilation_h_factor": 1, "dilation_w_factor": 1, **options}
        options = dict(opts, padding="SAME")
        oh = compute_out_size(0, x_shape[1], w_shape[1], opts["stride_h"],
                              opts["dilation_h_factor"])
        ow = compute_out_size(0, x_shape[2], w_shape[2], opts["stride_w"],
                              opts["dilation_w_factor"])
        out_shape = (1, oh, ow, channels)
    depth = int(np.prod(w_shape[1:]))
    y = b.tensor("y", out_shape, dtype, scale=0.03 * 0.01 * 40 * np.sqrt(depth),
                 zero_point=3 if uint8 else -2)
    b.op(op, [x, w, bias], [y], **options)
    b.output(y)
    data = b.build().to_bytes()
    assert _step_modules(data) == ["coralrt._sim.compiled.ops"]
    inputs = [rng.integers(lo, hi + 1, x_shape).astype(dtype)]
    runner = SegmentRunner(build_segment(load_model(data)))
    np.testing.assert_array_equal(runner.run(inputs)[0],
                                  run_litert(data, inputs, kernels="reference")[0])


def test_read_only_and_strided_inputs_compile_nothing_more(monkeypatch):
    """Inputs of any layout run on the variants compiled up front (no compile stall)."""
    _need_compiled()
    monkeypatch.delenv(compiled.ENV, raising=False)
    loops = compiled.jit()
    names = [n for n in dir(loops) if hasattr(getattr(loops, n), "signatures")]
    assert {"gemm_requant", "depthwise_3x3", "pair_table"} <= set(names)
    before = {n: len(getattr(loops, n).signatures) for n in names}
    data = _conv_model(np.int8)
    x = (np.arange(216) % 256 - 128).astype(np.int8).reshape(1, 6, 12, 3)[:, :, ::2]
    x.setflags(write=False)
    got = SegmentRunner(build_segment(load_model(data))).run([x])[0]
    assert {n: len(getattr(loops, n).signatures) for n in names} == before
    np.testing.assert_array_equal(got, run_litert(data, [np.ascontiguousarray(x)],
                                                  kernels="reference")[0])


@pytest.mark.parametrize("dtype, out_dtype", [(np.uint8, np.uint8), (np.int8, np.int8),
                                              (np.int8, np.int16)])
def test_softmax_rows_are_compiled_and_exact(dtype, out_dtype, monkeypatch):
    _need_compiled()
    monkeypatch.delenv(compiled.ENV, raising=False)
    info, out_info = np.iinfo(dtype), np.iinfo(out_dtype)
    b = ModelBuilder()
    x = b.input("x", (3, 1001), dtype, scale=0.0988, zero_point=58 if dtype == np.uint8 else -9)
    out_scale = 1.0 / 32768 if out_dtype == np.int16 else 1.0 / 256
    y = b.tensor("y", (3, 1001), out_dtype, scale=out_scale,
                 zero_point=0 if out_dtype != np.int8 else -128)
    b.op("SOFTMAX", [x], [y], beta=1.0)
    b.output(y)
    data = b.build().to_bytes()
    assert _step_modules(data) == ["coralrt._sim.compiled.ops"]
    rng = np.random.default_rng(5)
    inputs = [rng.integers(info.min, info.max + 1, (3, 1001)).astype(dtype)]
    got = SegmentRunner(build_segment(load_model(data))).run(inputs)[0]
    assert got.dtype == out_info.dtype
    np.testing.assert_array_equal(got, run_litert(data, inputs, kernels="reference")[0])
