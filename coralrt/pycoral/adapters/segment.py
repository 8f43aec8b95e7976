"""Semantic segmentation output, as pycoral reads it."""

from __future__ import annotations

import numpy as np

__all__ = ["get_output"]


def get_output(interpreter) -> np.ndarray:
    """Output 0's first batch item as a new uint8 array (class ids, or per-class scores)."""
    index = interpreter.get_output_details()[0]["index"]
    return interpreter.tensor(index)()[0].astype(np.uint8)
