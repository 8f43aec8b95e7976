"""Reading and writing a model's tensors through the ``tflite_runtime`` Interpreter API.

Any Interpreter with that API works: coralrt's (:mod:`coralrt.tflite`),
LiteRT's or tflite_runtime's.  As in pycoral, "the input" is input 0 and
image inputs are NHWC with a batch of one.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from coralrt.vision._preprocess import fit_size

__all__ = ["output_tensor", "input_details", "input_size", "input_tensor", "set_input",
           "set_resized_input"]


def output_tensor(interpreter, i: int) -> np.ndarray:
    """Output ``i`` of the last ``invoke()``, as a view of the interpreter's buffer."""
    index = interpreter.get_output_details()[i]["index"]
    return interpreter.tensor(index)()


def input_details(interpreter, key: str) -> Any:
    """Field ``key`` (``"shape"``, ``"index"``, ``"dtype"``, ``"quantization"`` ...) of input 0."""
    return interpreter.get_input_details()[0][key]


def input_size(interpreter) -> tuple[int, int]:
    """(width, height) of input 0, an NHWC tensor."""
    _, height, width, _ = input_details(interpreter, "shape")
    return int(width), int(height)


def input_tensor(interpreter) -> np.ndarray:
    """Writable (height, width, channels) view of input 0's buffer (batch item 0)."""
    return interpreter.tensor(input_details(interpreter, "index"))()[0]


def set_input(interpreter, data) -> None:
    """Copy ``data`` (broadcastable to (height, width, channels)) into input 0."""
    input_tensor(interpreter)[:, :] = data


def set_resized_input(interpreter, size: tuple[int, int],
                      resize: Callable[[tuple[int, int]], Any]):
    """Fit an image of ``size`` (width, height) into input 0, keeping its aspect ratio.

    The scale is the largest that fits both sides; ``resize((w, h))`` is called
    with the scaled size (each side truncated to an int) and must return the
    image at that size (a PIL image or an array).  It is written at the
    top-left corner and the rest of the input is zero.  Returns
    ``(resized image, (scale, scale))``, the second item suited to
    :func:`coralrt.pycoral.adapters.detect.get_objects`'s ``image_scale``.
    """
    width, height = input_size(interpreter)
    w, h, scale = fit_size(size, (width, height))
    tensor = input_tensor(interpreter)
    tensor.fill(0)
    channels = tensor.shape[-1]
    result = resize((w, h))
    tensor[:h, :w] = np.reshape(result, (h, w, channels))
    return result, (scale, scale)
