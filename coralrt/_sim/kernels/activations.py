"""Activations and normalizations on 8-bit tensors: RELU, RELU6,
RELU_N1_TO_1, RELU_0_TO_1, LOGISTIC, TANH, HARD_SWISH, QUANTIZE, RSQRT,
SOFTMAX and L2_NORMALIZATION.

The unary operators map each input code to one output code, so the factory
evaluates TFLite's reference arithmetic for all 256 codes and ``run`` is a
table lookup:

* RELU family: ``zp_out + x * (s_in / s_out)`` (one quantized multiplier of
  the float quotient), clamped to the activation bounds quantized with
  ``roundf(bound / s_out)``.
* LOGISTIC, TANH: the reference resolver builds a float lookup table
  (TFLite's LUTPopulate with ``expf``/``tanhf``): dequantize in float, apply
  the function, multiply by ``1 / s_out``, ``roundf``, add the zero point.
  The C library's ``expf``/``tanhf`` are called through ctypes so the table
  is the one LiteRT builds; numpy is the fallback where there is no libm.
* HARD_SWISH: TFLite's 16-bit fixed-point "reluish" pipeline.
* QUANTIZE: requantization with the multiplier of ``double(s_in)/double(s_out)``.
* RSQRT (int8): gemmlowp's inverse square root per code, then rescaled.

SOFTMAX uses the reference fixed-point kernel (exp in Q5.26 through
gemmlowp's ``exp_on_negative_values``, a Q12.19 sum, and the reciprocal by
Newton-Raphson); the exponentials of the 256 possible differences to the
row maximum are precomputed.  L2_NORMALIZATION takes each row's sum of
squares through gemmlowp's inverse square root.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import numpy as np

from coralrt.errors import InferenceError
from coralrt._ops.arith.common import codes, refuse
from coralrt._ops.arith.fixedpoint import (
    INT32_MAX, exp_on_negative_values, get_reciprocal, inv_sqrt_quantized_multiplier_exp,
    c_int32, multiply_by_quantized_multiplier, quantize_bound, quantize_multiplier,
    rounding_divide_by_pot, srdhm, wrap_int32,
)
from coralrt._sim.compiled import ops as compiled
from coralrt._sim.kernels import OpContext

__all__: list[str] = []

_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def _eight_bit(ctx: OpContext, *tensors) -> None:
    for t in tensors:
        if ctx.dtype(t) not in _EIGHT_BIT or not len(t.scales):
            refuse(ctx, f"only quantized uint8 and int8 tensors are supported, tensor "
                        f"{t.name!r} is {t.type_name}")


def _same_type(ctx: OpContext) -> np.dtype:
    x, out = ctx.inputs[0], ctx.outputs[0]
    _eight_bit(ctx, x, out)
    if ctx.dtype(x) != ctx.dtype(out):
        refuse(ctx, f"input {x.type_name} and output {out.type_name} types differ")
    return ctx.dtype(x)


def _lut_run(lut: np.ndarray, out_shape: tuple[int, ...]):
    def run(inputs):
        return [np.take(lut, np.asarray(inputs[0]).view(np.uint8)).reshape(out_shape)]
    return run


def _lut(values, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.ascontiguousarray(np.clip(values, info.min, info.max).astype(dtype))


# -- RELU family ----------------------------------------------------------------------------

_RELU_BOUNDS = {"RELU": (0.0, math.inf), "RELU6": (0.0, 6.0), "RELU_N1_TO_1": (-1.0, 1.0),
                "RELU_0_TO_1": (0.0, 1.0)}


def relu(ctx: OpContext):
    dtype = _same_type(ctx)
    x, out = ctx.inputs[0], ctx.outputs[0]
    si, so = np.float32(ctx.scale(x)), np.float32(ctx.scale(out))
    zi, zo = ctx.zero_point(x), ctx.zero_point(out)
    m, sh = quantize_multiplier(float(si / so))
    info = np.iinfo(dtype)
    lo_f, hi_f = _RELU_BOUNDS[ctx.op.name]
    lo = max(int(info.min), quantize_bound(lo_f, so, zo))
    hi = int(info.max) if hi_f == math.inf else min(int(info.max), quantize_bound(hi_f, so, zo))
    v = zo + multiply_by_quantized_multiplier(codes(dtype) - zi, m, sh)
    # ReluX clamps to [lo, hi] and then casts to the 8-bit type, which keeps the
    # low bits: with an extreme output scale a bound can fall outside the type.
    clamped = np.minimum(np.maximum(v, lo), hi)
    return _lut_run(np.ascontiguousarray(clamped.astype(dtype)), tuple(out.shape))


# -- LOGISTIC, TANH: float lookup tables ----------------------------------------------------

@functools.lru_cache(maxsize=None)
def _libm_function(name: str):
    """The C library's float function ``name`` (e.g. expf), or None."""
    try:
        libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        fn = getattr(libm, name)
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return fn


