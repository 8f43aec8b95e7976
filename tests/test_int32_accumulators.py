"""Where LiteRT's int32 arithmetic wraps around, coralrt's kernels wrap with it.

A bias near INT32_MIN plus a negative sum leaves int32 in the accumulator of
LiteRT's 8-bit convolutions and matrix products, which wraps to a large positive
value; the simulated Edge TPU and the NumPy backend (whose kernels add in int64)
used to answer the unwrapped value.  The reference here is LiteRT itself, both
kernel sets.  And an LSTM intermediate whose zero point is outside its type is
refused on every target, like any such tensor.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MODELS_DIR, run_litert

from coralrt import InferenceSession
from coralrt.errors import ModelError
from coralrt.testing import ModelBuilder
from coralrt._model.reader import load_model
from coralrt._model.writer import write_model

BIAS = -2**31 + 10


def _model(op: str, dtype, bias: int) -> bytes:
    """One ``op`` whose accumulator, for an all-minimum input, is a negative sum
    that the bias pushes past INT32_MIN."""
    info = np.iinfo(dtype)
    m = ModelBuilder()
    x = m.input("x", (1, 4, 4, 8), dtype, scale=0.5, zero_point=int(info.max))
    wq = {"scale": 0.5, "zero_point": 0}
    if op == "CONV_2D":
        w = m.constant("w", np.full((8, 1, 1, 8), info.max, dtype), **wq)
    elif op == "DEPTHWISE_CONV_2D":
        w = m.constant("w", np.full((1, 3, 3, 8), info.max, dtype), **wq)
    else:
        w = m.constant("w", np.full((8, 8), info.max, dtype), **wq)
    b = m.constant("b", np.full(8, bias, np.int32), scale=0.25, zero_point=0)
    shape = (16, 8) if op == "FULLY_CONNECTED" else (1, 4, 4, 8)
    y = m.tensor("y", shape, dtype, scale=2.0**25, zero_point=int(info.min))
    if op == "CONV_2D":
        m.op(op, [x, w, b], [y], padding="SAME", stride_w=1, stride_h=1)
    elif op == "DEPTHWISE_CONV_2D":
        m.op(op, [x, w, b], [y], padding="SAME", stride_w=1, stride_h=1, depth_multiplier=1)
    else:
        m.op(op, [x, w, b], [y])
    m.output(y)
    return m.build().to_bytes()


CASES = [(op, dt) for op in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")
         for dt in (np.uint8, np.int8)]


@pytest.mark.needs_litert("the reference is LiteRT's int32 arithmetic")
@pytest.mark.parametrize("op,dtype", CASES)
def test_a_bias_that_overflows_the_accumulator_wraps_like_litert(op, dtype):
    data = _model(op, dtype, BIAS)
    feeds = [np.full((1, 4, 4, 8), np.iinfo(dtype).min, dtype)]
    want = run_litert(data, feeds, kernels="reference")[0]
    assert run_litert(data, feeds)[0].tolist() == want.tolist()   # both kernel sets agree
    assert want.max() > np.iinfo(dtype).min   # the wrapped sum is positive: not clamped away
    for target, extra in (("cpu", {"backend": "numpy"}), ("sim", {})):
        got = InferenceSession(data, target=target, **extra).run(feeds)["y"]
        assert got.tolist() == want.tolist(), (target, extra)


@pytest.mark.needs_litert("the reference is LiteRT's int32 arithmetic")
@pytest.mark.parametrize("op,dtype", CASES[:2])
def test_a_bias_that_fits_keeps_the_fast_path_and_the_answer(op, dtype):
    data = _model(op, dtype, -2**20)
    feeds = [np.full((1, 4, 4, 8), np.iinfo(dtype).min, dtype)]
    want = run_litert(data, feeds, kernels="reference")[0]
    got = InferenceSession(data, target="sim").run(feeds)["y"]
    assert got.tolist() == want.tolist()


@pytest.mark.skipif(not MODELS_DIR.is_dir(), reason=f"test models folder {MODELS_DIR} is absent")
@pytest.mark.parametrize("target,extra", [("cpu", {}), ("cpu", {"cpu_kernels": "reference"}),
                                          ("cpu", {"backend": "numpy"}), ("sim", {})])
def test_an_lstm_intermediate_zero_point_outside_its_type_is_refused(tmp_path, target, extra):
    model = load_model(MODELS_DIR / "keras_lstm_mnist_ptq.tflite")
    sg = model.subgraphs[0]
    lstm = next(op for op in sg.operators if "LSTM" in op.name)
    hidden = next(sg.tensors[k] for k in lstm.intermediates
                  if sg.tensors[k].quantization is not None)
    hidden.quantization.zero_point = np.array([-157230162771969], np.int64)
    path = tmp_path / "lstm.tflite"
    path.write_bytes(write_model(model))
    with pytest.raises(ModelError, match="zero point -157230162771969 is outside the INT8 range"):
        InferenceSession(path, target=target, **extra)
