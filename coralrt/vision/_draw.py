"""Drawing results on the image: boxes, masks, keypoints, classes (Pillow)."""

from __future__ import annotations

import os

import numpy as np

from coralrt.errors import InputError
from coralrt.vision._imaging import as_rgb_array, require_pillow
from coralrt.vision._results import SKELETON, Class, Detection, Keypoint, Segmentation

__all__ = ["palette", "draw", "draw_detections", "draw_segmentation", "draw_keypoints",
           "draw_classes", "save"]

BOX_COLOR = (255, 40, 40)
POINT_COLOR = (40, 255, 40)
LINE_COLOR = (255, 220, 0)


def palette(n: int = 256) -> np.ndarray:
    """(n, 3) uint8 colours, one per class id: the PASCAL VOC colour map (the bits of
    the id spread over the high bits of R, G and B; id 0 is black)."""
    ids = np.arange(n)
    colors = np.zeros((n, 3), np.int64)
    for shift in range(7, -1, -1):
        for channel in range(3):
            colors[:, channel] |= ((ids >> channel) & 1) << shift
        ids = ids >> 3
    return colors.astype(np.uint8)


def _canvas(image):
    Image = require_pillow("drawing")
    return Image.fromarray(np.array(as_rgb_array(image), copy=True))


def _text(draw, xy, text, fill):
    x, y = xy
    left, top, right, bottom = draw.textbbox((x, y), text)
    draw.rectangle((left - 1, top - 1, right + 1, bottom + 1), fill=(0, 0, 0))
    draw.text((x, y), text, fill=fill)


def draw_detections(image, detections, width: int = 2):
    """A PIL image of ``image`` with each box outlined and labelled "label score"."""
    from PIL import ImageDraw
    im = _canvas(image)
    d = ImageDraw.Draw(im)
    for det in detections:
        b = det.bbox
        d.rectangle((b.xmin, b.ymin, b.xmax, b.ymax), outline=BOX_COLOR, width=width)
        name = det.label if det.label is not None else str(det.id)
        _text(d, (b.xmin + 2, b.ymin + 2), f"{name} {det.score:.2f}", BOX_COLOR)
    return im


def draw_segmentation(image, seg: Segmentation, alpha: float = 0.5):
    """A PIL image of ``image`` with each non-background pixel (class != 0) blended
    with its class colour: ``(1 - alpha) * pixel + alpha * colour``, and a legend
    top left: one line per class drawn, its colour and its label (or id)."""
    Image = require_pillow("drawing")
    pixels = as_rgb_array(image)
    if seg.mask.shape != pixels.shape[:2]:
        raise InputError(f"mask of {seg.mask.shape[1]}x{seg.mask.shape[0]} for an image of "
                         f"{pixels.shape[1]}x{pixels.shape[0]}")
    colors = palette()[np.clip(seg.mask, 0, 255)].astype(np.float64)
    blended = (1 - alpha) * pixels + alpha * colors
    out = np.where((seg.mask != 0)[..., None], np.rint(blended), pixels).astype(np.uint8)
    im = Image.fromarray(out)
    _legend(im, [(cid, label) for cid, label in zip(seg.classes, seg.labels) if cid != 0])
    return im


def _legend(im, classes) -> None:
    """Class colour swatches with their names, one per line, top left of ``im``."""
    if not classes:
        return
    from PIL import ImageDraw
    d = ImageDraw.Draw(im)
    colors = palette()
    names = [label if label is not None else str(cid) for cid, label in classes]
    line = max(d.textbbox((0, 0), n)[3] for n in names) + 4
    width = max(d.textbbox((0, 0), n)[2] for n in names) + line + 8
    d.rectangle((2, 2, 2 + width, 4 + line * len(names)), fill=(0, 0, 0))
    for row, ((cid, _), name) in enumerate(zip(classes, names)):
        y = 4 + row * line
        d.rectangle((5, y + 1, 3 + line - 2, y + line - 3),
                    fill=tuple(int(c) for c in colors[min(max(cid, 0), 255)]),
                    outline=(255, 255, 255))
        d.text((4 + line, y), name, fill=(255, 255, 255))


def draw_keypoints(image, keypoints, min_score: float = 0.2, radius: int = 3):
    """A PIL image of ``image`` with the keypoints scoring >= ``min_score`` as dots and
    the skeleton's lines between them."""
    from PIL import ImageDraw
    im = _canvas(image)
    d = ImageDraw.Draw(im)
    seen = {k.name: k for k in keypoints if k.score >= min_score}
    for a, b in SKELETON:
        if a in seen and b in seen:
            d.line((seen[a].x, seen[a].y, seen[b].x, seen[b].y), fill=LINE_COLOR, width=2)
    for k in seen.values():
        d.ellipse((k.x - radius, k.y - radius, k.x + radius, k.y + radius), fill=POINT_COLOR)
    return im


def draw_classes(image, classes):
    """A PIL image of ``image`` with one "label score" line per class, top left."""
    from PIL import ImageDraw
    im = _canvas(image)
    d = ImageDraw.Draw(im)
    for row, c in enumerate(classes):
        name = c.label if c.label is not None else str(c.id)
        _text(d, (4, 4 + 14 * row), f"{name} {c.score:.2f}", (255, 255, 255))
    return im


def save(im, out_path) -> None:
    """Write ``im`` to ``out_path``, its format chosen by the suffix (.png, .jpg ...)."""
    suffix = os.path.splitext(os.fspath(out_path))[1].lower()
    if suffix in (".jpg", ".jpeg"):
        im.convert("RGB").save(out_path, "JPEG", quality=92)
    elif suffix == ".png":
        im.save(out_path, "PNG")
    else:
        raise InputError(f"cannot tell the image format of {os.fspath(out_path)!r}: use a "
                         f".png, .jpg or .jpeg file name")


def draw(image, result, out_path=None):
    """``result`` drawn on ``image``: a list of :class:`Detection`, :class:`Keypoint` or
    :class:`Class`, or a :class:`Segmentation`.  Returns the PIL image and writes it
    to ``out_path`` when given (PNG or JPEG, by suffix)."""
    if isinstance(result, Segmentation):
        im = draw_segmentation(image, result)
    else:
        items = list(result)
        kinds = {type(r) for r in items}
        if kinds <= {Detection}:
            im = draw_detections(image, items)
        elif kinds == {Keypoint}:
            im = draw_keypoints(image, items)
        elif kinds == {Class}:
            im = draw_classes(image, items)
        else:
            raise InputError(f"cannot draw {sorted(k.__name__ for k in kinds)}")
    if out_path is not None:
        save(im, out_path)
    return im
