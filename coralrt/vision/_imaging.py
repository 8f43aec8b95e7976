"""Images as arrays: decoding (Pillow, imported only when needed) and resizing.

Every helper works on (height, width, 3) uint8 RGB arrays.  Pillow is needed to
decode a file, to resize with anything but nearest-neighbour, and to draw; an
array that already has the size a model wants needs nothing.

A file is decoded only once its header is read and the size it declares is
within ``max_pixels`` (:data:`DEFAULT_MAX_IMAGE_PIXELS` unless raised), so a
small file that claims to be a huge image costs nothing; whatever else stops
Pillow decoding a file (its own limits on compressed metadata, a broken or
truncated file) is an :class:`~coralrt.errors.InputError` naming the file.
"""

from __future__ import annotations

import os

import numpy as np

from coralrt.errors import CoralRTError, InputError

__all__ = ["PillowMissing", "require_pillow", "as_rgb_array", "resize", "RESAMPLE",
           "DEFAULT_MAX_IMAGE_PIXELS", "check_max_pixels"]

PILLOW_HINT = "pip install 'coralrt[image]'"

#: The largest image file decoded unless ``max_pixels`` says otherwise: the size
#: from which Pillow itself warns of a decompression bomb (9459 x 9459, a 89.5
#: megapixel photo; about 270 MB once decoded to RGB).
DEFAULT_MAX_IMAGE_PIXELS = 89_478_485

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


def check_max_pixels(max_pixels) -> int:
    """``max_pixels`` (None: the default) as a positive int; InputError otherwise."""
    if max_pixels is None:
        return DEFAULT_MAX_IMAGE_PIXELS
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, (int, np.integer)) \
            or max_pixels < 1:
        raise InputError(f"max_pixels must be a positive whole number of pixels, not "
                         f"{max_pixels!r}")
    return int(max_pixels)


def as_rgb_array(image, *, max_pixels: int | None = None) -> np.ndarray:
    """A (height, width, 3) uint8 RGB array of ``image``: a path, a PIL image or an array.

    Arrays must already be RGB uint8 (height, width, 3); (height, width) gray
    arrays are repeated over three channels.  Files are decoded with Pillow and
    converted to RGB, once the size in their header is found to be at most
    ``max_pixels`` (None: :data:`DEFAULT_MAX_IMAGE_PIXELS`); a larger one, and a
    file Pillow cannot decode for any reason, raise InputError.
    """
    if isinstance(image, (str, os.PathLike)):
        limit = check_max_pixels(max_pixels)
        Image = require_pillow("reading an image file")
        if not os.path.isfile(image):
            raise InputError(f"image file {os.fspath(image)!r} does not exist")
        return _decode(Image, image, limit)
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


def _too_large(name: str, size: str, limit: int) -> InputError:
    allowed = f"the {limit} pixels allowed" if limit != DEFAULT_MAX_IMAGE_PIXELS else \
        f"the {limit} pixels allowed by default"
    return InputError(f"{name!r} declares {size}, more than {allowed}: it is not decoded; "
                      f"if the file is trusted, pass a larger max_pixels= (coralrt run: "
                      f"--max-image-pixels)")


def _decode(Image, path, limit: int) -> np.ndarray:
    name = os.fspath(path)
    try:
        with Image.open(path) as im:            # reads the header only
            width, height = im.size
            if width * height > limit:
                raise _too_large(name, f"a {width}x{height} image ({width * height} pixels)",
                                 limit)
            return np.asarray(im.convert("RGB"))
    except InputError:
        raise
    except Image.DecompressionBombError as e:
        # Pillow's own refusal at open, past twice its PIL.Image.MAX_IMAGE_PIXELS.
        pillow = Image.MAX_IMAGE_PIXELS
        if pillow is not None and limit <= 2 * pillow:
            raise _too_large(name, f"an image of more than {2 * pillow} pixels", limit) \
                from None
        raise InputError(f"cannot read {name!r} as an image: Pillow refuses it ({e}); to "
                         f"decode it anyway, raise Pillow's own PIL.Image.MAX_IMAGE_PIXELS "
                         f"too") from None
    except MemoryError:
        raise InputError(f"cannot read {name!r} as an image: not enough memory to decode "
                         f"it; pass a smaller max_pixels to refuse such files at once") from None
    except Exception as e:  # noqa: BLE001 - whatever stops Pillow decoding this file
        # OSError (unidentified, truncated), ValueError (compressed metadata over
        # Pillow's limits), SyntaxError (broken chunks) ...
        why = f"{type(e).__name__}: {e}"
        if isinstance(e, ValueError) and "MAX_TEXT" in str(e):
            why = (f"its compressed metadata (a PNG text chunk or ICC profile) decompresses "
                   f"beyond Pillow's limit ({e}): a decompression bomb, or metadata to strip "
                   f"from the file")
        raise InputError(f"cannot read {name!r} as an image: {why}") from None


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
