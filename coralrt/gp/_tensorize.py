"""The Tensorizer: split one array operation into tile jobs and put the results
back together.

Host side (numpy, float64): quantize the operands (:mod:`coralrt.gp._scaling`),
cut them into tiles, pad the edge tiles, and afterwards dequantize each tile's
int8 result and assemble, accumulate or reduce them.  Edge TPU side: one run
of a generated tile model (:mod:`coralrt.gp._tile_models`) per job.  Jobs are
handed to ``run(key, make_model, feed, affinity) -> Future`` (the context's
scheduler) and carry only int8 arrays.

* element-wise (add, sub, mul, tanh, relu): the arrays are flattened and cut
  into 128 x 128 tiles, the last one padded with the zero point (real 0) and
  cropped after; one quantization per operand and one output quantization per
  operation, so every tile of an operation runs the same model.
* mean, max: 64 x 64 tiles; mean pads with real 0 and finishes on the CPU as
  ``sum_t 4096 mean_t / count``, max pads with the smallest int8 value and
  takes the largest tile maximum.
* GEMM ``A (M x K) @ B (K x N)``: K and N split into near-equal tiles of at most
  ``k_tile`` and ``n_tile``, M into row blocks of at most ``m_tile`` (the last one
  padded).  For each (K tile, N tile) the B tile is a constant of its own model
  (the job's affinity key, so its jobs stay on one stick) with A's K slice
  quantized once; the partial products of the K tiles are accumulated in
  float64 on the CPU.  Each row block is one CONV_2D run or one
  FULLY_CONNECTED run per row (``form``).
* conv2d: the output is cut into tiles of at most 128 x 128, each computed from
  its input window (the halo included) by the same model.
"""

from __future__ import annotations

import hashlib

import numpy as np

from coralrt.gp import _scaling as scaling, _tile_models as tm

__all__ = ["matmul", "elementwise", "unary", "reduce", "conv2d", "splits"]


