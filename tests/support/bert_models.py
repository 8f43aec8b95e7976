"""Small full-integer (int8) BERT-style encoders as ``.tflite`` bytes, built with
coralrt's :class:`~coralrt._model.builder.ModelBuilder`, in the operator forms
TensorFlow's TFLite converter emits for a quantized BERT.  Graph rewrites (and
the runtime) can be tested on them without TensorFlow or downloaded models.

    tflite = bert_encoder(**PRESETS["tiny"])            # BERT-Tiny shape
    model = build_bert(**PRESETS["wide"], gelu="tanh")  # bytes + float reference
    model.float_logits(ids)                             # (1, classes) float32

The graph, for ``input_ids`` int32 of shape (1, seq):

* embeddings: GATHER of an int8 table (vocab, hidden), ADD of a constant
  position embedding (1, seq, hidden), LayerNorm;
* LayerNorm as the converter decomposes it: MEAN over the last axis
  (keep_dims), SQUARED_DIFFERENCE(x, mean), MEAN, ADD epsilon, RSQRT,
  SUB(x, mean), MUL by the rsqrt, MUL gamma, ADD beta;
* per layer: FULLY_CONNECTED (keep_num_dims, 3-D outputs) for Q, K and V,
  each RESHAPE (1, seq, heads, dh) and TRANSPOSE (1, heads, seq, dh);
  BATCH_MATMUL(Q, K, adj_y) of two activations, MUL by 1/sqrt(dh) (or the
  factor folded into Q's weights with ``attention_scale="fold"``), SOFTMAX,
  BATCH_MATMUL(P, V), TRANSPOSE and RESHAPE back to (1, seq, hidden), the
  output projection, ADD residual, LayerNorm; FULLY_CONNECTED to
  ``intermediate``, GELU, FULLY_CONNECTED back to hidden, ADD residual,
  LayerNorm;
* GELU is the builtin operator (``approximate=False``) or, with
  ``gelu="tanh"``, the subgraph older converters produce for
  ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` (x^3 as
  MUL(MUL(x, x), x));
* head: STRIDED_SLICE of the first token (1, 1, hidden), RESHAPE (1, hidden),
  FULLY_CONNECTED to ``classes`` and DEQUANTIZE to the float32 ``logits``.

Quantization follows TFLite's int8 scheme: activations per-tensor asymmetric,
FULLY_CONNECTED weights symmetric per-channel along axis 0 with int32 bias of
scale ``in_scale * w_scale_c``; other constants per-tensor asymmetric.  Every
activation range comes from a float32 NumPy forward pass of the same graph
over a few random token sequences (min/max over the batch, zero included);
SOFTMAX (1/256, -128) and TANH (1/128, 0) outputs have the fixed parameters
the kernels require and RESHAPE / TRANSPOSE / GATHER / STRIDED_SLICE outputs
share their input's.  Ranges that hold zero make the non-negative LayerNorm
tensors (squared differences, variance, rsqrt) start at zero point -128, so
the int8 RSQRT never sees a value below zero.  Weights are random but fixed
by ``seed``, so the same arguments always give the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from coralrt.testing import ModelBuilder

__all__ = ["PRESETS", "BertConfig", "BertModel", "bert_encoder", "build_bert"]

#: Keyword arguments of the two presets: BERT-Tiny's shape and a wide
#: feed-forward (intermediate 3072, BERT-Base's) on a small hidden size.
PRESETS = {
    "tiny": dict(hidden=128, heads=2, layers=2, intermediate=512, seq=128),
    "wide": dict(hidden=128, heads=2, layers=1, intermediate=3072, seq=128),
}

#: Operator versions TensorFlow's converter gives the int8 forms.
VERSIONS = {
    "GATHER": 2, "ADD": 2, "SUB": 2, "MUL": 2, "MEAN": 2, "SQUARED_DIFFERENCE": 2,
    "RSQRT": 2, "FULLY_CONNECTED": 5, "RESHAPE": 1, "TRANSPOSE": 2, "BATCH_MATMUL": 2,
    "SOFTMAX": 2, "GELU": 2, "TANH": 2, "STRIDED_SLICE": 2, "DEQUANTIZE": 2,
}
LAYER_NORM_EPSILON = 1e-12
CALIBRATION_SAMPLES = 16

_INT8_MIN, _INT8_MAX = -128, 127


@dataclass(frozen=True)
class BertConfig:
    """The shape and the variant of one generated encoder."""

    hidden: int = 128
    heads: int = 2
    layers: int = 2
    intermediate: int = 512
    seq: int = 128
    vocab: int = 1000
    classes: int = 8
    gelu: str = "builtin"
    attention_scale: str = "mul"
    seed: int = 0

    def __post_init__(self):
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.gelu not in ("builtin", "tanh"):
            raise ValueError(f"gelu must be 'builtin' or 'tanh', not {self.gelu!r}")
        if self.attention_scale not in ("mul", "fold"):
            raise ValueError(f"attention_scale must be 'mul' or 'fold', "
                             f"not {self.attention_scale!r}")
        for name in ("hidden", "heads", "layers", "intermediate", "seq", "vocab", "classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


# -- a small graph: float semantics for calibration, emitted as TFLite -------------

@dataclass
class _Tensor:
    name: str
    shape: tuple
    kind: str            # "input" | "const" | "act" | "int32" (unquantized int32 constant)
    value: np.ndarray | None = None     # float value of a constant, data of an int32 one
    quant: str = "calib"  # "calib" | "same" | "fixed" | "const" | "fc_weight" | "bias" | "float"
    ref: tuple = ()      # "same": (source,), "bias": (fc_input, fc_weight)
    fixed: tuple = ()    # "fixed": (scale, zero_point)


@dataclass
class _Op:
    name: str
    inputs: list
    outputs: list
    fn: object
    options: dict = field(default_factory=dict)


class _Graph:
    def __init__(self):
        self.tensors: list[_Tensor] = []
        self.ops: list[_Op] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []

    def _add(self, t: _Tensor) -> int:
        self.tensors.append(t)
        return len(self.tensors) - 1

    def input(self, name, shape) -> int:
        i = self._add(_Tensor(name, tuple(shape), "input", quant="float"))
        self.inputs.append(i)
        return i

    def const(self, name, value, quant="const") -> int:
        value = np.asarray(value, np.float32)
        return self._add(_Tensor(name, value.shape, "const", value, quant=quant))

    def int32(self, name, value) -> int:
        value = np.asarray(value, np.int32)
        return self._add(_Tensor(name, value.shape, "int32", value, quant="float"))

    def op(self, name, inputs, out_name, out_shape, fn, *, quant="calib", ref=(), fixed=(),
           **options) -> int:
        out = self._add(_Tensor(out_name, tuple(out_shape), "act", quant=quant, ref=ref,
                                fixed=fixed))
        self.ops.append(_Op(name, list(inputs), [out], fn, options))
        return out

    def run(self, feeds: dict[int, np.ndarray]) -> list[np.ndarray]:
        """Float32 values of every tensor for one set of inputs."""
        values: list = [None] * len(self.tensors)
        for i, t in enumerate(self.tensors):
            if t.kind in ("const", "int32"):
                values[i] = t.value
        for i, v in feeds.items():
            values[i] = v
        for op in self.ops:
            out = op.fn(*(values[i] for i in op.inputs))
            out = np.asarray(out, np.float32)
            t = self.tensors[op.outputs[0]]
            if out.shape != t.shape:
                raise AssertionError(f"{op.name} {t.name}: float shape {out.shape}, "
                                     f"declared {t.shape}")
            values[op.outputs[0]] = out
        return values


# -- float semantics of the operators ----------------------------------------------

def _fc(x, w, b):
    return x @ w.T + b


def _bmm(adj_y):
    def fn(a, b):
        return a @ (np.swapaxes(b, -1, -2) if adj_y else b)
    return fn


def _mean(x, axis):
    return x.mean(axis=tuple(int(a) for a in axis), keepdims=True, dtype=np.float32)


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _gelu_erf(x):
    x64 = x.astype(np.float64)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return (0.5 * x64 * (1.0 + erf(x64 / math.sqrt(2.0)))).astype(np.float32)


def _strided_slice(x, begin, end, strides):
    return x[tuple(slice(int(b), int(e), int(s)) for b, e, s in zip(begin, end, strides))]


# -- the network -------------------------------------------------------------------

def _weights(cfg: BertConfig) -> dict[str, np.ndarray]:
    """Random float weights fixed by ``cfg.seed`` (drawn in one fixed order)."""
    rng = np.random.default_rng([cfg.seed, 0x6265_7274])
    h, f = cfg.hidden, cfg.intermediate

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w = {"word": normal((cfg.vocab, h), 1.0), "position": normal((1, cfg.seq, h), 0.5)}
    w["emb_gamma"], w["emb_beta"] = 1 + normal(h, 0.1), normal(h, 0.1)
    for k in range(cfg.layers):
        p = f"l{k}_"
        for name in ("q", "k", "v", "o"):
            w[p + name] = normal((h, h), 1 / math.sqrt(h))
            w[p + name + "_b"] = normal(h, 0.05)
        w[p + "ln1_gamma"], w[p + "ln1_beta"] = 1 + normal(h, 0.1), normal(h, 0.1)
        w[p + "up"], w[p + "up_b"] = normal((f, h), 1 / math.sqrt(h)), normal(f, 0.05)
        w[p + "down"], w[p + "down_b"] = normal((h, f), 1 / math.sqrt(f)), normal(h, 0.05)
        w[p + "ln2_gamma"], w[p + "ln2_beta"] = 1 + normal(h, 0.1), normal(h, 0.1)
    w["cls"], w["cls_b"] = normal((cfg.classes, h), 2 / math.sqrt(h)), normal(cfg.classes, 0.1)
    return w


def _network(cfg: BertConfig, w: dict[str, np.ndarray]) -> _Graph:
    g = _Graph()
    s, h, nh, dh = cfg.seq, cfg.hidden, cfg.heads, cfg.head_dim
    x3 = (1, s, h)

    def fc(x, name, wkey, out_features, keep_dims=True, scale=1.0):
        in_shape = g.tensors[x].shape
        wt = g.const(f"{name}/weights", w[wkey] * scale, quant="fc_weight")
        bt = g.const(f"{name}/bias", w[wkey + "_b"] * scale, quant="bias")
        g.tensors[bt].ref = (x, wt)
        out_shape = (*in_shape[:-1], out_features) if keep_dims else (1, out_features)
        return g.op("FULLY_CONNECTED", [x, wt, bt], name, out_shape, _fc,
                    keep_num_dims=keep_dims)

    def layer_norm(x, name, gkey, bkey):
        axis = g.int32(f"{name}/axis", [-1])
        m = g.op("MEAN", [x, axis], f"{name}/mean", (1, s, 1), _mean, keep_dims=True)
        sq = g.op("SQUARED_DIFFERENCE", [x, m], f"{name}/squared_difference", x3,
                  lambda a, b: (a - b) ** 2)
        var = g.op("MEAN", [sq, axis], f"{name}/variance", (1, s, 1), _mean, keep_dims=True)
        eps = g.const(f"{name}/epsilon", LAYER_NORM_EPSILON)
        ve = g.op("ADD", [var, eps], f"{name}/add_epsilon", (1, s, 1), np.add)
        r = g.op("RSQRT", [ve], f"{name}/rsqrt", (1, s, 1), lambda a: 1 / np.sqrt(a))
        c = g.op("SUB", [x, m], f"{name}/centered", x3, np.subtract)
        n = g.op("MUL", [c, r], f"{name}/normalized", x3, np.multiply)
        gam = g.const(f"{name}/gamma", w[gkey])
        y = g.op("MUL", [n, gam], f"{name}/scaled", x3, np.multiply)
        bet = g.const(f"{name}/beta", w[bkey])
        return g.op("ADD", [y, bet], f"{name}/output", x3, np.add)

    def same(src):
        return dict(quant="same", ref=(src,))

    def heads_first(x, name, perm=(0, 2, 1, 3)):
        shape = g.int32(f"{name}/shape", [1, s, nh, dh])
        r = g.op("RESHAPE", [x, shape], f"{name}/reshape", (1, s, nh, dh),
                 lambda a, sh: a.reshape(tuple(sh)), **same(x))
        p = g.int32(f"{name}/perm", list(perm))
        return g.op("TRANSPOSE", [r, p], f"{name}/transpose", (1, nh, s, dh),
                    lambda a, pp: a.transpose(tuple(pp)), **same(r))

    def gelu(x, name):
        shape = g.tensors[x].shape
        if cfg.gelu == "builtin":
            return g.op("GELU", [x], f"{name}/gelu", shape, _gelu_erf, approximate=False)
        x2 = g.op("MUL", [x, x], f"{name}/x2", shape, np.multiply)
        x3_ = g.op("MUL", [x2, x], f"{name}/x3", shape, np.multiply)
        c = g.const(f"{name}/coefficient", 0.044715)
        t = g.op("MUL", [x3_, c], f"{name}/cubic_term", shape, np.multiply)
        u = g.op("ADD", [x, t], f"{name}/inner", shape, np.add)
        k = g.const(f"{name}/sqrt_2_over_pi", math.sqrt(2 / math.pi))
        v = g.op("MUL", [u, k], f"{name}/tanh_input", shape, np.multiply)
        th = g.op("TANH", [v], f"{name}/tanh", shape, np.tanh, quant="fixed",
                  fixed=(1 / 128, 0))
        one = g.const(f"{name}/one", 1.0)
        a = g.op("ADD", [th, one], f"{name}/one_plus_tanh", shape, np.add)
        half = g.const(f"{name}/half", 0.5)
        hx = g.op("MUL", [x, half], f"{name}/half_x", shape, np.multiply)
        return g.op("MUL", [hx, a], f"{name}/gelu", shape, np.multiply)

    ids = g.input("input_ids", (1, s))
    table = g.const("embeddings/word_embeddings", w["word"])
    e = g.op("GATHER", [table, ids], "embeddings/gather", x3,
             lambda tb, i: tb[i.astype(np.int64)], axis=0, batch_dims=0, **same(table))
    pos = g.const("embeddings/position_embeddings", w["position"])
    e = g.op("ADD", [e, pos], "embeddings/add_position", x3, np.add)
    x = layer_norm(e, "embeddings/layer_norm", "emb_gamma", "emb_beta")

    inv_sqrt_dh = 1 / math.sqrt(dh)
    for k in range(cfg.layers):
        p, pre = f"l{k}_", f"encoder/layer_{k}"
        att = f"{pre}/attention"
        fold = inv_sqrt_dh if cfg.attention_scale == "fold" else 1.0
        q = heads_first(fc(x, f"{att}/query", p + "q", h, scale=fold), f"{att}/query_heads")
        kk = heads_first(fc(x, f"{att}/key", p + "k", h), f"{att}/key_heads")
        v = heads_first(fc(x, f"{att}/value", p + "v", h), f"{att}/value_heads")
        scores = g.op("BATCH_MATMUL", [q, kk], f"{att}/scores", (1, nh, s, s), _bmm(True),
                      adj_x=False, adj_y=True)
        if cfg.attention_scale == "mul":
            c = g.const(f"{att}/inv_sqrt_head_dim", inv_sqrt_dh)
            scores = g.op("MUL", [scores, c], f"{att}/scaled_scores", (1, nh, s, s),
                          np.multiply)
        probs = g.op("SOFTMAX", [scores], f"{att}/probs", (1, nh, s, s), _softmax,
                     quant="fixed", fixed=(1 / 256, -128), beta=1.0)
        ctx = g.op("BATCH_MATMUL", [probs, v], f"{att}/context", (1, nh, s, dh),
                   _bmm(False), adj_x=False, adj_y=False)
        perm = g.int32(f"{att}/context_perm", [0, 2, 1, 3])
        ctx = g.op("TRANSPOSE", [ctx, perm], f"{att}/context_transpose", (1, s, nh, dh),
                   lambda a, pp: a.transpose(tuple(pp)), **same(ctx))
        shape = g.int32(f"{att}/context_shape", [1, s, h])
        ctx = g.op("RESHAPE", [ctx, shape], f"{att}/context_reshape", x3,
                   lambda a, sh: a.reshape(tuple(sh)), **same(ctx))
        o = fc(ctx, f"{att}/output", p + "o", h)
        r = g.op("ADD", [o, x], f"{att}/residual", x3, np.add)
        x = layer_norm(r, f"{att}/layer_norm", p + "ln1_gamma", p + "ln1_beta")
        up = gelu(fc(x, f"{pre}/intermediate", p + "up", cfg.intermediate),
                  f"{pre}/intermediate")
        down = fc(up, f"{pre}/output", p + "down", h)
        r = g.op("ADD", [down, x], f"{pre}/residual", x3, np.add)
        x = layer_norm(r, f"{pre}/layer_norm", p + "ln2_gamma", p + "ln2_beta")

    begin, end = g.int32("head/begin", [0, 0, 0]), g.int32("head/end", [1, 1, h])
    strides = g.int32("head/strides", [1, 1, 1])
    first = g.op("STRIDED_SLICE", [x, begin, end, strides], "head/first_token", (1, 1, h),
                 _strided_slice, **same(x))
    shape = g.int32("head/shape", [1, h])
    first = g.op("RESHAPE", [first, shape], "head/pooled", (1, h),
                 lambda a, sh: a.reshape(tuple(sh)), **same(first))
    logits = fc(first, "head/classifier", "cls", cfg.classes, keep_dims=False)
    out = g.op("DEQUANTIZE", [logits], "logits", (1, cfg.classes), lambda a: a,
               quant="float")
    g.outputs.append(out)
    return g


# -- quantization ------------------------------------------------------------------

def _asymmetric(lo: float, hi: float) -> tuple[float, int]:
    """int8 scale and zero point for the range [lo, hi] widened to hold zero."""
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    scale = (hi - lo) / 255.0
    if scale <= 0:
        return 1.0, 0
    zp = int(np.clip(round(_INT8_MIN - lo / scale), _INT8_MIN, _INT8_MAX))
    return scale, zp


def _quantize(x: np.ndarray, scale, zp) -> np.ndarray:
    q = np.round(np.asarray(x, np.float64) / scale) + zp
    return np.clip(q, _INT8_MIN, _INT8_MAX).astype(np.int8)


def _calibration_ids(cfg: BertConfig) -> np.ndarray:
    rng = np.random.default_rng([cfg.seed, 0x63616C69])
    return rng.integers(0, cfg.vocab, (CALIBRATION_SAMPLES, 1, cfg.seq)).astype(np.int32)


def _ranges(g: _Graph, cfg: BertConfig) -> dict[int, tuple[float, float]]:
    ranges: dict[int, tuple[float, float]] = {}
    for ids in _calibration_ids(cfg):
        values = g.run({g.inputs[0]: ids})
        for op in g.ops:
            i = op.outputs[0]
            lo, hi = float(values[i].min()), float(values[i].max())
            if i in ranges:
                lo, hi = min(lo, ranges[i][0]), max(hi, ranges[i][1])
            ranges[i] = (lo, hi)
    return ranges


def _emit(g: _Graph, ranges) -> bytes:
    b = ModelBuilder(description="coralrt int8 BERT-style encoder (tests)")
    params: dict[int, tuple] = {}   # per-tensor (scale, zero_point) of int8 tensors
    fc_scales: dict[int, np.ndarray] = {}

    def per_tensor(i: int) -> tuple[float, int]:
        if i not in params:
            t = g.tensors[i]
            if t.quant == "calib":
                params[i] = _asymmetric(*ranges[i])
            elif t.quant == "fixed":
                params[i] = t.fixed
            elif t.quant == "same":
                params[i] = per_tensor(t.ref[0])
            elif t.quant == "const":
                params[i] = _asymmetric(t.value.min(), t.value.max())
            else:
                raise AssertionError(f"{t.name} has no per-tensor parameters")
        return params[i]

    for i, t in enumerate(g.tensors):
        if t.kind == "input":
            n = b.input(t.name, t.shape, np.int32)
        elif t.kind == "int32":
            n = b.tensor(t.name, t.shape, np.int32, data=t.value)
        elif t.quant == "float":
            n = b.tensor(t.name, t.shape, np.float32)
        elif t.quant == "fc_weight":
            wmax = np.abs(t.value).max(axis=tuple(range(1, t.value.ndim)))
            scales = np.where(wmax > 0, wmax / 127.0, 1.0).astype(np.float32)
            fc_scales[i] = scales
            shape = (-1,) + (1,) * (t.value.ndim - 1)
            q = np.clip(np.round(t.value / scales.reshape(shape)), -127, 127).astype(np.int8)
            n = b.tensor(t.name, t.shape, np.int8, data=q, scale=scales,
                         zero_point=np.zeros(scales.size, np.int64), axis=0)
        elif t.quant == "bias":
            x, wt = t.ref
            scales = (np.float64(per_tensor(x)[0]) * fc_scales[wt]).astype(np.float32)
            q = np.round(t.value.astype(np.float64) / scales.astype(np.float64))
            info = np.iinfo(np.int32)
            q = np.clip(q, info.min, info.max).astype(np.int32)
            n = b.tensor(t.name, t.shape, np.int32, data=q, scale=scales,
                         zero_point=np.zeros(scales.size, np.int64), axis=0)
        else:
            scale, zp = per_tensor(i)
            data = None if t.kind != "const" else _quantize(t.value, scale, zp)
            n = b.tensor(t.name, t.shape, np.int8, data=data, scale=scale, zero_point=zp)
        if n != i:
            raise AssertionError("tensor numbering diverged")
    for op in g.ops:
        version = VERSIONS[op.name]
        if op.name == "FULLY_CONNECTED" and not op.options["keep_num_dims"]:
            version = 4     # keep_num_dims is what needs version 5
        b.op(op.name, op.inputs, op.outputs, version=version, **op.options)
    b.output(*g.outputs)
    return b.build().to_bytes()


# -- public API --------------------------------------------------------------------

@dataclass
class BertModel:
    """A generated encoder: its ``.tflite`` bytes and its float32 reference."""

    config: BertConfig
    tflite: bytes
    graph: _Graph = field(repr=False)
    ranges: dict = field(repr=False)

    def float_logits(self, input_ids: np.ndarray) -> np.ndarray:
        """The float32 logits (1, classes) of the unquantized network."""
        ids = np.asarray(input_ids, np.int32).reshape(1, self.config.seq)
        return self.graph.run({self.graph.inputs[0]: ids})[self.graph.outputs[0]]

    def random_ids(self, count: int, seed: int = 1) -> np.ndarray:
        """``count`` random token sequences, shape (count, 1, seq), int32."""
        rng = np.random.default_rng([seed, 0x7465_7374])
        return rng.integers(0, self.config.vocab, (count, 1, self.config.seq)).astype(np.int32)


def build_bert(*, hidden=128, heads=2, layers=2, intermediate=512, seq=128, vocab=1000,
               classes=8, gelu="builtin", attention_scale="mul", seed=0) -> BertModel:
    """The int8 encoder for these arguments with its float reference (see the module)."""
    cfg = BertConfig(hidden=hidden, heads=heads, layers=layers, intermediate=intermediate,
                     seq=seq, vocab=vocab, classes=classes, gelu=gelu,
                     attention_scale=attention_scale, seed=seed)
    g = _network(cfg, _weights(cfg))
    ranges = _ranges(g, cfg)
    return BertModel(cfg, _emit(g, ranges), g, ranges)


def bert_encoder(*, hidden=128, heads=2, layers=2, intermediate=512, seq=128, vocab=1000,
                 classes=8, gelu="builtin", attention_scale="mul", seed=0) -> bytes:
    """The ``.tflite`` bytes of the int8 BERT-style encoder (see the module docstring)."""
    return build_bert(hidden=hidden, heads=heads, layers=layers, intermediate=intermediate,
                      seq=seq, vocab=vocab, classes=classes, gelu=gelu,
                      attention_scale=attention_scale, seed=seed).tflite
