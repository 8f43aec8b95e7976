"""From an image to a model's input tensor, and back from input pixels to image pixels.

Two steps, both documented in docs/vision.md:

1. **Geometry** (:class:`Placement`): the image is resized to the input's
   width and height with ``resample`` (default bilinear), after one of three
   fits: ``"stretch"`` (each side to the input's side), ``"crop"`` (keep the
   aspect ratio; the largest centred region of the input's aspect ratio is
   resized to fill the input) or ``"letterbox"`` (keep the aspect ratio; the
   whole image, scaled by ``min(W / w, H / h)`` with each side truncated to
   an int, is centred on a black canvas).  Every fit is an affine map
   ``input = image * scale + offset`` per axis, which :class:`Placement` keeps
   so results map back to image pixels.
2. **Values** (:func:`to_tensor`): pixels ``p`` in 0..255 become the input's type.
   With ``mean`` and ``std`` both None (the default) a uint8 input gets the
   pixel bytes as they are (``q = p``) and an int8 input ``q = p - 128``:
   the input's quantization already says what real value a byte stands for
   (MobileNet: scale 1/128, zero point 128, so ``real = (p - 128) / 128``).
   Otherwise ``real = (p - mean) / std`` and ``q = round(real / scale +
   zero_point)`` clipped to the type (round half away from zero), where a
   missing ``mean`` is ``zero_point`` (+128 for int8) and a missing ``std`` is
   ``1 / scale``.  Float inputs get ``real = (p - mean) / std`` with defaults
   mean 0 and std 1 (real = the pixel value); other integer inputs get ``p``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coralrt.errors import InputError
from coralrt._tensors import TensorInfo
from coralrt.vision._imaging import as_rgb_array, resize

__all__ = ["FITS", "Placement", "fit_size", "image_input", "to_tensor", "prepare",
           "run_image"]

FITS = ("stretch", "crop", "letterbox")


def fit_size(image_size: tuple[int, int], input_size: tuple[int, int]
             ) -> tuple[int, int, float]:
    """(width, height, scale) of an image of ``image_size`` scaled to fit in ``input_size``
    keeping its aspect ratio: ``scale = min(W / w, H / h)``, each side truncated."""
    (w, h), (width, height) = image_size, input_size
    scale = min(width / w, height / h)
    return int(w * scale), int(h * scale), scale


@dataclass(frozen=True)
class Placement:
    """Where an image went in the input: ``input = image * scale + offset`` per axis.

    ``box`` is the region of the image (x0, y0, x1, y1) that was resized to
    ``resized`` (width, height) and put at ``paste`` (x, y) in the input.
    """

    image_size: tuple[int, int]
    input_size: tuple[int, int]
    fit: str
    scale_x: float
    scale_y: float
    offset_x: float
    offset_y: float
    box: tuple[int, int, int, int]
    resized: tuple[int, int]
    paste: tuple[int, int]

    @classmethod
    def compute(cls, image_size, input_size, fit: str = "stretch") -> Placement:
        """The placement of an image of ``image_size`` in an input of ``input_size``
        (both (width, height))."""
        (w, h), (width, height) = map(tuple, (image_size, input_size))
        if w <= 0 or h <= 0:
            raise InputError(f"empty image ({w}x{h})")
        if fit == "stretch":
            return cls((w, h), (width, height), fit, width / w, height / h, 0.0, 0.0,
                       (0, 0, w, h), (width, height), (0, 0))
        if fit == "letterbox":
            rw, rh, _ = fit_size((w, h), (width, height))
            rw, rh = max(rw, 1), max(rh, 1)
            px, py = (width - rw) // 2, (height - rh) // 2
            return cls((w, h), (width, height), fit, rw / w, rh / h, float(px), float(py),
                       (0, 0, w, h), (rw, rh), (px, py))
        if fit == "crop":
            if w * height > h * width:       # wider than the input: crop left and right
                cw, ch = max(1, min(w, round(h * width / height))), h
            else:
                cw, ch = w, max(1, min(h, round(w * height / width)))
            x0, y0 = (w - cw) // 2, (h - ch) // 2
            sx, sy = width / cw, height / ch
            return cls((w, h), (width, height), fit, sx, sy, -x0 * sx, -y0 * sy,
                       (x0, y0, x0 + cw, y0 + ch), (width, height), (0, 0))
        raise InputError(f"unknown fit {fit!r}; choose one of {', '.join(FITS)}")

    def to_image(self, x, y):
        """Input pixel coordinates -> image pixel coordinates (numbers or arrays)."""
        return (x - self.offset_x) / self.scale_x, (y - self.offset_y) / self.scale_y

    def normalized_to_image(self, x, y):
        """Coordinates normalised to the input (0..1) -> image pixel coordinates."""
        return self.to_image(np.asarray(x) * self.input_size[0],
                             np.asarray(y) * self.input_size[1])

    def canvas(self, pixels: np.ndarray, resample: str = "bilinear") -> np.ndarray:
        """The (H, W, 3) uint8 input picture of ``pixels`` (the whole image)."""
        width, height = self.input_size
        region = resize(pixels, self.resized, resample, box=self.box)
        if self.paste == (0, 0) and self.resized == (width, height):
            return np.ascontiguousarray(region)
        out = np.zeros((height, width, 3), np.uint8)   # letterbox bars: pixel value 0
        x, y = self.paste
        out[y:y + region.shape[0], x:x + region.shape[1]] = region
        return out


def image_input(session) -> TensorInfo:
    """The session's image input: its only input, NHWC with a batch of 1 and 3 channels."""
    infos = session.get_inputs()
    if len(infos) != 1:
        raise InputError(f"image helpers need a model with one input; this one has "
                         f"{len(infos)} ({', '.join(i.name for i in infos)})")
    info = infos[0]
    if len(info.shape) != 4 or info.shape[0] != 1 or info.shape[3] != 3:
        raise InputError(f"input {info.name!r} of shape {list(info.shape)} is not an "
                         f"RGB image (expected [1, height, width, 3])")
    return info


