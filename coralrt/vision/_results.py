"""The small, typed results of the vision helpers, and box geometry.

Every result is a frozen dataclass.  Coordinates are image pixels (x grows
rightwards, y downwards) as floats; scores are real (dequantized) values.
The box functions here are also what :mod:`coralrt.pycoral.adapters.detect`
computes with, so the two never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Class", "BBox", "Detection", "Segmentation", "Keypoint", "box_intersection",
           "box_union", "box_iou", "nms", "KEYPOINT_NAMES", "SKELETON"]


def box_intersection(a, b) -> tuple:
    """Overlap of two ``(xmin, ymin, xmax, ymax)`` boxes; a negative side when they
    do not overlap."""
    return (max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))


def box_union(a, b) -> tuple:
    """The smallest box holding both ``a`` and ``b``."""
    return (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))


def box_iou(a, b) -> float:
    """Intersection over union of two ``(xmin, ymin, xmax, ymax)`` boxes.

    0.0 when they do not overlap (a negative side of the intersection);
    boxes that only touch overlap with area 0.
    """
    x0, y0, x1, y1 = box_intersection(a, b)
    if x1 - x0 < 0 or y1 - y0 < 0:
        return 0.0
    inter = (x1 - x0) * (y1 - y0)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def nms(boxes, scores, iou_threshold: float = 0.5) -> list[int]:
    """Greedy non-maximum suppression: indices kept, best score first.

    ``boxes``: (N, 4) in any one corner order with min before max per axis;
    a box is dropped when its IoU (:func:`box_iou`; 0 for two empty boxes) with
    a kept, better (or equal, earlier) box exceeds ``iou_threshold``.
    """
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    order = np.argsort(-np.asarray(scores, np.float64).reshape(-1), kind="stable")
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep: list[int] = []
    while order.size:
        i, rest = order[0], order[1:]
        keep.append(int(i))
        iw = np.minimum(boxes[i, 2], boxes[rest, 2]) - np.maximum(boxes[i, 0], boxes[rest, 0])
        ih = np.minimum(boxes[i, 3], boxes[rest, 3]) - np.maximum(boxes[i, 1], boxes[rest, 1])
        inter = np.where((iw >= 0) & (ih >= 0), iw * ih, 0.0)
        union = area[i] + area[rest] - inter
        with np.errstate(invalid="ignore", divide="ignore"):
            iou = np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)
        order = rest[iou <= iou_threshold]
    return keep


@dataclass(frozen=True)
class Class:
    """One classification result: class ``id``, its ``score`` and its ``label`` (or None)."""

    id: int
    score: float
    label: str | None = None


@dataclass(frozen=True)
class BBox:
    """An axis-aligned box in image pixels."""

    xmin: float
    ymin: float
    xmax: float
    ymax: float

    @property
    def width(self) -> float:
        return self.xmax - self.xmin

    @property
    def height(self) -> float:
        return self.ymax - self.ymin

    @property
    def area(self) -> float:
        return self.width * self.height

    def astuple(self) -> tuple[float, float, float, float]:
        return (self.xmin, self.ymin, self.xmax, self.ymax)

    def scale(self, sx: float, sy: float) -> BBox:
        """x coordinates times ``sx``, y coordinates times ``sy``."""
        return BBox(self.xmin * sx, self.ymin * sy, self.xmax * sx, self.ymax * sy)

    def iou(self, other: BBox) -> float:
        """Intersection over union with ``other`` (0.0 when they do not overlap or
        both are empty)."""
        if self.area <= 0 and other.area <= 0:
            return 0.0
        return box_iou(self.astuple(), other.astuple())


@dataclass(frozen=True)
class Detection:
    """One detected object: class ``id``, ``score``, ``bbox`` in image pixels, ``label``."""

    id: int
    score: float
    bbox: BBox
    label: str | None = None


@dataclass(frozen=True, eq=False)
class Segmentation:
    """A class id per image pixel.

    ``mask``: (height, width) int array at the image's size; ``classes``: the
    class ids present, ascending; ``labels``: their labels in the same order
    (None where unknown).
    """

    mask: np.ndarray = field(repr=False)
    classes: tuple[int, ...]
    labels: tuple[str | None, ...]

    def shares(self) -> dict[int, float]:
        """Fraction of the image's pixels of each class present."""
        ids, counts = np.unique(self.mask, return_counts=True)
        return {int(i): float(c) / self.mask.size for i, c in zip(ids, counts)}


# MoveNet's 17 keypoints, in its output order (the COCO keypoints).
KEYPOINT_NAMES = (
    "nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder",
    "right_shoulder", "left_elbow", "right_elbow", "left_wrist", "right_wrist", "left_hip",
    "right_hip", "left_knee", "right_knee", "left_ankle", "right_ankle")

# Pairs of keypoint names joined by a line when a pose is drawn.
SKELETON = (
    ("nose", "left_eye"), ("nose", "right_eye"), ("left_eye", "left_ear"),
    ("right_eye", "right_ear"), ("left_shoulder", "right_shoulder"),
    ("left_shoulder", "left_elbow"), ("left_elbow", "left_wrist"),
    ("right_shoulder", "right_elbow"), ("right_elbow", "right_wrist"),
    ("left_shoulder", "left_hip"), ("right_shoulder", "right_hip"), ("left_hip", "right_hip"),
    ("left_hip", "left_knee"), ("left_knee", "left_ankle"), ("right_hip", "right_knee"),
    ("right_knee", "right_ankle"))


@dataclass(frozen=True)
class Keypoint:
    """One body keypoint: its ``name``, position in image pixels and ``score``."""

    name: str
    x: float
    y: float
    score: float
