"""A model the XNNPACK delegate cannot build a runtime for is loaded with LiteRT's
builtin kernels from the start: next to a DEQUANTIZE and QUANTIZE pair, the
delegate's failure frees memory twice and kills the process (SIGABRT)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import run_litert

from coralrt import InferenceSession
from coralrt.testing import ModelBuilder
from coralrt._backends.xnnpack_limits import xnnpack_refuses

pytestmark = pytest.mark.needs_litert("the crash and the reference are LiteRT's")


def _chain(scale: float) -> bytes:
    """uint8 CONV_2D with requantization scale ``scale``, a DEQUANTIZE/QUANTIZE pair,
    then an ordinary CONV_2D."""
    m = ModelBuilder()
    x = m.input("x", (1, 8, 8, 8), np.uint8, scale=0.05, zero_point=128)
    w = np.full((8, 1, 1, 8), 130, np.uint8)
    y0 = m.tensor("y0", (1, 8, 8, 8), np.uint8, scale=0.05 * 0.002 / scale, zero_point=128)
    m.op("CONV_2D", [x, m.constant("w0", w, scale=0.002, zero_point=128),
                     m.constant("b0", np.zeros(8, np.int32), scale=0.0001, zero_point=0)],
         [y0], padding="SAME", stride_w=1, stride_h=1)
    f = m.tensor("f", (1, 8, 8, 8), np.float32)
    m.op("DEQUANTIZE", [y0], [f])
    q = m.tensor("q", (1, 8, 8, 8), np.uint8, scale=0.05, zero_point=128)
    m.op("QUANTIZE", [f], [q])
    y1 = m.tensor("y1", (1, 8, 8, 8), np.uint8, scale=0.05, zero_point=128)
    m.op("CONV_2D", [q, m.constant("w1", w, scale=0.002, zero_point=128),
                     m.constant("b1", np.zeros(8, np.int32), scale=0.0001, zero_point=0)],
         [y1], padding="SAME", stride_w=1, stride_h=1)
    m.output(y1)
    return m.build().to_bytes()


_LOAD = r"""
import sys
from ai_edge_litert.interpreter import Interpreter
Interpreter(model_path=sys.argv[1], num_threads=1).allocate_tensors()
print("ok")
"""


def test_litert_itself_dies_on_such_a_model(tmp_path):
    path = tmp_path / "m.tflite"
    path.write_bytes(_chain(2000.0))
    r = subprocess.run([sys.executable, "-c", _LOAD, str(path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "ok" not in r.stdout


def test_coralrt_runs_it_with_the_builtin_kernels():
    data = _chain(2000.0)
    x = np.random.default_rng(0).integers(0, 256, (1, 8, 8, 8)).astype(np.uint8)
    got = InferenceSession(data, target="cpu", num_threads=1).run([x])["y1"]
    assert got.tolist() == run_litert(data, [x], kernels="builtin")[0].tolist()


def test_the_limit_is_xnnpacks():
    assert xnnpack_refuses(_chain(255.9)) is None
    assert "requantization scale of 256" in xnnpack_refuses(_chain(256.0))
