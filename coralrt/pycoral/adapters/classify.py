"""Classification results: scores (dequantized) and the top classes."""

from __future__ import annotations

import collections
import math

import numpy as np

from coralrt.vision._classify import top_indices

__all__ = ["Class", "num_classes", "get_scores", "get_classes_from_scores", "get_classes"]

Class = collections.namedtuple("Class", ["id", "score"])
Class.__doc__ = "One classification result: class ``id`` (int) and its ``score`` (float)."


def num_classes(interpreter) -> int:
    """Number of scores in output 0 (the product of its shape)."""
    return int(np.prod(interpreter.get_output_details()[0]["shape"]))


def get_scores(interpreter) -> np.ndarray:
    """Output 0 flattened into a new array, dequantized when its type is an integer.

    Integer outputs become ``scale * (q - zero_point)`` (float64, computed
    without overflow); float outputs are copied as they are.
    """
    details = interpreter.get_output_details()[0]
    data = interpreter.tensor(details["index"])().flatten()
    if np.issubdtype(details["dtype"], np.integer):
        scale, zero_point = details["quantization"]
        return scale * (data.astype(np.int64) - zero_point)
    return data.copy()


def get_classes_from_scores(scores, top_k=None, score_threshold=-math.inf) -> list[Class]:
    """The ``top_k`` best classes whose score is >= ``score_threshold``, best first.

    ``scores``: the flattened, dequantized model output.  ``top_k`` None (or
    infinity) means every class.  The top-k cut is made before the threshold,
    as pycoral does; equal scores are ordered by class id.
    """
    scores = np.asarray(scores).reshape(-1)
    return [Class(i, float(scores[i])) for i in top_indices(scores, top_k, score_threshold)]


def get_classes(interpreter, top_k=None, score_threshold=-math.inf) -> list[Class]:
    """:func:`get_classes_from_scores` applied to :func:`get_scores` of ``interpreter``."""
    return get_classes_from_scores(get_scores(interpreter), top_k, score_threshold)