def _float_map(name: str, values: np.ndarray, fallback) -> np.ndarray:
    fn = _libm_function(name)
    if fn is None:
        return fallback(values.astype(np.float64)).astype(np.float32)
    return np.array([fn(float(v)) for v in values], np.float32)


def _float_lut(ctx: OpContext, transform) -> np.ndarray:
    """TFLite's LUTPopulate for 8-bit types, all arithmetic in float32."""
    x, out = ctx.inputs[0], ctx.outputs[0]
    dtype = ctx.dtype(x)
    deq = np.float32(ctx.scale(x)) * (codes(dtype) - ctx.zero_point(x)).astype(np.float32)
    y = transform(deq)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        scaled = (y * (np.float32(1.0) / np.float32(ctx.scale(out)))).astype(np.float64)
        rounded = np.copysign(np.floor(np.abs(scaled) + 0.5), scaled).astype(np.float32)
        shifted = (rounded + np.float32(ctx.zero_point(out))).astype(np.float64)
    if dtype == np.dtype(np.uint8):
        # static_cast<int32_t> (INT32_MIN for NaN and out-of-range values, which
        # an extreme output scale produces), then std::max(std::min(max, q), min).
        return _lut(c_int32(shifted), dtype)
    # The INT8 tables saturate instead (measured: +inf-like values give 127).
    info = np.iinfo(dtype)
    with np.errstate(invalid="ignore"):
        return _lut(np.trunc(np.clip(shifted, info.min - 1, info.max + 1)).astype(np.int64),
                    dtype)


