"""The requantizer's fast paths against TFLite's two-step fixed-point arithmetic.

coralrt/sim/kernels/requant.py proves its float64 path exact by bounds and its
float32 path by an error bound plus a check of the values near integers; these
tests check both proofs against
``multiply_by_quantized_multiplier`` (the int64 transcription of TFLite's
helpers) on every accumulator of the clamped range, on its edges, and on
random draws, and check that each path is taken where it should be.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coralrt.sim.fixedpoint import multiply_by_quantized_multiplier
from coralrt.sim.kernels import requant_plan as plan_module
from coralrt.sim.kernels.requant import Requantizer

ACTS = [(0, 255), (-128, 127), (-128, -100), (3, 90), (-20, 40), (0, 127)]


def _want(acc, mult, shift, zp, act, dtype, bias):
    total = np.asarray(acc, np.int64) + (0 if bias is None else np.asarray(bias, np.int64))
    out = multiply_by_quantized_multiplier(total, np.asarray(mult), np.asarray(shift)) + zp
    return np.clip(out, *act).astype(dtype)


def _dtype(act):
    return np.uint8 if act[0] >= 0 else np.int8


def _edges(rq: Requantizer, channels: int, bias) -> np.ndarray:
    """Accumulators around each channel's clamp bounds and around x = 0, one row per
    offset (so every channel sees all of them)."""
    plan = rq._plan
    half = 0.5 if plan["signed"] else 0.0
    lo = np.broadcast_to(np.asarray(plan["xlo"], np.float64) - half, (channels,))
    hi = np.broadcast_to(np.asarray(plan["xhi"], np.float64) - half, (channels,))
    b = np.zeros(channels, np.int64) if bias is None else np.broadcast_to(bias, (channels,))
    rows = [lo + d for d in range(-3, 4)] + [hi + d for d in range(-3, 4)] + \
        [np.full(channels, float(d)) for d in range(-3, 4)]
    return (np.array(rows) - b).astype(np.int64)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shift", [0, -1, -5, -9])
def test_every_accumulator_of_the_clamped_range(act, shift):
    """Per-tensor multipliers: all accumulators from below the clamp range to above it,
    through the float32 path (float32 accumulators) and the float64 one (float64)."""
    rng = np.random.default_rng(abs(shift) * 31 + act[0] + 1000)
    channels = 5
    mult = int(rng.integers(1 << 30, 1 << 31))
    bias = rng.integers(-3000, 3000, size=channels)
    dtype = _dtype(act)
    zp = int(rng.integers(act[0], act[1] + 1))
    rq = Requantizer([mult], [shift], zp, act[0], act[1], dtype, bias)
    assert rq.path == "float"
    plan = rq._plan
    half = 0.5 if plan["signed"] else 0.0
    x_lo, x_hi = int(plan["xlo"] - half), int(plan["xhi"] - half)
    xs = np.arange(x_lo - 5, x_hi + 6)
    acc = xs[:, None] - bias[None, :]                      # every x, in every channel
    want = _want(acc, mult, shift, zp, act, dtype, bias)
    assert np.array_equal(rq(acc.astype(np.float64)), want)
    if plan["f32"] is not None:
        assert np.array_equal(rq(acc.astype(np.float32)), want)


def test_the_float32_form_is_found_for_a_real_model_layer():
    """The float32 constants exist for ordinary multipliers (else the fast path would
    silently never run)."""
    found = 0
    rng = np.random.default_rng(7)
    for _ in range(20):
        mult, shift = int(rng.integers(1 << 30, 1 << 31)), -int(rng.integers(4, 11))
        rq = Requantizer([mult], [shift], 0, 0, 255, np.uint8, rng.integers(-999, 999, 8))
        found += rq._plan["f32"] is not None
    assert found >= 16


def _float32_all(plan, lo, hi, r32, kc32):
    """The float32 form on every x of [lo, hi] (what the kernels compute)."""
    half = 0.5 if plan["signed"] else 0.0
    xs = np.arange(lo, hi + 1, dtype=np.int64)
    t = xs.astype(np.float32) + np.float32(half)
    y = plan_module.float32_steps(t, r32, kc32, np.float32(plan["dh"]), plan, np.empty_like(t))
    return xs, y


def test_every_float32_miss_is_among_the_checked_values():
    misses = sum(_misses_outside_the_checked_values(seed) for seed in range(12))
    assert misses > 0                     # the perturbed constants did go wrong somewhere


def _misses_outside_the_checked_values(seed: int) -> int:
    """The float32 proof checks only the x whose exact value lies near an integer;
    that is sound only if every x where float32 can go wrong is among them.  With
    constants pushed a few units in the last place off (so that misses happen),
    all x are computed and every miss must be in the checked set."""
    rng = np.random.default_rng(seed)
    act = ACTS[seed % len(ACTS)]
    mult, shift = int(rng.integers(1 << 30, 1 << 31)), -int(rng.integers(3, 10))
    zp = int(rng.integers(act[0], act[1] + 1))
    rq = Requantizer([mult], [shift], zp, act[0], act[1], _dtype(act), None)
    plan = rq._plan
    half = 0.5 if plan["signed"] else 0.0
    lo, hi = int(plan["xlo"] - half), int(plan["xhi"] - half)
    e = -shift
    K = (1 << 30) + (1 << (e - 1)) * (1 << 31)
    off = zp + (128 if act[0] < 0 else 0)
    exact = np.clip(plan_module._exact_f(np.arange(lo, hi + 1), np.int64(mult), np.int64(e),
                                       np.int64(K)), rq.lo, rq.hi) + off
    misses = 0
    for dr, dk in ((0, 0), (12, 0), (-12, 0), (0, 60), (0, -60), (8, -30), (40, 200)):
        r32, kc32 = np.float32(plan["r"]), np.float32(plan["kc"])
        for _ in range(abs(dr)):
            r32 = np.nextafter(r32, np.float32(np.sign(dr) * np.inf))
        for _ in range(abs(dk)):
            kc32 = np.nextafter(kc32, np.float32(np.sign(dk) * np.inf))
        xs, y = _float32_all(plan, lo, hi, r32, kc32)
        wrong = xs[np.floor(y).astype(np.int64) != exact]
        near = set(plan_module._near_integers(plan, lo, hi, r32, kc32).tolist())
        assert set(wrong.tolist()) <= near, (seed, dr, dk)
        misses += wrong.size
    return misses


def test_the_float32_check_refuses_constants_that_miss_one_value():
    """Told that one of the values it checks should be something else, the check
    finds no constants."""
    rq = Requantizer([1500000000], [-7], 0, 0, 255, np.uint8, None)
    plan = dict(rq._plan)
    e, m = 7, 1500000000
    K = (1 << 30) + (1 << (e - 1)) * (1 << 31)
    lo, hi = int(plan["xlo"]), int(plan["xhi"])

    def exact(x):
        return plan_module._exact_f(x, np.int64(m), np.int64(e), np.int64(K))
    near = plan_module._near_integers(plan, lo, hi, plan["f32"]["r"], plan["f32"]["kc"])
    x_bad = int(near[len(near) // 2])
    assert plan_module._float32_constants(plan, lambda x: exact(x) + (x == x_bad)) is None
    assert plan_module._float32_constants(plan, exact) is not None


@settings(max_examples=400, deadline=None)
@given(channels=st.integers(1, 6), shifts=st.lists(st.integers(-31, 4), min_size=1, max_size=6),
       act=st.sampled_from(ACTS), zp=st.integers(-128, 255), bias_bits=st.integers(0, 25),
       uniform=st.booleans(), bound_bits=st.integers(4, 24), seed=st.integers(0, 2**32 - 1))
def test_random_multipliers_and_edges(channels, shifts, act, zp, bias_bits, uniform, bound_bits,
                                      seed):
    """Per-channel multipliers (left shifts included, with the accumulator bound that
    proves no int32 wrap), biases up to 2^25, every path, random and edge accumulators."""
    rng = np.random.default_rng(seed)
    mult = rng.integers(1 << 30, 1 << 31, size=1 if uniform else channels)
    shift = np.resize(np.array(shifts), mult.size)
    bias = rng.integers(-(1 << bias_bits), (1 << bias_bits) + 1, size=channels) \
        if bias_bits else None
    bound = 1 << bound_bits
    dtype = _dtype(act)
    zp = int(np.clip(zp, *act))
    rq = Requantizer(mult, shift, zp, act[0], act[1], dtype, bias, acc_bound=bound)
    reachable = int(bound + (0 if bias is None else np.abs(bias).max()))
    if (shift > 0).any() and (reachable << int(shift.max())) >= 1 << 31:
        assert rq.path == "general"                       # a wrap is possible
    acc = rng.integers(-bound, bound + 1, size=(200, channels))
    acc[:8] = rng.integers(-3, 4, size=(8, channels))
    if rq.path == "float":
        acc = np.vstack([acc, np.clip(_edges(rq, channels, bias), -bound, bound)])
    want = _want(acc, mult, shift, zp, act, dtype, bias)
    f32 = bound <= 1 << 24
    assert np.array_equal(rq(acc.astype(np.float32 if f32 else np.float64)), want)


def test_paths():
    assert Requantizer([1 << 30], [-4], 0, 0, 255, np.uint8).path == "float"
    # A bias past 2^23 is not exact in float32 once half is added: integer route.
    assert Requantizer([1 << 30], [-4], 0, -128, 127, np.int8, np.array([1 << 24])).path \
        == "int64"
    # A multiplier above 1 without an accumulator bound may wrap int32: step by step.
    assert Requantizer([1 << 30], [2], 0, 0, 255, np.uint8).path == "general"
    assert Requantizer([1 << 30], [2], 0, 0, 255, np.uint8, acc_bound=1000).path == "float"
    # int16 outputs are not what the float path's uint8 cast can produce.
    assert Requantizer([1 << 30], [-4], 0, -32768, 32767, np.int16).path == "int64"


def test_output_and_accumulator_arguments():
    rq = Requantizer([1 << 30], [-3], 10, 0, 255, np.uint8, np.arange(4))
    acc = np.arange(-40, 40, dtype=np.float32).reshape(20, 4)
    want = rq(acc.copy())
    out = np.full((20, 4), 7, np.uint8)
    assert rq(acc.copy(), out=out) is out
    assert np.array_equal(out, want)
    assert np.array_equal(rq(acc.astype(np.int64)), want)     # integer accumulators too


@pytest.mark.parametrize("act", [(0, 255), (-128, 127)])
def test_the_bias_folded_into_the_gemm(act):
    """A convolution may add :meth:`pre_add` inside its GEMM (a row of weights against
    a column of ones); the requantizer then skips that step, with equal results."""
    from coralrt.sim.kernels.gemm import ExactGemm
    rng = np.random.default_rng(3)
    weights = rng.integers(-120, 120, size=(40, 6))
    bias = rng.integers(-5000, 5000, size=6)
    dtype = _dtype(act)
    rq = Requantizer([1 << 30], [-9], 0, act[0], act[1], dtype, bias)
    gemm = ExactGemm(weights, 255, extra_row=rq.pre_add())
    assert gemm.extra and gemm.depth == 41
    a = rng.integers(-255, 256, size=(30, 40)).astype(np.float32)
    folded = rq(gemm(np.hstack([a, np.ones((30, 1), np.float32)])), pre_added=True)
    assert np.array_equal(folded, rq(ExactGemm(weights, 255)(a)))
    assert np.array_equal(folded, _want(a.astype(np.int64) @ weights, [1 << 30], [-9], 0, act,
                                        dtype, bias))
    # Not exact in float32 any more: the row is not folded.
    assert not ExactGemm(weights, 1 << 16, extra_row=rq.pre_add()).extra
    # Without a bias the requantizer adds one value (0, or 1/2) to every column.
    plain = Requantizer([1 << 30], [-9], 0, act[0], act[1], dtype, None)
    gemm = ExactGemm(weights, 255, extra_row=plain.pre_add())
    assert gemm.extra
    folded = plain(gemm(np.hstack([a, np.ones((30, 1), np.float32)])), pre_added=True)
    assert np.array_equal(folded, plain(ExactGemm(weights, 255)(a)))
