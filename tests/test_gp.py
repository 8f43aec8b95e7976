"""coralrt.gp: array operations computed by generated int8 tile models on
simulated Edge TPUs.  Error figures: MAPE = mean|err| / mean|ref| (the
study's error relative to the mean magnitude, not the per-element ratio that
explodes near zero results) and RMSE = rms(err) / rms(ref)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_litert
from numpy.lib.stride_tricks import sliding_window_view

from coralrt import InferenceSession, gp
from coralrt.errors import ConfigError, InputError
from coralrt.gp import _scaling as scaling, _tile_models as tm


def _errors(got, ref):
    e = np.asarray(got, np.float64) - ref
    return (np.abs(e).mean() / np.abs(ref).mean(),
            np.sqrt((e * e).mean()) / np.sqrt((ref * ref).mean()))


def _conv_ref(x, w, stride=1):
    win = sliding_window_view(x, w.shape)[::stride, ::stride]
    return np.einsum("ijkl,kl->ij", win, w)


@pytest.fixture(scope="module")
def ctx():
    with gp.Context("sim") as c:
        yield c


def _data(dist):
    rng = np.random.default_rng(7)
    draw = (lambda s: rng.uniform(0, 1, s)) if dist == "uniform" else \
        (lambda s: rng.normal(0, 1, s))
    return dict(a=draw((100, 300)), b=draw((300, 50)), x=draw((200, 200)),
                y=draw((200, 200)), w=draw((3, 3)))


# Measured (seed 7, "bound" scaling) figures are about a third to a half of these.
LIMITS = {
    "uniform": dict(matmul=0.005, add=0.01, sub=0.015, mul=0.01, tanh=0.01, relu=0.01,
                    conv2d=0.01),
    "normal": dict(matmul=0.05, add=0.03, sub=0.03, mul=0.08, tanh=0.02, relu=0.02,
                   conv2d=0.05),
}


@pytest.mark.parametrize("dist", ["uniform", "normal"])
def test_accuracy_against_numpy(ctx, dist):
    d = _data(dist)
    x, y = d["x"], d["y"]
    got = {"matmul": (ctx.matmul(d["a"], d["b"]), d["a"] @ d["b"]),
           "add": (ctx.add(x, y), x + y), "sub": (ctx.sub(x, y), x - y),
           "mul": (ctx.mul(x, y), x * y), "tanh": (ctx.tanh(x), np.tanh(x)),
           "relu": (ctx.relu(x), np.maximum(x, 0)),
           "conv2d": (ctx.conv2d(x, d["w"]), _conv_ref(x, d["w"]))}
    for op, (value, ref) in got.items():
        assert value.dtype == np.float64 and value.shape == ref.shape, op
        mape, rmse = _errors(value, ref)
        assert mape < LIMITS[dist][op] and rmse < LIMITS[dist][op], (op, mape, rmse)
    step = scaling.quantize(x)[1].scale
    assert abs(ctx.mean(x) - x.mean()) < step
    assert abs(ctx.max(x) - x.max()) <= step / 2 + 1e-12
    strided = ctx.conv2d(x[:50, :61], d["w"], stride=2)
    assert _errors(strided, _conv_ref(x[:50, :61], d["w"], 2))[1] < LIMITS[dist]["conv2d"]


def test_gemm_forms_agree_and_conv_is_estimated_faster():
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(6, 40)), rng.normal(size=(40, 9))
    with gp.Context("sim", gemm="fc") as fc, gp.Context("sim", gemm="conv") as conv, \
            gp.Context("sim") as auto:
        # Same quantization, same integer arithmetic: identical results.
        np.testing.assert_array_equal(fc.matmul(a, b), conv.matmul(a, b))
        np.testing.assert_array_equal(auto.matmul(a, b), conv.matmul(a, b))
        est = auto.gemm_estimates[(6, 40, 9)]
        assert est["conv"] < est["fc"] and auto.stats()["gemm_forms"][(6, 40, 9)] == "conv"


def _int8(rng, shape):
    return rng.integers(-128, 128, shape).astype(np.int8)


def test_tile_models_map_to_tpu_and_match_reference_kernels():
    rng = np.random.default_rng(5)
    q_in, q_out = scaling.Quant(0.02, -5), scaling.Quant(0.5, 3)
    bt = rng.integers(-127, 128, (20, 50)).astype(np.int8)
    w = scaling.Quant(0.01, 0)
    cases = [
        (tm.gemm_conv(4, bt, q_in, w, q_out), [_int8(rng, (1, 4 * 8, 8, 1))]),
        (tm.gemm_fc(bt, q_in, w, q_out), [_int8(rng, (1, 50))]),
        (tm.binary("ADD", q_in, scaling.Quant(0.03, 7), q_out), [_int8(rng, (1, 128, 128, 1))] * 2),
        (tm.binary("MUL", q_in, scaling.Quant(0.03, 7), q_out),
         [_int8(rng, (1, 128, 128, 1)), _int8(rng, (1, 128, 128, 1))]),
        (tm.unary("TANH", q_in, scaling.Quant(1 / 128, 0)), [_int8(rng, (1, 128, 128, 1))]),
        (tm.unary("RELU", q_in, q_in), [_int8(rng, (1, 128, 128, 1))]),
        (tm.reduce("MEAN", q_in), [_int8(rng, (1, 64, 64, 1))]),
        (tm.reduce("REDUCE_MAX", q_in), [_int8(rng, (1, 64, 64, 1))]),
        (tm.conv2d((20, 20), rng.integers(-127, 128, (3, 3)).astype(np.int8), 2, q_in, w,
                   q_out), [_int8(rng, (1, 20, 20, 1))]),
    ]
    for model, inputs in cases:
        with InferenceSession(model, target="sim") as s:
            assert all(p[0] == "tpu" for p in s.compile_info["placement"])
            got = s.run(inputs if len(inputs) > 1 else inputs[0])["c"]
        ref = run_litert(model, inputs, kernels="reference")[0]
        assert got.dtype == np.int8
        np.testing.assert_array_equal(got, ref)


def test_tasks_equal_synchronous_results(ctx):
    rng = np.random.default_rng(11)
    a, b = rng.uniform(size=(30, 70)), rng.uniform(size=(70, 20))
    x, y = rng.normal(size=(50, 40)), rng.normal(size=(50, 40))
    futures = [ctx.submit("matmul", a, b), ctx.submit(ctx.add, x, y),
               ctx.submit("tanh", x), ctx.submit("mean", x), ctx.submit(ctx.max, y)]
    ctx.sync()
    assert all(f.done() for f in futures)
    expected = [ctx.matmul(a, b), ctx.add(x, y), ctx.tanh(x), ctx.mean(x), ctx.max(y)]
    for f, e in zip(futures, expected):
        np.testing.assert_array_equal(f.result(), e)


def test_two_sticks_same_results_and_both_used():
    rng = np.random.default_rng(13)
    a, b = rng.uniform(size=(40, 100)), rng.uniform(size=(100, 60))
    x = rng.normal(size=(300, 300))
    with gp.Context("sim", 1, n_tile=20, k_tile=50) as one, \
            gp.Context("sim", 2, n_tile=20, k_tile=50) as two:
        np.testing.assert_array_equal(one.matmul(a, b), two.matmul(a, b))
        np.testing.assert_array_equal(one.relu(x), two.relu(x))
        jobs = two.stats()["jobs"]
        assert all(j > 0 for j in jobs), jobs
        # 6 distinct B tiles, each pinned to one stick by its affinity key.
        assert sum(two.stats()["sessions"]) >= 6


def test_bad_inputs_raise_clear_errors(ctx):
    a = np.ones((4, 5))
    with pytest.raises(InputError, match="inner dimensions"):
        ctx.matmul(a, np.ones((4, 5)))
    with pytest.raises(InputError, match="2-D"):
        ctx.matmul(np.ones(5), np.ones((5, 2)))
    with pytest.raises(InputError, match="differ in shape"):
        ctx.add(a, np.ones((5, 4)))
    with pytest.raises(InputError, match="NaN"):
        ctx.tanh(np.array([1.0, np.nan]))
    with pytest.raises(InputError, match="infinite"):
        ctx.mul(a, np.full((4, 5), np.inf))
    with pytest.raises(InputError, match="empty"):
        ctx.mean(np.ones((0, 3)))
    with pytest.raises(InputError, match="numeric"):
        ctx.relu(np.array(["a", "b"]))
    with pytest.raises(ConfigError, match="axis"):
        ctx.mean(a, axis=0)
    with pytest.raises(ConfigError, match="unknown operation"):
        ctx.submit("fft", a)
    with pytest.raises(InputError, match="NaN"):
        ctx.submit("matmul", a, np.full((5, 2), np.nan))
    with pytest.raises(ConfigError):
        ctx.conv2d(a, np.ones((2, 2)), stride=0)
    with pytest.raises(ConfigError, match="target"):
        gp.Context("tpu")
    with pytest.raises(ConfigError, match="no devices"):
        gp.Context("cpu", devices=2)


def test_cpu_target_runs_the_same_models():
    rng = np.random.default_rng(17)
    x, y = rng.uniform(size=(20, 30)), rng.uniform(size=(30, 10))
    with gp.Context("cpu") as cpu, gp.Context("sim") as sim:
        np.testing.assert_array_equal(cpu.matmul(x, y), sim.matmul(x, y))
        np.testing.assert_array_equal(cpu.tanh(x), sim.tanh(x))


def test_scaling_rules_order_on_zero_mean_gemm():
    """On zero-mean data the study's ranges waste most of the 8 bits; sampled
    ranges beat the provable ones."""
    d = _data("normal")
    ref = d["a"] @ d["b"]
    errs = {}
    for rule in ("study", "bound", "sample"):
        with gp.Context("sim", scaling=rule) as c:
            errs[rule] = _errors(c.matmul(d["a"], d["b"]), ref)[1]
    assert errs["sample"] < errs["bound"] < errs["study"], errs
    with pytest.raises(ConfigError, match="scaling"):
        gp.Context("sim", scaling="magic")


def test_nearby_ranges_share_tile_models():
    """Steps are rounded up to the grid 2^(k/8): an operand whose range moved by a
    few percent reuses the tile models (no new model, so no new compile), while
    one twice as wide gets its own."""
    rng = np.random.default_rng(5)
    a, b = rng.uniform(0, 1, (20, 60)), rng.uniform(0, 1, (60, 10))
    assert scaling.snap(1.0) == 1.0 and scaling.snap(1.01) == pytest.approx(2 ** 0.125)
    with gp.Context("sim") as ctx:
        ref = ctx.matmul(a, b)
        models = len(ctx._models)
        near = ctx.matmul(a * 1.01, b)
        assert len(ctx._models) == models
        assert _errors(near, 1.01 * (a @ b))[0] < 0.005
        ctx.matmul(a * 2.0, b)
        assert len(ctx._models) > models
    assert _errors(ref, a @ b)[0] < 0.005
