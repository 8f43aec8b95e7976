"""Images as arrays: decoding (Pillow, imported only when needed) and resizing.

Every helper works on (height, width, 3) uint8 RGB arrays.  Pillow is needed to
decode a file, to resize with anything but nearest-neighbour, and to draw; an
array that already has the size a model wants needs nothing.
"""

from __future__ import annotations

import os

import numpy as np

from coralrt.errors import CoralRTError, InputError

__all__ = ["PillowMissing", "require_pillow", "as_rgb_array", "resize", "RESAMPLE"]

PILLOW_HINT = "pip install 'coralrt[image]'"

# Names accepted for ``resample`` -> Pillow's Image.Resampling member name.
RESAMPLE = {"nearest": "NEAREST", "bilinear": "BILINEAR", "bicubic": "BICUBIC",
            "lanczos": "LANCZOS", "antialias": "LANCZOS", "box": "BOX", "hamming": "HAMMING"}


class PillowMissing(CoralRTError, ImportError):
    """Pillow is needed for this and is not installed."""


def require_pillow(what: str):
    """The ``PIL.Image`` module, or :class:`PillowMissing` naming the extra to install."""
    try:
        from PIL import Image
    except ImportError:
        raise PillowMissing(f"{what} needs Pillow, which is not installed: "
                            f"{PILLOW_HINT}") from None
    return Image


def as_rgb_array(image) -> np.ndarray:
    """A (height, width, 3) uint8 RGB array of ``image``: a path, a PIL image or an array.

    Arrays must already be RGB uint8 (height, width, 3); (height, width) gray
    arrays are repeated over three channels.  Files are decoded with Pillow and
    converted to RGB.
    """
    if isinstance(image, (str, os.PathLike)):
        Image = require_pillow("reading an image file")
        if not os.path.isfile(image):
            raise InputError(f"image file {os.fspath(image)!r} does not exist")
        try:
            with Image.open(image) as im:
                return np.asarray(im.convert("RGB"))
        except OSError as e:   # Pillow's UnidentifiedImageError is an OSError
            raise InputError(f"cannot read {os.fspath(image)!r} as an image: {e}") from None
    if isinstance(image, np.ndarray):
        if image.ndim == 2:
            image = np.repeat(image[:, :, None], 3, axis=2)
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise InputError(f"image arrays must be (height, width, 3) uint8 RGB, got "
                             f"{image.dtype.name} of shape {list(image.shape)}")
        return image
    if hasattr(image, "convert") and hasattr(image, "size"):   # a PIL image
        return np.asarray(image.convert("RGB"))
    raise InputError(f"expected an image path, a PIL image or a numpy array, got "
                     f"{type(image).__name__}")


def _nearest_index(n_out: int, n_in: int, start: float = 0.0, extent: float | None = None):
    # Pillow's nearest: source pixel floor(start + (i + 0.5) * extent / n_out).
    extent = n_in if extent is None else extent
    idx = np.floor(start + (np.arange(n_out) + 0.5) * (extent / n_out)).astype(np.int64)
    return np.clip(idx, 0, n_in - 1)


def resize(array: np.ndarray, size: tuple[int, int], resample: str = "bilinear",
           box: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """``array`` (or its ``box`` region, (x0, y0, x1, y1)) resized to ``size`` (width, height).

    Nearest-neighbour is computed in NumPy (the same pixels Pillow picks); the
    other methods are Pillow's.  Same size and no box: the array itself.
    """
    w, h = size
    x0, y0, x1, y1 = box if box is not None else (0, 0, array.shape[1], array.shape[0])
    if (x1 - x0, y1 - y0) == (w, h):
        return array[y0:y1, x0:x1]
    key = resample.lower()
    if key not in RESAMPLE:
        raise InputError(f"unknown resample {resample!r}; choose one of "
                         f"{', '.join(sorted(RESAMPLE))}")
    if key == "nearest":
        rows = _nearest_index(h, array.shape[0], y0, y1 - y0)
        cols = _nearest_index(w, array.shape[1], x0, x1 - x0)
        return array[rows[:, None], cols[None, :]]
    Image = require_pillow(f"resizing with {resample!r}")
    method = getattr(Image.Resampling, RESAMPLE[key])
    return np.asarray(Image.fromarray(array).resize((w, h), method, box=(x0, y0, x1, y1)))