def splits(n: int, most: int) -> list[slice]:
    """``n`` cut into ceil(n / most) near-equal consecutive slices."""
    parts = -(-n // most)
    size = -(-n // parts)
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def _digest(q: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(q).tobytes(), digest_size=16).hexdigest()


def _qkey(q: scaling.Quant) -> tuple:
    return (q.scale, q.zero_point)


def _flat_tiles(q: np.ndarray, tile, fill: int) -> np.ndarray:
    """Flattened int8 values padded with ``fill``: (n_tiles, 1, h, w, 1)."""
    size = tile[0] * tile[1]
    flat = q.reshape(-1)
    n = -(-flat.size // size)
    out = np.full(n * size, fill, np.int8)
    out[:flat.size] = flat
    return out.reshape(n, 1, tile[0], tile[1], 1)


def _deq_range(q: np.ndarray, quant: scaling.Quant) -> tuple[float, float]:
    return (quant.dequantize(np.array(q.min())).item(), quant.dequantize(np.array(q.max())).item())


def elementwise(run, op: str, a: np.ndarray, b: np.ndarray, rule: str) -> np.ndarray:
    """add / sub / mul of two same-shaped arrays."""
    qa, a_q = scaling.quantize(a)
    qb, b_q = scaling.quantize(b)
    out_q = scaling.elementwise_range(op, rule, _deq_range(qa, a_q), _deq_range(qb, b_q))
    name = op.upper()
    key = ("binary", name, _qkey(a_q), _qkey(b_q), _qkey(out_q))
    ta = _flat_tiles(qa, tm.ELEMENTWISE_TILE, a_q.zero_point)
    tb = _flat_tiles(qb, tm.ELEMENTWISE_TILE, b_q.zero_point)
    futures = [run(key, lambda: tm.binary(name, a_q, b_q, out_q), {"a": x, "b": y})
               for x, y in zip(ta, tb)]
    return _gather(futures, out_q, a.shape)


def unary(run, op: str, x: np.ndarray, rule: str) -> np.ndarray:
    """tanh / relu; tanh's output is TFLite's fixed 1/128 scale, relu keeps x's."""
    qx, x_q = scaling.quantize(x)
    out_q = scaling.Quant(1.0 / 128, 0) if op == "tanh" else x_q
    name = op.upper()
    key = ("unary", name, _qkey(x_q), _qkey(out_q))
    futures = [run(key, lambda: tm.unary(name, x_q, out_q), {"a": t})
               for t in _flat_tiles(qx, tm.ELEMENTWISE_TILE, x_q.zero_point)]
    return _gather(futures, out_q, x.shape)


def _gather(futures, out_q: scaling.Quant, shape) -> np.ndarray:
    flat = np.concatenate([f.result().reshape(-1) for f in futures])
    size = int(np.prod(shape, dtype=np.int64))
    return out_q.dequantize(flat[:size]).reshape(shape)


def reduce(run, op: str, x: np.ndarray) -> np.float64:
    """Whole-array mean / max: one 64 x 64 tile per job, finished on the CPU."""
    qx, x_q = scaling.quantize(x)
    name = "MEAN" if op == "mean" else "REDUCE_MAX"
    fill = x_q.zero_point if op == "mean" else -128
    key = ("reduce", name, _qkey(x_q))
    futures = [run(key, lambda: tm.reduce(name, x_q), {"a": t})
               for t in _flat_tiles(qx, tm.REDUCE_TILE, fill)]
    parts = x_q.dequantize(np.array([f.result().reshape(()) for f in futures]))
    if op == "mean":
        per_tile = tm.REDUCE_TILE[0] * tm.REDUCE_TILE[1]
        return np.float64(parts.sum() * per_tile / x.size)
    return np.float64(parts.max())


def matmul(run, a: np.ndarray, b: np.ndarray, rule: str, choose_form, *,
           m_tile: int = 128, k_tile: int = 128, n_tile: int = 128) -> np.ndarray:
    """A @ B; ``choose_form(rows, k, n)`` -> "conv" or "fc" per tile shape."""
    m, k = a.shape
    n = b.shape[1]
    rows = splits(m, m_tile)
    mt = rows[0].stop - rows[0].start
    c = np.zeros((m, n), np.float64)
    pending = []
    for ks in splits(k, k_tile):
        qa, a_q = scaling.quantize(a[:, ks])
        a_deq = a_q.dequantize(qa)
        kt = ks.stop - ks.start
        for ns in splits(n, n_tile):
            bq, b_q = scaling.quantize_symmetric(b[ks, ns])
            out_q = scaling.gemm_range(rule, a_deq, b_q.dequantize(bq))
            nt = ns.stop - ns.start
            form = choose_form(mt, kt, nt)
            bt = np.ascontiguousarray(bq.T)
            ident = ("gemm", form, mt, kt, nt, _digest(bt), _qkey(a_q), _qkey(b_q),
                     _qkey(out_q))
            make = _gemm_maker(form, mt, bt, a_q, b_q, out_q)
            for rs in rows:
                feed = _gemm_feed(form, qa[rs], mt, a_q.zero_point)
                fut = run(ident, make, feed, affinity=ident)
                pending.append((fut, rs, ns, out_q))
    for fut, rs, ns, out_q in pending:
        part = fut.result().reshape(-1, ns.stop - ns.start)
        c[rs, ns] += out_q.dequantize(part[:rs.stop - rs.start])
    return c


def _gemm_maker(form, mt, bt, a_q, b_q, out_q):
    if form == "conv":
        return lambda: tm.gemm_conv(mt, bt, a_q, b_q, out_q)
    return lambda: tm.gemm_fc(bt, a_q, b_q, out_q)


def _gemm_feed(form: str, qa: np.ndarray, mt: int, zp: int):
    """The int8 feed(s) of one row block: the strided image, or the list of
    1 x K row vectors for FULLY_CONNECTED."""
    r, kt = qa.shape
    if form == "fc":
        return [{"a": qa[i:i + 1]} for i in range(r)]
    s = tm.conv_side(kt)
    img = np.full((mt, s * s), zp, np.int8)
    img[:r, :kt] = qa
    return {"a": img.reshape(1, mt * s, s, 1)}


def conv2d(run, x: np.ndarray, w: np.ndarray, stride: int, rule: str,
           out_tile: int = 128) -> np.ndarray:
    """Single-channel VALID 2-D convolution (cross-correlation, as TFLite's)."""
    kh, kw = w.shape
    oh, ow = (x.shape[0] - kh) // stride + 1, (x.shape[1] - kw) // stride + 1
    qx, x_q = scaling.quantize(x)
    wq, w_q = scaling.quantize_symmetric(w)
    out_q = scaling.conv_range(rule, x_q.dequantize(qx), w_q.dequantize(wq))
    rs, cs = splits(oh, out_tile), splits(ow, out_tile)
    th, tw = rs[0].stop - rs[0].start, cs[0].stop - cs[0].start
    ih, iw = (th - 1) * stride + kh, (tw - 1) * stride + kw
    padded = np.full((max(rs[-1].start * stride + ih, x.shape[0]),
                      max(cs[-1].start * stride + iw, x.shape[1])), x_q.zero_point, np.int8)
    padded[:x.shape[0], :x.shape[1]] = qx
    ident = ("conv2d", ih, iw, stride, _digest(wq), _qkey(x_q), _qkey(w_q), _qkey(out_q))
    make = lambda: tm.conv2d((ih, iw), wq, stride, x_q, w_q, out_q)  # noqa: E731
    pending = []
    for r in rs:
        for c in cs:
            y0, x0 = r.start * stride, c.start * stride
            tile = padded[y0:y0 + ih, x0:x0 + iw].reshape(1, ih, iw, 1)
            pending.append((run(ident, make, {"a": tile}, affinity=ident), r, c))
    y = np.zeros((oh, ow), np.float64)
    for fut, r, c in pending:
        part = fut.result().reshape(th, tw)
        y[r, c] = out_q.dequantize(part[:r.stop - r.start, :c.stop - c.start])
    return y
