"""The generated tile models: one small int8 TFLite model per tile operation.

Each model is built with :class:`coralrt._model.builder.ModelBuilder`, per-tensor
int8 in and out (no QUANTIZE/DEQUANTIZE: the host quantizes and dequantizes, see
:mod:`coralrt.gp._scaling`), and runs through the ordinary ``InferenceSession``
just-in-time path, so it is compiled, cached on disk and run on a stick like
any other model.  Every form here maps entirely to the Edge TPU (one segment,
placement all "tpu"; checked by :func:`check_mapped` when a session is made):

* ``gemm_fc``: FULLY_CONNECTED of one row of A (a 1 x K vector) by the constant
  B tile; the Edge TPU maps FULLY_CONNECTED only when its output is a vector,
  so a tile of M rows takes M runs.
* ``gemm_conv``: the study's strided layout.  With ``s = ceil(sqrt K)``, row i of
  A is an s x s block (zero-padded past K) at rows ``i s .. i s + s - 1`` of a
  ``(1, M s, s, 1)`` image; column j of B is the j-th s x s kernel of a CONV_2D
  with stride s and VALID padding, so output ``(0, i, 0, j)`` is exactly the
  dot product of row i and column j: one run per tile.
* ``binary`` (ADD, SUB, MUL), ``unary`` (TANH, RELU) on ``(1, 128, 128, 1)``
  tiles; ``reduce`` (MEAN, REDUCE_MAX over axes 1, 2) on ``(1, 64, 64, 1)``.
* ``conv2d``: a single-channel CONV_2D (VALID) of an image tile by a constant
  kernel.

:func:`estimate_gemm_forms` compiles both GEMM forms for a tile shape and reads
the latency model's device time from ``profile()``; the context uses it to pick
the form (CONV_2D for any tile of 2 or more rows, FULLY_CONNECTED by a few
microseconds for a single row).

Models holding data (B, the conv kernel) are compiled per distinct content: on
``coral`` each new one goes through edgetpu_compiler (or a compile service) once,
after which the on-disk cache serves it.
"""

from __future__ import annotations

import math

import numpy as np

from coralrt.errors import ModelError
from coralrt.gp._scaling import Quant
from coralrt._model.builder import ModelBuilder
from coralrt._session import InferenceSession

__all__ = ["gemm_fc", "gemm_conv", "conv_side", "binary", "unary", "reduce", "conv2d",
           "check_mapped", "estimate_gemm_forms", "ELEMENTWISE_TILE", "REDUCE_TILE"]

ELEMENTWISE_TILE = (128, 128)
REDUCE_TILE = (64, 64)
_VERSIONS = {"FULLY_CONNECTED": 4, "CONV_2D": 3, "ADD": 2, "SUB": 2, "MUL": 2, "TANH": 2,
             "RELU": 2, "MEAN": 2, "REDUCE_MAX": 2}


def _q(quant: Quant) -> dict:
    return dict(scale=quant.scale, zero_point=quant.zero_point)


def conv_side(k: int) -> int:
    """The side s of the s x s block a length-k row becomes: ceil(sqrt k)."""
    return math.isqrt(k - 1) + 1 if k > 1 else 1


def _weights(b: ModelBuilder, bq: np.ndarray, wq: Quant, in_q: Quant, n: int):
    w = b.constant("b", bq, np.int8, scale=wq.scale, zero_point=0)
    bias = b.constant("bias", np.zeros(n, np.int32), np.int32,
                      scale=float(np.float32(in_q.scale * wq.scale)), zero_point=0)
    return w, bias


def gemm_fc(bq: np.ndarray, a_q: Quant, b_q: Quant, out_q: Quant) -> bytes:
    """FULLY_CONNECTED: input ``a`` (1, K) int8, constant ``bq`` (N, K) (B^T),
    output ``c`` (1, N)."""
    n, k = bq.shape
    b = ModelBuilder(name="gp_gemm_fc", description="coralrt.gp tile")
    x = b.input("a", (1, k), np.int8, **_q(a_q))
    w, bias = _weights(b, np.ascontiguousarray(bq), b_q, a_q, n)
    y = b.tensor("c", (1, n), np.int8, **_q(out_q))
    b.op("FULLY_CONNECTED", [x, w, bias], [y], version=_VERSIONS["FULLY_CONNECTED"])
    b.output(y)
    return b.build().to_bytes()


def gemm_conv(rows: int, bq: np.ndarray, a_q: Quant, b_q: Quant, out_q: Quant) -> bytes:
    """CONV_2D in the strided layout: input ``a`` (1, rows s, s, 1), constant
    kernels from ``bq`` (N, K) (B^T, zero-padded to s*s), output ``c``
    (1, rows, 1, N)."""
    n, k = bq.shape
    s = conv_side(k)
    kern = np.zeros((n, s * s), np.int8)
    kern[:, :k] = bq
    b = ModelBuilder(name="gp_gemm_conv", description="coralrt.gp tile")
    x = b.input("a", (1, rows * s, s, 1), np.int8, **_q(a_q))
    w, bias = _weights(b, kern.reshape(n, s, s, 1), b_q, a_q, n)
    y = b.tensor("c", (1, rows, 1, n), np.int8, **_q(out_q))
    b.op("CONV_2D", [x, w, bias], [y], version=_VERSIONS["CONV_2D"], stride_w=s,
         stride_h=s, padding="VALID")
    b.output(y)
    return b.build().to_bytes()


