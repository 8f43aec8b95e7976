"""Classification: the best classes of a score vector."""

from __future__ import annotations

import math

import numpy as np

from coralrt.errors import InputError
from coralrt.vision._labels import label_of
from coralrt.vision._preprocess import run_image
from coralrt.vision._results import Class

__all__ = ["top_indices", "classes_from_scores", "score_output", "classes_from_outputs",
           "classify"]


def top_indices(scores, top_k=None, threshold=-math.inf) -> list[int]:
    """Indices of the ``top_k`` best ``scores`` that are >= ``threshold``, best first.

    ``top_k`` None or infinite: all of them.  The top-k cut is made before the
    threshold (as pycoral does); equal scores are ordered by index.
    """
    scores = np.asarray(scores).reshape(-1)
    n = scores.size
    k = n if top_k is None or top_k >= n else max(int(top_k), 0)
    order = np.argsort(-scores.astype(np.float64), kind="stable")[:k]
    return [int(i) for i in order if scores[i] >= threshold]


def classes_from_scores(scores, top_k=5, threshold=0.0, labels=None) -> list[Class]:
    """:class:`Class` results of a flat score vector (real values).

    A class scoring exactly 0 is left out unless ``threshold`` is negative: a
    quantized softmax gives 0 to every class it rules out, and such a class is
    no answer (so fewer than ``top_k`` may come back).
    """
    scores = np.asarray(scores).reshape(-1)
    return [Class(i, float(scores[i]), label_of(labels, i))
            for i in top_indices(scores, top_k, threshold)
            if threshold < 0 or scores[i] != 0]


def score_output(session, outputs: dict) -> np.ndarray:
    """The dequantized, flattened score vector: the model's only output of more than
    one value whose shape is [..., C] with leading ones."""
    infos = session.get_outputs()
    found = [(info, a) for info, a in zip(infos, outputs.values())
             if a.size > 1 and a.size == a.shape[-1]]
    if len(found) != 1:
        raise InputError(f"classify needs one score vector output; the model's outputs are "
                         f"{[list(a.shape) for a in outputs.values()]}")
    info, a = found[0]
    return info.dequantize(a).reshape(-1) if info.is_quantized else \
        np.asarray(a, np.float32).reshape(-1)


def classes_from_outputs(session, outputs: dict, top_k: int | None = 5,
                         threshold: float = 0.0, labels=None) -> list[Class]:
    """The classes in ``outputs``, a result of ``session.run`` or of a
    ``session.submit(...)`` future: what :func:`classify` returns, for a frame
    loop that prepares its inputs itself (:func:`~coralrt.vision.prepare`)."""
    return classes_from_scores(score_output(session, outputs), top_k, threshold, labels)


def classify(session, image, top_k: int | None = 5, threshold: float = 0.0, labels=None,
             **preprocess) -> list[Class]:
    """The ``top_k`` best classes of ``image`` scoring >= ``threshold``, best first.

    ``labels``: a dict (:func:`~coralrt.vision.read_labels`) or a sequence, or
    None.  ``preprocess``: ``fit``, ``resample``, ``mean``, ``std``, ``max_pixels`` (see
    :mod:`coralrt.vision._preprocess`).
    """
    outputs, _, _ = run_image(session, image, **preprocess)
    return classes_from_scores(score_output(session, outputs), top_k, threshold, labels)
