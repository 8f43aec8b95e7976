"""pycoral.learn.imprinting.engine on coralrt: weight imprinting (low-shot transfer learning).

The base model ends ``... -> L2_NORMALIZATION -> CONV_2D (1x1) -> MUL (a scalar)
-> RESHAPE -> SOFTMAX``, the layout of Coral's "L2-norm" imprinting models (a
QUANTIZE may sit between the normalization and the convolution).  The
normalized output is the embedding; each row of the 1x1 convolution's kernel
is one class's weight vector, so the convolution computes the cosine between
the embedding and every class, and the MUL scales those cosines before the
softmax.  Training a class adds embeddings to its row; the row is normalized
and quantized when the model is written.

The numbers of images behind each imprinted class are kept in the model's
description as ``"<class> <norm>"`` lines, the format pycoral uses, so a model
retrained here can be retrained again (``keep_classes=True``) by either.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass

import numpy as np

from coralrt.errors import ModelError, TrainingError
from coralrt._model import Model
from coralrt.pycoral.learn import _graph

__all__ = ["ImprintingEngine"]

_TAIL = ["CONV_2D", "MUL", "RESHAPE", "SOFTMAX"]
_COSINE_SCALE = 1.0 / 128   # the convolution's output: a cosine, in [-1, 1]


@dataclass
class _Layout:
    """Where the parts of an imprinting model are (operator and tensor indices)."""

    l2norm: int
    fc: int
    embedding: int          # the L2_NORMALIZATION output
    dim: int
    dtype: np.dtype
    scale_factor: float     # the MUL's constant


def _fail(message: str) -> ModelError:
    return ModelError(message + " (an imprinting model ends with L2_NORMALIZATION, a 1x1 "
                      "CONV_2D, MUL by a scalar, RESHAPE and SOFTMAX; see "
                      "docs/pycoral-learn.md)")


def _find_layout(model: Model) -> _Layout:
    """The imprinting layout of ``model``; ModelError naming what does not match."""
    if len(model.subgraphs) != 1:
        raise _fail(f"Unsupported model architecture. The model has {len(model.subgraphs)} "
                    f"subgraphs; imprinting needs exactly one.")
    sg = model.main
    names = [op.name for op in sg.operators]
    l2 = [i for i, n in enumerate(names) if n == "L2_NORMALIZATION"]
    if not l2:
        raise _fail("Unsupported model architecture. Input model must have an L2Norm layer.")
    if len(l2) > 1:
        raise _fail(f"Unsupported model architecture. The model has {len(l2)} L2Norm "
                    f"layers (operators {l2}); imprinting needs exactly one.")
    if names[-4:] != _TAIL:
        raise _fail(f"The last 4 operators must be Conv2d, Mul, Reshape, Softmax; this "
                    f"model's are {names[-4:]}.")
    l2i, fc = l2[0], len(names) - 4
    gap = fc - l2i
    if gap < 1 or gap > 2 or (gap == 2 and names[l2i + 1] != "QUANTIZE"):
        raise _fail("Unsupported model architecture. L2Norm operator must be followed with "
                    "the last Conv2d operator.")
    return _check_tensors(sg, l2i, fc)


def _check_tensors(sg, l2i: int, fc: int) -> _Layout:
    """The tensors of the imprinting layers: connected, shaped and typed as they must be."""
    ops, t, gap = sg.operators, sg.tensors, fc - l2i
    emb = ops[l2i].outputs[0]
    if len(t[emb].shape) != 4 or t[emb].shape[:3] != (1, 1, 1):
        raise _fail(f"Embedding extractor's output tensor should be [1, 1, 1, x], got "
                    f"{list(t[emb].shape)}.")
    dim = t[emb].shape[3]
    conv, mul, reshape, softmax = ops[fc:]
    fed = emb if gap == 1 else ops[l2i + 1].outputs[0]
    if gap == 2 and ops[l2i + 1].inputs[0] != emb:
        raise _fail("The QUANTIZE after the L2Norm layer does not read its output.")
    chain = [(conv, fed), (mul, conv.outputs[0]), (reshape, mul.outputs[0]),
             (softmax, reshape.outputs[0])]
    for op, want in chain:
        if op.inputs[0] != want:
            raise _fail(f"Unsupported model architecture. {op.name} does not read the "
                        f"output of the operator before it.")
    kernel = t[conv.inputs[1]]
    if len(conv.inputs) < 3 or conv.inputs[2] < 0 or not t[conv.inputs[2]].is_constant:
        raise _fail("The last Conv2d has no bias.")
    if kernel.data is None or kernel.quantization is None or len(kernel.shape) != 4 \
            or kernel.shape[1:] != (1, 1, dim):
        raise _fail(f"The last Conv2d's kernel must be a quantized constant of shape "
                    f"[classes, 1, 1, {dim}], got {list(kernel.shape)}.")
    dtype = np.dtype(kernel.dtype)
    kinds = {np.dtype(t[i].dtype) for i in (emb, fed, conv.outputs[0], mul.outputs[0],
                                            softmax.outputs[0])}
    if dtype not in _graph.EIGHT_BIT or kinds != {dtype}:
        raise _fail(f"The imprinting layers must be all uint8 or all int8; found "
                    f"{sorted(k.name for k in kinds | {dtype})}.")
    factor = _graph.constant_value(t[mul.inputs[1]]) if len(mul.inputs) > 1 else None
    if factor is None or factor.size != 1 or not factor.reshape(-1)[0] > 0:
        raise _fail("The Mul after the last Conv2d must multiply by one positive constant.")
    out = t[softmax.outputs[0]]
    if len(out.shape) != 2 or out.shape[0] != 1:
        raise _fail(f"Logit output tensor should be [1, x], got {list(out.shape)}.")
    if sg.outputs != [softmax.outputs[0]]:
        raise _fail("Graph must have output from Softmax (and no other output).")
    return _Layout(l2i, fc, emb, dim, dtype, float(factor.reshape(-1)[0]))


def _read_norms(description: str) -> dict[int, float]:
    """The ``"<class> <norm>"`` lines of an imprinted model's description; {} when the
    description is anything else (a base model's converter note, say)."""
    words = description.split()
    if len(words) % 2:
        return {}
    norms = {}
    for label, norm in zip(words[::2], words[1::2]):
        try:
            norms[int(label)] = float(norm)
        except ValueError:
            return {}
    return norms


class ImprintingEngine:
    """Weight imprinting on a model with the L2-norm imprinting layout (see the module)."""

    def __init__(self, model_path, keep_classes=False):
        """``model_path``: the ``.tflite`` base model.  ``keep_classes``: keep the model's
        classes (new ones are added after them) instead of starting with none."""
        self._model = _graph.read_model(model_path)
        self._layout = _find_layout(self._model)
        # A compiled base model: the same work on its plain model, carried as the twin.
        self._plain = _graph.plain_of(model_path, self._model)
        self._plain_layout = None if self._plain is None else _find_layout(self._plain)
        self._weights: list[np.ndarray] = []     # per class: the sum of its embeddings
        self._trainable: list[bool] = []
        if keep_classes:
            self._load_classes()

    def _load_classes(self) -> None:
        sg = self._model.main
        kernel = sg.tensors[sg.operators[self._layout.fc].inputs[1]]
        rows = _graph.constant_value(kernel).reshape(kernel.shape[0], -1)
        norms = _read_norms(self._model.description)
        for i, row in enumerate(rows):
            trained = i in norms
            self._weights.append(row * norms[i] if trained else row.copy())
            self._trainable.append(trained)

    @property
    def embedding_dim(self) -> int:
        """Number of embedding dimensions."""
        return self._layout.dim

    @property
    def num_classes(self) -> int:
        """Number of classes the model has now (kept ones included)."""
        return len(self._weights)

    def serialize_extractor_model(self) -> bytes:
        """The embedding extractor (the model up to the L2 normalization) as ``bytes``."""
        twin = None if self._plain is None else \
            self._plain.extract(range(self._plain_layout.l2norm + 1))
        return _graph.serialized(self._model.extract(range(self._layout.l2norm + 1)), twin)

    def serialize_model(self) -> bytes:
        """The model with the current classes as ``bytes``; TrainingError before any."""
        if not self._weights:
            raise TrainingError("Model is not trained: call train() with at least one "
                                "embedding first (or keep_classes=True on a model that "
                                "has classes)")
        sums = np.stack(self._weights)
        twin = None if self._plain is None else \
            _imprinted(self._plain, self._plain_layout, sums, self._trainable)
        return _graph.serialized(_imprinted(self._model, self._layout, sums, self._trainable),
                                 twin)

    def train(self, embedding, class_id) -> None:
        """Add ``embedding`` (the extractor's output, ``embedding_dim`` values) to class
        ``class_id``: an existing imprinted class, or ``num_classes`` for a new one.
        Classes of the base model kept with ``keep_classes`` cannot be retrained."""
        try:
            class_id = operator.index(class_id)
        except TypeError:
            raise TrainingError(f"class_id must be an integer, got "
                                f"{type(class_id).__name__}") from None
        e = np.asarray(embedding, dtype=np.float64)
        if e.shape != (self.embedding_dim,):
            raise TrainingError(f"Invalid weights array shape: the embedding has shape "
                                f"{e.shape}, expected ({self.embedding_dim},), the "
                                f"extractor's output as classify.get_scores() gives it")
        if not np.all(np.isfinite(e)):
            raise TrainingError("the embedding holds NaN or infinite values")
        n = self.num_classes
        if class_id < 0:
            raise TrainingError(f"class_id {class_id} is negative; new classes are added "
                                f"as {n}, {n + 1}, ...")
        if class_id > n:
            raise TrainingError(f"The class index of a new category is too large: "
                                f"class_id {class_id}, but the model has {n} classes, so "
                                f"the next new class is {n}")
        if class_id < n and not self._trainable[class_id]:
            raise TrainingError(f"Cannot change the base model classes not trained with "
                                f"the imprinting method: class {class_id} came with the base "
                                f"model; new classes start at the first free id")
        if class_id == n:
            self._weights.append(np.zeros(self.embedding_dim))
            self._trainable.append(True)
        self._weights[class_id] = self._weights[class_id] + e


def _imprinted(model: Model, lay: _Layout, sums: np.ndarray, trainable: list[bool]) -> Model:
    """``model`` with its imprinting layers resized and filled for the classes ``sums``."""
    norms = np.linalg.norm(sums, axis=1)
    rows = sums / np.where(norms > 0, norms, 1.0)[:, None]
    n, dtype = len(rows), lay.dtype
    out = _graph.copy_main(model)
    sg = out.main
    t = sg.tensors
    conv, mul, reshape, softmax = sg.operators[lay.fc:]
    # Kernel: one unit vector per class, quantized with a scale from the rows themselves
    # (the components of a unit vector of many dimensions are small).
    q, w_scale, w_zp = _graph.quantize_weights(rows, dtype)
    kname, bname = t[conv.inputs[1]].name, t[conv.inputs[2]].name
    t[conv.inputs[1]] = _graph.const_tensor(kname, q.reshape(n, 1, 1, lay.dim), w_scale, w_zp)
    in_scale = t[conv.inputs[0]].quantization.params[0]
    t[conv.inputs[2]] = _graph.bias_tensor(bname, np.zeros(n), in_scale, w_scale)
    # The cosine lies in [-1, 1]; the MUL scales it by the model's factor.
    zp = 128 if dtype == np.uint8 else 0
    _resize(t, conv.outputs[0], (1, 1, 1, n), _COSINE_SCALE, zp)
    logit_scale = lay.scale_factor * _COSINE_SCALE
    _resize(t, mul.outputs[0], (1, 1, 1, n), logit_scale, zp)
    _resize(t, reshape.outputs[0], (1, n), logit_scale, zp)
    _resize(t, softmax.outputs[0], (1, n))
    i = sg.operators.index(reshape)
    if len(reshape.inputs) > 1 and reshape.inputs[1] >= 0:
        shape = t[reshape.inputs[1]]
        t[reshape.inputs[1]] = _graph.const_tensor(shape.name, np.array([1, n], np.int32))
    if reshape.options.get("new_shape"):
        sg.operators[i] = dataclasses.replace(reshape,
                                              options={**reshape.options, "new_shape": [1, n]})
    norms_text = "".join(f"{k} {norms[k]:f}\n" for k in range(n) if trainable[k])
    return dataclasses.replace(out, description=norms_text)


def _resize(tensors, index: int, shape, scale=None, zero_point=None) -> None:
    t = tensors[index]
    quant = t.quantization
    if scale is not None:
        quant = _graph.activation_tensor(t.name, shape, t.dtype, scale, zero_point).quantization
    sig = None if t.shape_signature is None else tuple(shape)
    tensors[index] = dataclasses.replace(t, shape=tuple(shape), quantization=quant,
                                         shape_signature=sig)
