"""pycoral.learn.backprop.softmax_regression on coralrt: train a last layer on embeddings.

:class:`SoftmaxRegression` is multinomial logistic regression (a fully connected
layer and a softmax) trained with mini-batch SGD on a cross-entropy loss, in
NumPy on the host.  Its input is an image embedding, the output of an
embedding extractor (a classifier cut before its last layer).
:meth:`~SoftmaxRegression.serialize_model` appends the trained layer to that
extractor as quantized ``FULLY_CONNECTED`` + ``SOFTMAX`` operators, both of
which the Edge TPU maps, so the whole retrained model can run there.

Random numbers (initial weights, batches) come from NumPy's global generator:
``np.random.seed(...)`` before creating and training the model makes a run
repeatable.
"""

from __future__ import annotations

import dataclasses
import operator
import sys

import numpy as np

from coralrt.errors import ConfigError, InputError, ModelError
from coralrt._model import Model
from coralrt._model.builder import make_operator
from coralrt.pycoral.learn import _graph

__all__ = ["SoftmaxRegression"]


def _count(name: str, value) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}") from None
    if n < 1:
        raise ConfigError(f"{name} must be a positive integer, got {n}")
    return n


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class SoftmaxRegression:
    """A fully connected layer and a softmax, trained on embeddings with SGD."""

    def __init__(self, feature_dim=None, num_classes=None, weight_scale=0.01, reg=0.0):
        """``feature_dim``: the embedding length.  ``num_classes``: the number of classes.
        ``weight_scale``: the initial weights are standard normal draws times this.
        ``reg``: L2 regularization strength (the loss adds ``0.5 * reg * sum(W**2)``)."""
        self.feature_dim = _count("feature_dim", feature_dim)
        self.num_classes = _count("num_classes", num_classes)
        self.reg = float(reg)
        if not self.reg >= 0:
            raise ConfigError(f"reg must be zero or positive, got {reg!r}")
        self.weights = float(weight_scale) * np.random.standard_normal(
            (self.feature_dim, self.num_classes))
        self.biases = np.zeros(self.num_classes)
        self._seen: list[np.ndarray] = []      # the embeddings of the last training

    # -- data --------------------------------------------------------------------------

    def _matrix(self, name: str, x, allow_empty: bool = False) -> np.ndarray:
        try:
            m = np.asarray(x, dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError(f"{name} must be an array of numbers (embeddings, one per "
                             f"row), got {type(x).__name__}") from None
        if m.ndim != 2 or m.shape[1] != self.feature_dim or (not allow_empty and not len(m)):
            if allow_empty and m.size == 0:
                return np.zeros((0, self.feature_dim))
            raise InputError(f"{name} must have shape (N, {self.feature_dim}): one embedding "
                             f"of feature_dim values per row, got shape {m.shape}")
        if not np.all(np.isfinite(m)):
            raise InputError(f"{name} holds NaN or infinite values")
        return m

    def _labels(self, name: str, labels, rows: int) -> np.ndarray:
        y = np.asarray(labels)
        if y.size == 0 and rows == 0:
            return np.zeros(0, np.int64)
        if y.ndim != 1 or len(y) != rows or not np.issubdtype(y.dtype, np.integer):
            raise InputError(f"{name} must be {rows} integer class ids (one per embedding), "
                             f"got {y.dtype} of shape {y.shape}")
        bad = y[(y < 0) | (y >= self.num_classes)]
        if bad.size:
            raise InputError(f"{name} holds class id {int(bad[0])}, outside 0..."
                             f"{self.num_classes - 1} (num_classes is {self.num_classes})")
        return y.astype(np.int64)

    # -- training ----------------------------------------------------------------------

    def _logits(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weights + self.biases

    def _loss(self, probs: np.ndarray, y: np.ndarray) -> float:
        ce = -np.log(np.maximum(probs[np.arange(len(y)), y], 1e-30)).mean()
        return float(ce + 0.5 * self.reg * np.sum(self.weights ** 2))

    def get_accuracy(self, mat_x, labels) -> float:
        """The fraction (0 to 1) of the embeddings ``mat_x`` (N x feature_dim) whose
        highest-scoring class is the one in ``labels``."""
        x = self._matrix("mat_x", mat_x, allow_empty=True)
        y = self._labels("labels", labels, len(x))
        if not len(x):
            return float("nan")
        return float(np.mean(np.argmax(self._logits(x), axis=1) == y))

    def train_with_sgd(self, data, num_iter, learning_rate, batch_size=100, print_every=100):
        """Train with mini-batch SGD.

        ``data``: a dict with ``data_train`` (N x feature_dim embeddings),
        ``labels_train`` (N class ids), ``data_val`` and ``labels_val`` (the same
        for validation, may be empty).  Each of ``num_iter`` iterations draws
        ``batch_size`` training rows at random (with replacement) and takes one
        step of size ``learning_rate``.  Every ``print_every`` iterations (0:
        never) the loss and both accuracies are written to stderr.
        """
        if not isinstance(data, dict):
            raise InputError(f"data must be a dict with data_train, labels_train, data_val "
                             f"and labels_val, got {type(data).__name__}")
        missing = [k for k in ("data_train", "labels_train", "data_val", "labels_val")
                   if k not in data]
        if missing:
            raise InputError(f"data lacks {missing}: it needs data_train, labels_train, "
                             f"data_val and labels_val")
        x = self._matrix("data_train", data["data_train"])
        y = self._labels("labels_train", data["labels_train"], len(x))
        xv = self._matrix("data_val", data["data_val"], allow_empty=True)
        yv = self._labels("labels_val", data["labels_val"], len(xv))
        num_iter = operator.index(num_iter)
        batch_size = _count("batch_size", batch_size)
        print_every = operator.index(print_every)
        lr = float(learning_rate)
        if num_iter < 0 or not np.isfinite(lr) or lr <= 0:
            raise ConfigError(f"num_iter must be >= 0 and learning_rate > 0, got "
                              f"{num_iter} and {learning_rate!r}")
        for i in range(num_iter):
            rows = np.random.randint(0, len(x), batch_size)
            xb, yb = x[rows], y[rows]
            probs = _softmax(self._logits(xb))
            loss = self._loss(probs, yb)
            grad = probs
            grad[np.arange(batch_size), yb] -= 1.0
            grad /= batch_size                       # d(mean cross-entropy)/d(logits)
            self.weights -= lr * (xb.T @ grad + self.reg * self.weights)
            self.biases -= lr * grad.sum(axis=0)
            if print_every > 0 and i % print_every == 0:
                print(f"Loss: {loss:.6f}  Train Acc: {self.get_accuracy(x, y):.4f}  "
                      f"Valid Acc: {self.get_accuracy(xv, yv):.4f}", file=sys.stderr)
        self._seen = [x, xv]

    # -- the model -----------------------------------------------------------------------

    def serialize_model(self, in_model_path) -> bytes:
        """The embedding extractor ``in_model_path`` with the trained layer appended
        (``FULLY_CONNECTED`` + ``SOFTMAX``, 8-bit like the extractor's output), as
        ``bytes``.  The layer's output range is that of the logits on the last
        training and validation data (before any training: a bound from the
        weights and the extractor's output range)."""
        model = _graph.read_model(in_model_path)
        plain = _graph.plain_of(in_model_path, model)
        logits = self._logit_range(model)
        twin = None if plain is None else \
            _append_layer(plain, self.weights.T, self.biases, logits, self.feature_dim)
        return _graph.serialized(_append_layer(model, self.weights.T, self.biases, logits,
                                               self.feature_dim), twin)

    def _logit_range(self, model: Model) -> tuple[float, float]:
        seen = [m for m in self._seen if len(m)]
        if seen:
            logits = self._logits(np.concatenate(seen))
            return float(logits.min()), float(logits.max())
        sg = model.main
        out = sg.tensors[sg.outputs[0]] if len(sg.outputs) == 1 else None
        if out is None or out.quantization is None or out.dtype not in _graph.EIGHT_BIT:
            return -1.0, 1.0         # _append_layer refuses such a model anyway
        info = np.iinfo(out.dtype)
        scale, zp = out.quantization.params
        reach = max(abs(scale * (info.min - zp)), abs(scale * (info.max - zp)))
        bound = reach * np.abs(self.weights).sum(axis=0) + np.abs(self.biases)
        return -float(bound.max()), float(bound.max())


def _append_layer(model: Model, w: np.ndarray, b: np.ndarray, logit_range, feature_dim: int
                  ) -> Model:
    """``model`` (one output: the embedding) followed by FULLY_CONNECTED (weights ``w``,
    classes x features; biases ``b``) and SOFTMAX."""
    if len(model.subgraphs) != 1:
        raise ModelError(f"Model must have one and only one subgraph. Actual: "
                         f"{len(model.subgraphs)}.")
    sg = model.main
    if len(sg.outputs) != 1:
        raise ModelError(f"Model must have one and only one output. Actual: "
                         f"{len(sg.outputs)}.")
    emb = sg.tensors[sg.outputs[0]]
    dtype = emb.dtype
    if dtype not in _graph.EIGHT_BIT or emb.quantization is None \
            or emb.quantization.per_channel:
        raise ModelError(f"the embedding extractor's output must be a uint8 or int8 tensor "
                         f"quantized per tensor, got {emb.type_name}: pass a quantized "
                         f"embedding extractor (a classifier cut before its last layer)")
    if not emb.shape or emb.shape[-1] != feature_dim or int(np.prod(emb.shape)) != feature_dim:
        raise ModelError(f"the embedding extractor's output has shape {list(emb.shape)}; "
                         f"this SoftmaxRegression was made for one embedding of "
                         f"feature_dim={feature_dim} values ([1, {feature_dim}] or "
                         f"[1, 1, 1, {feature_dim}])")
    n = len(b)
    in_scale, _ = emb.quantization.params
    q, w_scale, w_zp = _graph.quantize_weights(w, dtype)
    out = _graph.copy_main(model)
    t = out.main.tensors

    def add(tensor) -> int:
        t.append(tensor)
        return len(t) - 1

    kernel = add(_graph.const_tensor("retrained/fc/weights", q, w_scale, w_zp))
    bias = add(_graph.bias_tensor("retrained/fc/bias", b, in_scale, w_scale))
    scale, zp = _graph.activation_params(*logit_range, dtype)
    logits = add(_graph.activation_tensor("retrained/fc/logits", (1, n), dtype, scale, zp))
    probs = add(_graph.activation_tensor("retrained/softmax", (1, n), dtype, 1 / 256,
                                         0 if dtype == np.uint8 else -128))
    fc = make_operator("FULLY_CONNECTED", [out.main.outputs[0], kernel, bias], [logits])
    softmax = make_operator("SOFTMAX", [logits], [probs], beta=1.0)
    out.main.operators += [fc, softmax]
    out.main.outputs[:] = [probs]
    return dataclasses.replace(out, description="retrained with coralrt softmax regression")
