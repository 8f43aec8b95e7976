"""The requantizer's fast paths against TFLite's two-step fixed-point arithmetic.

coralrt/_ops/arith/requant.py proves its float64 path exact by bounds and
monotonicity, and its float32 path by monotonicity plus a check of both ends of
every run of equal outputs; these tests check both proofs against
``multiply_by_quantized_multiplier`` (the int64 transcription of TFLite's
helpers) on every accumulator of the clamped range, on its edges, and on
random draws, and check that each path is taken where it should be.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coralrt._ops.arith import requant_plan as plan_module
from coralrt._ops.arith.fixedpoint import multiply_by_quantized_multiplier
from coralrt._ops.arith.requant import Requantizer

ACTS = [(0, 255), (-128, 127), (-128, -100), (3, 90), (-20, 40), (0, 127)]


def _want(acc, mult, shift, zp, act, dtype, bias):
    total = np.asarray(acc, np.int64) + (0 if bias is None else np.asarray(bias, np.int64))
    out = multiply_by_quantized_multiplier(total, np.asarray(mult), np.asarray(shift)) + zp
    return np.clip(out, *act).astype(dtype)


def _dtype(act):
    return np.uint8 if act[0] >= 0 else np.int8


def _bounds(mult, shift, zp, act, dtype):
    """Per channel, the first x with F(x) >= lo and the last with F(x) <= hi (the
    range where the arithmetic must be exact; outside it the output is clamped)."""
    m = np.atleast_1d(np.asarray(mult, np.int64))
    e = -np.resize(np.atleast_1d(np.asarray(shift, np.int64)), m.size)
    K = np.where(e >= 0, (1 << 30) + np.where(e > 0, np.int64(1) << np.maximum(e - 1, 0), 0)
                 * (1 << 31), np.int64(1) << np.maximum(30 + e, 0))
    return (plan_module._search(m, e, K, act[0] - zp, True),
            plan_module._search(m, e, K, act[1] - zp, False))


def _edges(x_lo, x_hi, channels: int, bias) -> np.ndarray:
    """Accumulators around each channel's clamp bounds and around x = 0, one row per
    offset (so every channel sees all of them)."""
    lo = np.broadcast_to(x_lo, (channels,)).astype(np.int64)
    hi = np.broadcast_to(x_hi, (channels,)).astype(np.int64)
    b = np.zeros(channels, np.int64) if bias is None else np.broadcast_to(bias, (channels,))
    rows = [lo + d for d in range(-3, 4)] + [hi + d for d in range(-3, 4)] + \
        [np.full(channels, d, np.int64) for d in range(-3, 4)]
    return np.array(rows) - b


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("shift", [0, -1, -5, -9])
@pytest.mark.parametrize("bound", [None, 1 << 18])
def test_every_accumulator_of_the_clamped_range(act, shift, bound):
    """Per-tensor multipliers: all accumulators from below the clamp range to above it,
    and far outside it, through the float32 path (float32 accumulators) and the
    float64 one (float64), with and without the int16 steps."""
    rng = np.random.default_rng(abs(shift) * 31 + act[0] + 1000)
    channels = 5
    mult = int(rng.integers(1 << 30, 1 << 31))
    bias = rng.integers(-3000, 3000, size=channels)
    dtype = _dtype(act)
    zp = int(rng.integers(act[0], act[1] + 1))
    rq = Requantizer([mult], [shift], zp, act[0], act[1], dtype, bias, acc_bound=bound)
    assert rq.path == "float"
    if bound is None or shift == 0:
        assert not rq._plan["int16"]        # unknown reach, or |y| up to 2^16 * r
    elif shift <= -5:
        assert rq._plan["int16"]
    x_lo, x_hi = (int(v[0]) for v in _bounds(mult, shift, zp, act, dtype))
    far = 1 << 16 if bound is None else bound - 3000
    xs = np.concatenate([np.arange(x_lo - 5, x_hi + 6), [-far, -far // 2, far // 2, far]])
    acc = xs[:, None] - bias[None, :]                      # every x, in every channel
    if bound is not None:                                  # only what the bound allows
        acc = acc[(np.abs(acc) <= bound).all(axis=1)]
    want = _want(acc, mult, shift, zp, act, dtype, bias)
    assert np.array_equal(rq(acc.astype(np.float64)), want)
    if rq._plan["f32"] is not None:
        assert np.array_equal(rq(acc.astype(np.float32)), want)


def test_the_float32_form_is_found_for_a_real_model_layer():
    """The float32 constants exist for ordinary multipliers (else the fast path would
    silently never run)."""
    found = 0
    rng = np.random.default_rng(7)
    for _ in range(20):
        mult, shift = int(rng.integers(1 << 30, 1 << 31)), -int(rng.integers(4, 11))
        rq = Requantizer([mult], [shift], 0, 0, 255, np.uint8, rng.integers(-999, 999, 8),
                         acc_bound=1 << 20)
        found += rq._plan["f32"] is not None
    assert found >= 16


def _nudged(value, ulps: int):
    for _ in range(abs(ulps)):
        value = np.nextafter(value, np.float32(np.sign(ulps) * np.inf))
    return value


def test_the_float32_check_accepts_exactly_the_constants_right_everywhere():
    """Soundness of the float32 proof: for the found constants and for constants
    pushed some units in the last place off (so that some go wrong), the check of
    run ends passes exactly when all reachable x, computed one by one, are right."""
    outcomes = set()
    for seed in range(10):
        outcomes |= _check_against_everything(seed)
    assert outcomes == {True, False}        # some constants were right, some wrong


def _check_against_everything(seed: int) -> set:
    rng = np.random.default_rng(seed)
    act = ACTS[seed % len(ACTS)]
    channels = 3
    mult = rng.integers(1 << 30, 1 << 31, size=channels)
    shift = -rng.integers(2, 7, size=channels)               # multipliers 1/4 .. 1/128
    zp = int(rng.integers(act[0], act[1] + 1))
    bound = 1 << 14
    rq = Requantizer(mult, shift, zp, act[0], act[1], _dtype(act), None, acc_bound=bound)
    plan = rq._plan
    m, e = np.asarray(mult, np.int64), -np.asarray(shift, np.int64)
    K = np.where(e > 0, (1 << 30) + (np.int64(1) << (e - 1)) * (1 << 31), 1 << 30)
    off = zp + (128 if act[0] < 0 else 0)
    reach = np.full(channels, bound + 1.0)
    t, want = plan_module.check_points(plan, (m, e, K, off), reach)
    xs = np.arange(-bound - 1, bound + 2)
    everything = np.clip(plan_module._exact_f(xs[None, :], m[:, None], e[:, None], K[:, None])
                         + off, plan["L"], plan["H"])
    all_t = np.broadcast_to(xs.astype(np.float32) + np.float32(0.5 if plan["signed"] else 0),
                            (channels, xs.size))
    r0 = np.broadcast_to(plan["r"], (channels,)).astype(np.float32)
    kc0 = np.broadcast_to(plan["kc"], (channels,)).astype(np.float32)
    dh = np.broadcast_to(plan["dh"], (channels,)).astype(np.float32)
    outcomes = set()
    for dr, dk in ((0, 0), (3, 0), (-3, 0), (0, 20), (0, -20), (5, -9), (40, 200), (0, 2)):
        r, kc = _nudged(r0, dr), _nudged(kc0, dk)
        checked = (plan_module.float32_outputs(plan, t, r, kc, dh) == want).all(axis=1)
        right = (plan_module.float32_outputs(plan, all_t, r, kc, dh) == everything).all(axis=1)
        assert np.array_equal(checked, right), (seed, dr, dk)
        outcomes.update(right.tolist())
    return outcomes


def test_per_channel_float32_constants():
    """Per-channel multipliers get float32 constants where they are large enough, and
    are right on every reachable accumulator."""
    mult = np.array([1 << 30, 1500000000, 2000000000, 1234567890])
    shift = np.array([-1, -2, -3, -2])
    bias = np.array([10, -7, 300, 0])
    bound = 3000
    rq = Requantizer(mult, shift, -5, -128, 127, np.int8, bias, acc_bound=bound)
    assert rq._plan["f32"] is not None and isinstance(rq._plan["f32"]["r"], np.ndarray)
    acc = np.arange(-bound, bound + 1)[:, None] + np.zeros(4, np.int64)
    want = _want(acc, mult, shift, -5, (-128, 127), np.int8, bias)
    assert np.array_equal(rq(acc.astype(np.float32)), want)
    assert np.array_equal(rq(acc.astype(np.float64)), want)


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
        x_lo, x_hi = _bounds(mult, shift, zp, act, dtype)
        acc = np.vstack([acc, np.clip(_edges(x_lo, x_hi, channels, bias), -bound, bound)])
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
    from coralrt._sim.kernels.gemm import ExactGemm
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


def test_many_channels_are_proven_by_pair():
    """Over 64 channels the proof first samples 16 of them: large multipliers pass
    (and are right everywhere), small ones (int8 per-channel layers) are refused."""
    rng = np.random.default_rng(11)
    bound = 2000
    for shift, found in ((-1, True), (-8, False)):
        mult = rng.integers(1 << 30, 1 << 31, size=100)
        rq = Requantizer(mult, np.full(100, shift), 3, -128, 127, np.int8,
                         rng.integers(-50, 50, 100), acc_bound=bound)
        assert (rq._plan["f32"] is not None) == found
        acc = rng.integers(-bound, bound + 1, size=(3000, 100))
        want = _want(acc, mult, np.full(100, shift), 3, (-128, 127), np.int8, rq.bias)
        assert np.array_equal(rq(acc.astype(np.float32)), want)
