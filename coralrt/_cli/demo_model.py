"""The built-in demo model: a tiny uint8 image classifier made with ``ModelBuilder``.

It needs no files and no Edge TPU, so ``coralrt demo`` and the tests can run
anywhere.  The layer stack is the MobileNet pattern in miniature::

    1x32x32x3 uint8
    -> CONV_2D 3x3 stride 2, 8 ch, RELU6
    -> DEPTHWISE_CONV_2D 3x3, RELU6
    -> CONV_2D 1x1, 16 ch, RELU6
    -> AVERAGE_POOL_2D (global) -> RESHAPE 1x16
    -> FULLY_CONNECTED 10 -> SOFTMAX (uint8, scale 1/256, zero point 0)

Weights are random but fixed (``numpy.random.default_rng`` with a constant
seed); activation scales come from a float calibration pass over a few
inputs at build time.  Every scale is rounded to a short binary mantissa so
that a last-bit difference in a float sum on another machine cannot change
the model bytes.
"""

from __future__ import annotations

import numpy as np

from coralrt._model import Model
from coralrt._model.builder import ModelBuilder

__all__ = ["build_demo_model", "demo_input", "DEMO_CLASSES", "INPUT_SHAPE"]

INPUT_SHAPE = (1, 32, 32, 3)
DEMO_CLASSES = 10
_SEED = 20240607
_IN_SCALE, _IN_ZP = 1.0 / 128.0, 128  # input pixels map to [-1, 1)


def demo_input(variant: int = 0) -> np.ndarray:
    """A deterministic synthetic 1x32x32x3 uint8 image (smooth colour waves).

    ``variant`` shifts the pattern, giving other images of the same kind.
    """
    y, x = np.mgrid[0:32, 0:32].astype(np.float64)
    v = float(variant)
    r = np.sin((x + 3 * v) / 4.0) * np.cos(y / 7.0)
    g = np.cos((x + y) / 6.0 + v)
    b = np.sin(np.hypot(x - 16, y - 16) / 3.0 - v)
    img = np.stack([r, g, b], axis=-1)
    # Integer arithmetic after one rounding keeps the bytes platform-independent.
    return np.clip(np.rint(img * 120.0) + 128, 0, 255).astype(np.uint8)[None]


def _nice(scale: float) -> float:
    """Round a positive scale to 6 significant bits, a float32-exact value."""
    m, e = np.frexp(scale)
    return float(np.ldexp(np.round(m * 64.0) / 64.0, e))


def _quant_weights(w: np.ndarray) -> tuple[np.ndarray, float, int]:
    """Asymmetric per-tensor uint8 quantization of float weights (range holds 0)."""
    lo, hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
    scale = _nice((hi - lo) / 255.0)
    zp = int(np.clip(np.rint(-lo / scale), 0, 255))
    q = np.clip(np.rint(w / scale) + zp, 0, 255).astype(np.uint8)
    return q, scale, zp


