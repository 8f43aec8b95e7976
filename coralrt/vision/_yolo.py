"""YOLO detection heads: one output tensor of boxes and class scores per anchor.

Three layouts (``layout=``), rows being anchors once the tensor is read with
its longer axis first (a [1, 4 + C, N] output is read as N rows of 4 + C):

* ``"yolov8"`` (YOLOv8, v9, v11, Ultralytics' anchor-free v5 "u" models):
  [1, 4 + C, N]: cx, cy, w, h, then C class scores; an anchor's score is its
  best class score.
* ``"yolov5"``: [1, N, 5 + C]: cx, cy, w, h, objectness, C class scores; an
  anchor's score is objectness times its best class score.
* ``"yolov10"``: [1, N, 6]: x1, y1, x2, y2, score, class id, already
  suppressed inside the model (NMS-free): no suppression is added.

``layout="auto"`` reads the shape (:func:`yolo_layout`).  Boxes are in the
input's pixels or normalised to the input (``coordinates=``); ``"auto"``
takes them for pixels when a centre (v10: a corner) coordinate of any anchor
exceeds :data:`PIXEL_LIMIT` (1.5), normalised otherwise.  Rows scoring below
``threshold`` are dropped; for v5 and v8 greedy suppression per class then
drops a box whose IoU with a better one of its class exceeds
``iou_threshold``.  Boxes go back to the image through the
:class:`~coralrt.vision._preprocess.Placement` (stretch, crop or letterbox)
and are clipped to the image.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import InputError
from coralrt.vision._labels import label_of
from coralrt.vision._preprocess import Placement
from coralrt.vision._results import BBox, Detection, nms

__all__ = ["LAYOUTS", "COORDINATES", "PIXEL_LIMIT", "STRIDES", "grid_anchors",
           "yolo_layout", "head_shape", "decode_yolo"]

LAYOUTS = ("yolov5", "yolov8", "yolov10")
COORDINATES = ("normalized", "pixels")

# A normalised coordinate stays near 0..1 (a box may overhang the input a little);
# a pixel coordinate of an anchor's centre reaches the input's size (32 or more).
PIXEL_LIMIT = 1.5

# The strides of the three detection scales of YOLOv5/v8/v10 models.
STRIDES = (8, 16, 32)


def head_shape(shape) -> tuple[int, int] | None:
    """(values per anchor, anchors) when ``shape`` looks like a one-tensor detection
    head ([1, K, N] or [1, N, K] with K >= 5 and N >= 4 K), else None."""
    shape = tuple(int(d) for d in shape)
    if len(shape) != 3 or shape[0] != 1:
        return None
    small, large = sorted(shape[1:])
    return (small, large) if small >= 5 and large >= 4 * small else None


def grid_anchors(input_size, strides=STRIDES) -> int:
    """Anchor-free grid cells of an input of ``input_size`` (width, height): one per cell
    of each stride's grid (756 for 192 x 192, 8400 for 640 x 640)."""
    w, h = (int(v) for v in input_size)
    return sum(-(-w // s) * -(-h // s) for s in strides)


def yolo_layout(shape, input_size=None, *, strict: bool = False) -> str | None:
    """The layout of a one-tensor head of ``shape`` (``"yolov5"``, ``"yolov8"`` or
    ``"yolov10"``), else None.

    Rules, first that holds (N anchors, K values per anchor; G the grid cells
    of ``input_size`` at strides 8, 16 and 32, :func:`grid_anchors`):

    1. N == G: ``"yolov8"`` (either orientation); N == 3 G: ``"yolov5"`` (three
       anchor boxes per cell);
    2. [1, K, N] (values first): ``"yolov8"``;
    3. [1, N, 6]: ``"yolov10"``;
    4. [1, N, K]: ``"yolov5"``.

    With ``strict`` (what task auto-detection uses) rule 4 does not apply: such a
    shape might be a transposed v8 head made for other strides.
    """
    head = head_shape(shape)
    if head is None:
        return None
    values, anchors = head
    if input_size is not None:
        g = grid_anchors(input_size)
        if anchors == g:
            return "yolov8"
        if anchors == 3 * g:
            return "yolov5"
    values_first = int(shape[1]) == values
    if values_first:
        return "yolov8"
    if values == 6:
        return "yolov10"
    return None if strict else "yolov5"


def _rows(output) -> np.ndarray:
    a = np.asarray(output, np.float64)
    if a.ndim == 3 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 2 or min(a.shape) < 5:
        raise InputError(f"a YOLO head is one [1, 4 + C, N], [1, N, 5 + C] or [1, N, 6] "
                         f"tensor; got shape {list(np.shape(output))}")
    return a.T if a.shape[0] < a.shape[1] else a


def _in_pixels(coords: np.ndarray, coordinates: str) -> bool:
    if coordinates == "auto":
        finite = coords[np.isfinite(coords)]
        return bool(finite.size) and float(np.abs(finite).max()) > PIXEL_LIMIT
    if coordinates not in COORDINATES:
        raise InputError(f"unknown coordinates {coordinates!r}; choose auto, "
                         f"{', '.join(COORDINATES)}")
    return coordinates == "pixels"


def _layout(output, placement: Placement, layout: str) -> str:
    if layout == "auto":
        found = yolo_layout(np.shape(output), placement.input_size)
        if found is None:
            raise InputError(f"output of shape {list(np.shape(output))} is not a YOLO head "
                             f"([1, 4 + C, N], [1, N, 5 + C] or [1, N, 6])")
        return found
    if layout not in LAYOUTS:
        raise InputError(f"unknown YOLO layout {layout!r}; choose auto, {', '.join(LAYOUTS)}")
    return layout


def _scored(rows: np.ndarray, layout: str):
    """(xyxy boxes, scores, class ids, whether to suppress) of every anchor."""
    if layout == "yolov10":
        if rows.shape[1] != 6:
            raise InputError(f"a YOLOv10 head has 6 values per row (x1, y1, x2, y2, score, "
                             f"class); this one has {rows.shape[1]}")
        ids = np.nan_to_num(rows[:, 5], nan=-1.0)
        return rows[:, :4], rows[:, 4], np.rint(ids).astype(np.int64), False
    cx, cy, w, h = rows[:, 0], rows[:, 1], rows[:, 2] / 2, rows[:, 3] / 2
    xyxy = np.stack([cx - w, cy - h, cx + w, cy + h], axis=1)
    if layout == "yolov5":
        obj, cls = rows[:, 4], rows[:, 5:]
        if cls.shape[1] == 0:
            return xyxy, obj, np.zeros(len(rows), np.int64), True
        ids = cls.argmax(axis=1)
        return xyxy, obj * cls[np.arange(len(rows)), ids], ids, True
    cls = rows[:, 4:]
    ids = cls.argmax(axis=1)
    return xyxy, cls[np.arange(len(rows)), ids], ids, True


def decode_yolo(output, placement: Placement, threshold: float = 0.5, labels=None,
                iou_threshold: float = 0.5, *, layout: str = "auto",
                coordinates: str = "auto") -> list[Detection]:
    """Detections of one YOLO head output (real values), best first, boxes in image
    pixels; see the module doc for the layouts, coordinates and suppression."""
    layout = _layout(output, placement, layout)
    rows = _rows(output)
    xyxy, scores, ids, suppress = _scored(rows, layout)
    centres = xyxy if layout == "yolov10" else rows[:, :2]
    if not _in_pixels(centres, coordinates):
        xyxy = xyxy * np.array(placement.input_size * 2, np.float64)
    picked = np.flatnonzero(np.isfinite(scores) & (scores >= threshold)
                            & np.isfinite(xyxy).all(axis=1))
    kept: list[int] = []
    if suppress:
        for c in np.unique(ids[picked]):
            rows_c = picked[ids[picked] == c]
            kept += [int(rows_c[k]) for k in nms(xyxy[rows_c], scores[rows_c], iou_threshold)]
    else:
        kept = [int(i) for i in picked]
    kept.sort(key=lambda i: (-scores[i], i))
    return [Detection(int(ids[i]), float(scores[i]), _to_image(xyxy[i], placement),
                      label_of(labels, int(ids[i]))) for i in kept]


def _to_image(xyxy, placement: Placement) -> BBox:
    (x0, x1), (y0, y1) = placement.to_image(np.asarray(xyxy[[0, 2]]),
                                            np.asarray(xyxy[[1, 3]]))
    w, h = placement.image_size
    x0, x1 = sorted((float(x0), float(x1)))
    y0, y1 = sorted((float(y0), float(y1)))
    return BBox(float(np.clip(x0, 0, w)), float(np.clip(y0, 0, h)),
                float(np.clip(x1, 0, w)), float(np.clip(y1, 0, h)))