def _logistic(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        e = _float_map("expf", -v, np.exp)
        return np.float32(1.0) / (np.float32(1.0) + e)


def _tanh(v: np.ndarray) -> np.ndarray:
    return _float_map("tanhf", v, np.tanh)


def logistic(ctx: OpContext):
    _same_type(ctx)
    return _lut_run(_float_lut(ctx, _logistic), tuple(ctx.outputs[0].shape))


def tanh(ctx: OpContext):
    _same_type(ctx)
    return _lut_run(_float_lut(ctx, _tanh), tuple(ctx.outputs[0].shape))


# -- HARD_SWISH: 16-bit fixed point ---------------------------------------------------------

def _int16_multiplier(real: float) -> tuple[int, int]:
    """QuantizeMultiplier, then DownScaleInt32ToInt16Multiplier."""
    m, exponent = quantize_multiplier(real)
    m16 = 32767 if m >= INT32_MAX - (1 << 15) else (m + (1 << 15)) >> 16
    return m16, exponent


def _srdhm16(a, b) -> np.ndarray:
    ab = a * b
    q = ab + np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    q = np.where(q >= 0, q >> 15, -((-q) >> 15))
    return np.where((a == -32768) & (b == -32768), 32767, q)


def _sdhm16(a, b) -> np.ndarray:
    """SaturatingDoublingHighMul: like _srdhm16 but truncating toward zero."""
    ab = a * b
    q = np.where(ab >= 0, ab >> 15, -((-ab) >> 15))
    return np.where((a == -32768) & (b == -32768), 32767, q)


def _saturate16(x) -> np.ndarray:
    return np.clip(x, -32768, 32767)


def _wrap16(x) -> np.ndarray:
    return ((np.asarray(x, np.int64) + 32768) & 0xFFFF) - 32768


def _rounding_divide_by_pot16(x, exponent: int) -> np.ndarray:
    """gemmlowp's RoundingDivideByPOT on int16: the mask is truncated to 16 bits,
    so exponents above 15 do not round to zero the way the int32 version does."""
    mask = int(_wrap16((1 << exponent) - 1))
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + ((x & mask) > threshold)


def hard_swish(ctx: OpContext):
    dtype = _same_type(ctx)
    x, out = ctx.inputs[0], ctx.outputs[0]
    hires_scale = np.float32(1.0 / 128.0) * np.float32(ctx.scale(x))
    out_m, out_exp = _int16_multiplier(float(hires_scale / np.float32(ctx.scale(out))))
    if out_exp > 0:
        refuse(ctx, "the output scale is too small for the input scale (TFLite rejects "
                    "an output multiplier above 1)")
    relu_m, relu_exp = _int16_multiplier(float(hires_scale / np.float32(3.0 / 32768.0)))

    hires = (codes(dtype) - ctx.zero_point(x)) * 128
    preshift = _srdhm16(hires, out_m)
    reluish = hires
    if relu_exp > 0:
        reluish = _saturate16(reluish * (1 << (relu_exp - 1)))
    reluish = _srdhm16(reluish, relu_m)
    if relu_exp > 0:
        reluish = _saturate16(reluish * 2)
    elif relu_exp < 0:
        reluish = _rounding_divide_by_pot16(reluish, -relu_exp)
    reluish = (reluish + (1 << 15)) >> 1
    value = _rounding_divide_by_pot16(_sdhm16(reluish, preshift), -out_exp)
    value = _wrap16(value + ctx.zero_point(out))          # int16 arithmetic in TFLite
    return _lut_run(_lut(value, dtype), tuple(out.shape))


# -- QUANTIZE (requantize), RSQRT -----------------------------------------------------------

def quantize(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    _eight_bit(ctx, x, out)
    m, sh = quantize_multiplier(ctx.scale(x) / ctx.scale(out))
    v = multiply_by_quantized_multiplier(codes(ctx.dtype(x)) - ctx.zero_point(x), m, sh)
    return _lut_run(_lut(v + ctx.zero_point(out), ctx.dtype(out)), tuple(out.shape))


def rsqrt(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    dtype = _same_type(ctx)
    if dtype != np.dtype(np.int8):
        refuse(ctx, "TFLite supports quantized RSQRT for int8 only")
    zi, zo = ctx.zero_point(x), ctx.zero_point(out)
    # 1 / (sqrtf(s_in) * s_out): the product in float, the quotient in double.
    real = 1.0 / float(np.sqrt(np.float32(ctx.scale(x))) * np.float32(ctx.scale(out)))
    m, sh = quantize_multiplier(real)
    shift = 20                                   # keeps the intermediate an integer
    v = codes(dtype) - zi
    valid = v >= 0
    inv_m, inv_sh = inv_sqrt_quantized_multiplier_exp(np.where(valid, v, 0), -1)
    data = multiply_by_quantized_multiplier(np.ones_like(v), inv_m, inv_sh + shift)
    value = multiply_by_quantized_multiplier(data, m, sh - shift) + zo
    value = np.where(v == 0, 127, value)
    lut = _lut(np.where(valid, value, 127), dtype)
    out_shape = tuple(out.shape)

    def run(inputs):
        a = np.asarray(inputs[0])
        if a.size and int(a.min()) < zi:
            raise InferenceError(f"RSQRT is only defined for inputs at or above the zero "
                                 f"point {zi}; got {int(a.min())}")
        return [np.take(lut, a.view(np.uint8)).reshape(out_shape)]
    return run


# -- SOFTMAX --------------------------------------------------------------------------------

_SCALED_DIFF_INTEGER_BITS = 5
_ACCUMULATION_INTEGER_BITS = 12


def softmax(ctx: OpContext):
    x, out = ctx.inputs[0], ctx.outputs[0]
    _eight_bit(ctx, x)
    out_dtype = ctx.dtype(out)
    if out_dtype not in (*_EIGHT_BIT, np.dtype(np.int16)):
        refuse(ctx, f"8-bit softmax writes uint8, int8 or int16, not {out.type_name}")
    if not len(x.shape):
        refuse(ctx, "softmax needs an input of rank 1 or more")
    beta = float(np.float32(ctx.params.get("beta", 1.0)))
    # PreprocessSoftmaxScaling, then QuantizeMultiplierGreaterThanOne.
    real = min(beta * ctx.scale(x) * (1 << (31 - _SCALED_DIFF_INTEGER_BITS)), 2.0**31 - 1.0)
    if real <= 1.0:
        refuse(ctx, f"beta * input scale ({beta * ctx.scale(x):g}) is too small; TFLite "
                    f"requires its input multiplier to exceed 1")
    m, left_shift = quantize_multiplier(real)
    # -CalculateInputRadius(5, left_shift): differences below it contribute nothing.
    diff_min = -math.floor(((1 << _SCALED_DIFF_INTEGER_BITS) - 1)
                           * 2.0**(31 - _SCALED_DIFF_INTEGER_BITS) / 2.0**left_shift)
    diffs = -np.arange(256, dtype=np.int64)                 # row maximum minus value
    used = diffs >= diff_min
    scaled = srdhm(np.where(used, diffs, 0) << left_shift, m)
    exp_q0 = np.where(used, exp_on_negative_values(scaled, _SCALED_DIFF_INTEGER_BITS), 0)
    exp_acc = rounding_divide_by_pot(exp_q0, _ACCUMULATION_INTEGER_BITS)   # Q12.19
    bits = out_dtype.itemsize * 8
    out_min, out_max = int(np.iinfo(out_dtype).min), int(np.iinfo(out_dtype).max)
    out_shape = tuple(out.shape)
    fast = compiled.softmax(exp_acc, exp_q0, bits, out_min, out_max, out_dtype,  # fast extra
                            out_shape)
    if fast is not None:
        return fast

    def run(inputs):
        a = np.asarray(inputs[0]).astype(np.int16)
        d = a.max(axis=-1, keepdims=True) - a                  # 0..255
        total = wrap_int32(exp_acc[d].sum(axis=-1, keepdims=True))
        scale, bits_over_unit = get_reciprocal(total, _ACCUMULATION_INTEGER_BITS)
        exponent = bits_over_unit + 31 - bits
        y = rounding_divide_by_pot(srdhm(scale, exp_q0[d]), exponent) + out_min
        return [np.clip(y, out_min, out_max).astype(out_dtype).reshape(out_shape)]
    return run


# -- L2_NORMALIZATION -----------------------------------------------------------------------

def l2_normalization(ctx: OpContext):
    dtype = _same_type(ctx)
    x, out = ctx.inputs[0], ctx.outputs[0]
    if int(ctx.params.get("fused_activation_function", 0)) != 0:
        refuse(ctx, "TFLite's L2_NORMALIZATION kernels take no fused activation")
    if not len(x.shape):
        refuse(ctx, "L2 normalization needs an input of rank 1 or more")
    zi = ctx.zero_point(x)
    uint8 = dtype == np.dtype(np.uint8)
    out_shape = tuple(out.shape)

    def run(inputs):
        v = np.asarray(inputs[0]).astype(np.int64) - zi
        acc = wrap_int32((v * v).sum(axis=-1, keepdims=True))
        m, sh = inv_sqrt_quantized_multiplier_exp(acc, -1)
        if uint8:       # the uint8 kernel centres the output on 128 itself
            y = 128 + rounding_divide_by_pot(srdhm(wrap_int32(128 * v), m), -sh)
        else:
            y = multiply_by_quantized_multiplier(v, m, sh + 7)
        return [_lut_clip(y, dtype).reshape(out_shape)]
    return run


def _lut_clip(y, dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.clip(y, info.min, info.max).astype(dtype)