def _pad_same(x: np.ndarray, k: int, stride: int) -> np.ndarray:
    # TFLite SAME padding puts the odd pixel at the end.
    n = x.shape[1]
    out = -(-n // stride)
    total = max((out - 1) * stride + k - n, 0)
    before = total // 2
    return np.pad(x, ((0, 0), (before, total - before), (before, total - before), (0, 0)))


def _patches(x: np.ndarray, k: int, stride: int) -> np.ndarray:
    """N x OH x OW x k x k x C windows of a SAME-padded NHWC array."""
    xp = _pad_same(x, k, stride)
    out = -(-x.shape[1] // stride)
    rows = [xp[:, i:i + stride * out:stride, j:j + stride * out:stride, :]
            for i in range(k) for j in range(k)]
    return np.stack(rows, axis=3).reshape(x.shape[0], out, out, k, k, x.shape[3])


def _conv(x, w, b, stride):  # w: O x k x k x C (TFLite layout)
    p = _patches(x, w.shape[1], stride)
    return np.einsum("nhwijc,oijc->nhwo", p, w) + b


def _dwconv(x, w, b):  # w: 1 x k x k x C
    p = _patches(x, w.shape[1], 1)
    return np.einsum("nhwijc,ijc->nhwc", p, w[0]) + b


def _relu6(x):
    return np.clip(x, 0.0, 6.0)


def _act_scale(values: np.ndarray) -> float:
    # RELU6 outputs: zero point 0, the scale covers what calibration saw.
    return _nice(min(float(values.max()), 6.0) / 255.0)


def build_demo_model() -> Model:
    """Build the demo classifier; the same bytes on every call."""
    rng = np.random.default_rng(_SEED)
    # Calibration images: the demo image variants plus seeded noise.
    calib_q = np.concatenate(
        [demo_input(v) for v in range(4)]
        + [rng.integers(0, 256, size=(4, 32, 32, 3), dtype=np.uint8)])
    x = (calib_q.astype(np.float64) - _IN_ZP) * _IN_SCALE

    def weights(shape, fan_in):
        w = rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
        q, s, zp = _quant_weights(w)
        return q, s, zp, (q.astype(np.float64) - zp) * s

    def bias(n, in_scale, w_scale):
        s = in_scale * w_scale
        q = np.rint(rng.standard_normal(n) * 0.05 / s).astype(np.int32)
        return q, s, q.astype(np.float64) * s

    b = ModelBuilder(name="main", description="coralrt demo classifier")
    t_in = b.input("input", INPUT_SHAPE, np.uint8, scale=_IN_SCALE, zero_point=_IN_ZP)

    # conv 3x3 stride 2 -> 16x16x8
    w1q, w1s, w1z, w1 = weights((8, 3, 3, 3), 27)
    b1q, b1s, b1 = bias(8, _IN_SCALE, w1s)
    h1 = _relu6(_conv(x, w1, b1, 2))
    s1 = _act_scale(h1)
    h1 = np.rint(h1 / s1) * s1  # what the next layer sees after requantization
    t_w1 = b.constant("conv1/weights", w1q, scale=w1s, zero_point=w1z)
    t_b1 = b.constant("conv1/bias", b1q, scale=b1s, zero_point=0)
    t_h1 = b.tensor("conv1/relu6", (1, 16, 16, 8), np.uint8, scale=s1, zero_point=0)
    b.op("CONV_2D", [t_in, t_w1, t_b1], [t_h1], padding="SAME", stride_w=2, stride_h=2,
         fused_activation_function="RELU6")

    # depthwise 3x3 -> 16x16x8
    w2q, w2s, w2z, w2 = weights((1, 3, 3, 8), 9)
    b2q, b2s, b2 = bias(8, s1, w2s)
    h2 = _relu6(_dwconv(h1, w2, b2))
    s2 = _act_scale(h2)
    h2 = np.rint(h2 / s2) * s2
    t_w2 = b.constant("dwconv/weights", w2q, scale=w2s, zero_point=w2z)
    t_b2 = b.constant("dwconv/bias", b2q, scale=b2s, zero_point=0)
    t_h2 = b.tensor("dwconv/relu6", (1, 16, 16, 8), np.uint8, scale=s2, zero_point=0)
    b.op("DEPTHWISE_CONV_2D", [t_h1, t_w2, t_b2], [t_h2], padding="SAME", stride_w=1,
         stride_h=1, depth_multiplier=1, fused_activation_function="RELU6")

    # pointwise 1x1 -> 16x16x16
    w3q, w3s, w3z, w3 = weights((16, 1, 1, 8), 8)
    b3q, b3s, b3 = bias(16, s2, w3s)
    h3 = _relu6(_conv(h2, w3, b3, 1))
    s3 = _act_scale(h3)
    h3 = np.rint(h3 / s3) * s3
    t_w3 = b.constant("pwconv/weights", w3q, scale=w3s, zero_point=w3z)
    t_b3 = b.constant("pwconv/bias", b3q, scale=b3s, zero_point=0)
    t_h3 = b.tensor("pwconv/relu6", (1, 16, 16, 16), np.uint8, scale=s3, zero_point=0)
    b.op("CONV_2D", [t_h2, t_w3, t_b3], [t_h3], padding="SAME", stride_w=1, stride_h=1,
         fused_activation_function="RELU6")

    # Global average pool and reshape: TFLite requires the input's quantization
    # on their outputs, so they reuse s3.
    pooled = h3.mean(axis=(1, 2))
    t_pool = b.tensor("pool", (1, 1, 1, 16), np.uint8, scale=s3, zero_point=0)
    b.op("AVERAGE_POOL_2D", [t_h3], [t_pool], padding="VALID", stride_w=1, stride_h=1,
         filter_width=16, filter_height=16)
    t_shape = b.constant("reshape/shape", np.array([1, 16], np.int32))
    t_flat = b.tensor("flatten", (1, 16), np.uint8, scale=s3, zero_point=0)
    b.op("RESHAPE", [t_pool, t_shape], [t_flat], new_shape=[1, 16])

    # Classifier: scale the random weights so the logits spread over a few
    # units across the calibration images, and centre each class's logit with
    # its bias, so that the winning class depends on the image rather than
    # on the weights alone.
    w4f = rng.standard_normal((DEMO_CLASSES, 16))
    centred = pooled - pooled.mean(axis=0)
    spread = float(np.std(centred @ w4f.T)) or 1.0
    w4q, w4s, w4z = _quant_weights(w4f * (3.0 / spread))
    w4 = (w4q.astype(np.float64) - w4z) * w4s
    b4s = s3 * w4s
    b4q = np.rint(-(pooled.mean(axis=0) @ w4.T) / b4s).astype(np.int32)
    logits = pooled @ w4.T + b4q * b4s
    lo, hi = min(float(logits.min()), 0.0), max(float(logits.max()), 0.0)
    s4 = _nice((hi - lo) / 255.0)
    z4 = int(np.clip(np.rint(-lo / s4), 0, 255))
    t_w4 = b.constant("fc/weights", w4q, scale=w4s, zero_point=w4z)
    t_b4 = b.constant("fc/bias", b4q, scale=b4s, zero_point=0)
    t_logits = b.tensor("logits", (1, DEMO_CLASSES), np.uint8, scale=s4, zero_point=z4)
    b.op("FULLY_CONNECTED", [t_flat, t_w4, t_b4], [t_logits])

    t_prob = b.tensor("probabilities", (1, DEMO_CLASSES), np.uint8, scale=1.0 / 256.0,
                      zero_point=0)
    b.op("SOFTMAX", [t_logits], [t_prob], beta=1.0)
    b.output(t_prob)
    return b.build()