def binary(op: str, a_q: Quant, b_q: Quant, out_q: Quant,
           tile=ELEMENTWISE_TILE) -> bytes:
    """ADD / SUB / MUL of two ``(1, h, w, 1)`` int8 tiles ``a`` and ``b``."""
    shape = (1, *tile, 1)
    b = ModelBuilder(name=f"gp_{op.lower()}", description="coralrt.gp tile")
    x = b.input("a", shape, np.int8, **_q(a_q))
    z = b.input("b", shape, np.int8, **_q(b_q))
    y = b.tensor("c", shape, np.int8, **_q(out_q))
    b.op(op, [x, z], [y], version=_VERSIONS[op])
    b.output(y)
    return b.build().to_bytes()


def unary(op: str, in_q: Quant, out_q: Quant, tile=ELEMENTWISE_TILE) -> bytes:
    """TANH / RELU of a ``(1, h, w, 1)`` int8 tile ``a``."""
    shape = (1, *tile, 1)
    b = ModelBuilder(name=f"gp_{op.lower()}", description="coralrt.gp tile")
    x = b.input("a", shape, np.int8, **_q(in_q))
    y = b.tensor("c", shape, np.int8, **_q(out_q))
    b.op(op, [x], [y], version=_VERSIONS[op])
    b.output(y)
    return b.build().to_bytes()


def reduce(op: str, in_q: Quant, tile=REDUCE_TILE) -> bytes:
    """MEAN / REDUCE_MAX of a ``(1, h, w, 1)`` tile over axes 1 and 2, output
    ``c`` (1, 1, 1, 1) in the input's quantization."""
    b = ModelBuilder(name=f"gp_{op.lower()}", description="coralrt.gp tile")
    x = b.input("a", (1, *tile, 1), np.int8, **_q(in_q))
    axes = b.constant("axes", np.array([1, 2], np.int32), np.int32)
    y = b.tensor("c", (1, 1, 1, 1), np.int8, **_q(in_q))
    b.op(op, [x, axes], [y], version=_VERSIONS[op], keep_dims=True)
    b.output(y)
    return b.build().to_bytes()


def conv2d(tile_hw, wq: np.ndarray, stride: int, x_q: Quant, w_q: Quant,
           out_q: Quant) -> bytes:
    """Single-channel CONV_2D (VALID, ``stride``) of an input tile ``a``
    (1, h, w, 1) by the constant kernel ``wq`` (kh, kw)."""
    h, w = tile_hw
    kh, kw = wq.shape
    oh, ow = (h - kh) // stride + 1, (w - kw) // stride + 1
    b = ModelBuilder(name="gp_conv2d", description="coralrt.gp tile")
    x = b.input("a", (1, h, w, 1), np.int8, **_q(x_q))
    kern, bias = _weights(b, wq.reshape(1, kh, kw, 1), w_q, x_q, 1)
    y = b.tensor("c", (1, oh, ow, 1), np.int8, **_q(out_q))
    b.op("CONV_2D", [x, kern, bias], [y], version=_VERSIONS["CONV_2D"], stride_w=stride,
         stride_h=stride, padding="VALID")
    b.output(y)
    return b.build().to_bytes()


def check_mapped(session, what: str) -> None:
    """Raise :class:`~coralrt.errors.ModelError` unless every operator of ``session`` runs
    on the Edge TPU (no-op on the CPU target)."""
    info = session.compile_info
    if not info:
        return
    off = [p for p in info.get("placement", ()) if p[0] != "tpu"]
    if off:
        raise ModelError(f"coralrt.gp tile model {what} does not map entirely to the "
                               f"Edge TPU: {off[0][2]}")


def estimate_gemm_forms(rows: int, k: int, n: int) -> dict:
    """Estimated Edge TPU seconds of one (rows x k) @ (k x n) tile in each form:
    both models are compiled for a private simulated stick and run once, and the
    latency model's device time is read from ``profile()`` (FULLY_CONNECTED: one
    run per row, so ``rows`` times the one-row figure)."""
    rng = np.random.default_rng(0)
    bt = rng.integers(-127, 128, (n, k)).astype(np.int8)
    q = Quant(1.0 / 64, 0)
    out = {}
    for form, model, feed in (
            ("fc", gemm_fc(bt, q, q, q), np.zeros((1, k), np.int8)),
            ("conv", gemm_conv(rows, bt, q, q, q),
             np.zeros((1, rows * conv_side(k), conv_side(k), 1), np.int8))):
        with InferenceSession(model, target="sim") as session:
            session.run(feed)
            t = sum(r.get("device_seconds") or 0.0 for r in session.profile())
        out[form] = t * (rows if form == "fc" else 1)
    return out