def to_tensor(info: TensorInfo, picture: np.ndarray, mean=None, std=None) -> np.ndarray:
    """(H, W, 3) uint8 pixels -> input ``info``'s dtype with a batch axis (see module doc)."""
    dt = info.dtype
    p = picture[None]
    if dt.kind == "f":
        m = 0.0 if mean is None else mean
        s = 1.0 if std is None else std
        return ((p.astype(np.float32) - np.float32(m)) / np.float32(s)).astype(dt)
    if dt.kind not in "iu":
        raise InputError(f"input {info.name!r} has dtype {dt.name}: not an image input")
    shift = 128 if dt == np.int8 else 0
    if mean is None and std is None:
        return (p.astype(np.int16) - shift).astype(dt) if shift else p.astype(dt)
    if not info.is_quantized:
        real = (p.astype(np.float64) - (0.0 if mean is None else mean)) / \
            (1.0 if std is None else std)
        limits = np.iinfo(dt)
        return np.clip(np.sign(real) * np.floor(np.abs(real) + 0.5), limits.min,
                       limits.max).astype(dt)
    scale, zero_point = info.quantization
    m = zero_point + shift if mean is None else mean
    s = 1.0 / scale if std is None else std
    return info.quantize((p.astype(np.float64) - m) / s)


def prepare(info: TensorInfo, image, *, fit: str = "stretch", resample: str = "bilinear",
            mean=None, std=None, max_pixels: int | None = None
            ) -> tuple[np.ndarray, Placement, np.ndarray]:
    """(input tensor, placement, the image as an RGB array) for input ``info``;
    ``max_pixels``: the largest image file decoded (:func:`as_rgb_array`)."""
    pixels = as_rgb_array(image, max_pixels=max_pixels)
    _, height, width, _ = info.shape
    placement = Placement.compute((pixels.shape[1], pixels.shape[0]), (width, height), fit)
    tensor = to_tensor(info, placement.canvas(pixels, resample), mean, std)
    return tensor, placement, pixels


def run_image(session, image, **options) -> tuple[dict, Placement, np.ndarray]:
    """Run ``session`` on ``image``: (outputs by name, placement, image array).

    ``options``: ``fit``, ``resample``, ``mean``, ``std``, ``max_pixels`` of
    :func:`prepare`.
    """
    info = image_input(session)
    tensor, placement, pixels = prepare(info, image, **options)
    return session.run({info.name: tensor}), placement, pixels
