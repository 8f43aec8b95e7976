"""CONV_2D with a different dilation in x and y: compat mode maps it (edgetpu_compiler
16.0 does, docs/partitioning.md) and the simulated Edge TPU runs it bit-exactly.

The yardstick is LiteRT's reference kernels (``BUILTIN_REF``) on the same model.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_litert

from coralrt import InferenceSession
from coralrt._compile import rules as R
from coralrt._compile.partition import partition
from coralrt._ops.arith.common import compute_out_size
from coralrt.testing import ModelBuilder

DILATIONS = [(1, 2), (2, 1)]     # (x, y): dilation_w_factor, dilation_h_factor
DTYPES = [np.uint8, np.int8]


def _tcn_like(dtype, dw: int, dh: int, *, depthwise: bool = False, seed: int = 0):
    """A dilated convolution, then RESHAPE, FULLY_CONNECTED and LOGISTIC: the shape of
    a temporal convolutional network's head."""
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    zp_in = int(rng.integers(info.min, info.max + 1))
    b = ModelBuilder()
    h, w, c, oc, k = 9, 7, 3, 4, 3
    x = b.input("x", (1, h, w, c), dtype, scale=0.02, zero_point=zp_in)
    oh, ow = compute_out_size(1, h, k, 1, dh), compute_out_size(1, w, k, 1, dw)
    if depthwise:
        wdata = rng.integers(-90, 91, (1, k, k, c)).astype(np.int8)
        if dtype == np.uint8:
            wdata = (wdata.astype(np.int16) + 128).astype(np.uint8)
        wt = b.constant("w", wdata, scale=0.01, zero_point=128 if dtype == np.uint8 else 0,
                        axis=3)
        bias = b.constant("b", rng.integers(-500, 501, c).astype(np.int32),
                          scale=np.float32(0.02) * np.float32(0.01), zero_point=0)
        y = b.tensor("conv", (1, oh, ow, c), dtype, scale=0.05, zero_point=0)
        b.op("DEPTHWISE_CONV_2D", [x, wt, bias], [y], padding="VALID", stride_w=1,
             stride_h=1, depth_multiplier=1, dilation_w_factor=dw, dilation_h_factor=dh)
        b.output(y)
        return b.build()
    wdata = rng.integers(-90, 91, (oc, k, k, c)).astype(np.int8)
    if dtype == np.uint8:
        wdata = (wdata.astype(np.int16) + 128).astype(np.uint8)
    wt = b.constant("w", wdata, scale=0.01, zero_point=128 if dtype == np.uint8 else 0)
    bias = b.constant("b", rng.integers(-500, 501, oc).astype(np.int32),
                      scale=np.float32(0.02) * np.float32(0.01), zero_point=0)
    zp_out = 0 if dtype == np.int8 else 128
    y = b.tensor("conv", (1, oh, ow, oc), dtype, scale=0.08, zero_point=zp_out)
    b.op("CONV_2D", [x, wt, bias], [y], padding="VALID", stride_w=1, stride_h=1,
         dilation_w_factor=dw, dilation_h_factor=dh, fused_activation_function="RELU")
    flat = oh * ow * oc
    shape = b.constant("shape", np.array([1, flat], np.int32))
    r = b.tensor("flat", (1, flat), dtype, scale=0.08, zero_point=zp_out)
    b.op("RESHAPE", [y, shape], [r])
    fw = rng.integers(-60, 61, (2, flat)).astype(np.int8)
    if dtype == np.uint8:
        fw = (fw.astype(np.int16) + 128).astype(np.uint8)
    fwt = b.constant("fc_w", fw, scale=0.01, zero_point=128 if dtype == np.uint8 else 0)
    fb = b.constant("fc_b", np.array([100, -100], np.int32),
                    scale=np.float32(0.08) * np.float32(0.01), zero_point=0)
    f = b.tensor("fc", (1, 2), dtype, scale=0.1, zero_point=zp_out)
    b.op("FULLY_CONNECTED", [r, fwt, fb], [f])
    out = b.tensor("prob", (1, 2), dtype, scale=1 / 256,
                   zero_point=-128 if dtype == np.int8 else 0)
    b.op("LOGISTIC", [f], [out])
    b.output(out)
    return b.build()


def _input(model, seed: int = 1):
    t = model.main.tensors[model.main.inputs[0]]
    info = np.iinfo(t.dtype)
    rng = np.random.default_rng(seed)
    return rng.integers(info.min, info.max + 1, t.shape).astype(t.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dw,dh", DILATIONS)
def test_compat_maps_conv_with_different_dilation_in_x_and_y(dtype, dw, dh):
    model = _tcn_like(dtype, dw, dh)
    plan = partition(model, "compat")
    assert [o.unit for o in plan.ops] == ["tpu"] * 4, [o.reason for o in plan.ops]
    assert len(plan.segments) == 1


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dw,dh", DILATIONS)
@pytest.mark.parametrize("mode", ["compat", "multi"])
def test_sim_runs_conv_with_different_dilation_bit_exactly(dtype, dw, dh, mode):
    model = _tcn_like(dtype, dw, dh, seed=dw * 10 + dh)
    data = model.to_bytes()
    x = _input(model)
    want = run_litert(data, [x], kernels="reference")
    session = InferenceSession(data, target="sim", partition_mode=mode)
    placement = session.compile_info["placement"]
    if mode == "compat":
        assert [row[0] for row in placement] == ["tpu"] * 4
    else:   # the convolution itself is on the Edge TPU in multi mode too
        assert placement[0][0] == "tpu", placement[0]
    got = session.run([x])
    assert len(got) == 1
    np.testing.assert_array_equal(next(iter(got.values())), want[0])
    # The convolution's own output, compared alone: the tail must not hide an error.
    conv_only = _conv_only(model)
    got_conv = InferenceSession(conv_only, target="sim", partition_mode=mode).run([x])
    want_conv = run_litert(conv_only, [x], kernels="reference")[0]
    np.testing.assert_array_equal(next(iter(got_conv.values())), want_conv)


def _conv_only(model) -> bytes:
    from coralrt._model.extract import extract
    return extract(model, [0]).model.to_bytes()


@pytest.mark.parametrize("dw,dh", DILATIONS)
def test_depthwise_with_different_dilation_still_stays_on_cpu(dw, dh):
    """No compiled model shows the compiler mapping it: the table's rule stands."""
    plan = partition(_tcn_like(np.uint8, dw, dh, depthwise=True), "compat")
    (op,) = plan.ops
    assert op.unit == "cpu"
    assert op.reason == f"{R.UNSPECIFIED_LIMITATION}: dilation differs in x ({dw}) and y ({dh})"
