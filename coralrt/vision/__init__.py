"""Vision task helpers: images in, small typed results out.

``classify``, ``detect``, ``segment`` and ``pose`` take an
:class:`~coralrt.InferenceSession` and an image (a path, a PIL image or a
(height, width, 3) uint8 RGB array), prepare the model's input
(:mod:`coralrt.vision._preprocess`), run it and decode its outputs into frozen
dataclasses whose coordinates are the image's pixels.  Pillow (the
``coralrt[image]`` extra) is imported only to decode files, to resize with
anything but nearest-neighbour, and to draw.  docs/vision.md has the details.
"""

from coralrt.vision._classify import (
    classes_from_outputs, classes_from_scores, classify, top_indices,
)
from coralrt.vision._detect import (
    decode_box_scores, decode_postprocess, detect, detections_from_outputs, nms,
)
from coralrt.vision._draw import draw, palette, save
from coralrt.vision._imaging import PillowMissing, as_rgb_array
from coralrt.vision._labels import read_labels
from coralrt.vision._pose import keypoints_from_output, pose
from coralrt.vision._preprocess import FITS, Placement, prepare, run_image
from coralrt.vision._results import (
    KEYPOINT_NAMES, SKELETON, BBox, Class, Detection, Keypoint, Segmentation,
)
from coralrt.vision._segment import segment, segmentation_from_output
from coralrt.vision._task import TASKS, guess_task
from coralrt.vision._yolo import decode_yolo, yolo_layout

__all__ = [
    "classify", "detect", "segment", "pose", "draw", "save", "read_labels", "guess_task",
    "Class", "BBox", "Detection", "Segmentation", "Keypoint", "Placement", "prepare",
    "run_image", "as_rgb_array", "classes_from_scores", "classes_from_outputs", "top_indices", "nms",
    "decode_postprocess", "decode_box_scores", "decode_yolo", "yolo_layout",
    "detections_from_outputs",
    "segmentation_from_output", "keypoints_from_output", "palette", "PillowMissing",
    "FITS", "TASKS", "KEYPOINT_NAMES", "SKELETON",
]
