"""Single-pose estimation (MoveNet): 17 keypoints in image pixels."""

from __future__ import annotations

import numpy as np

from coralrt.errors import InputError
from coralrt.vision._preprocess import Placement, run_image
from coralrt.vision._results import KEYPOINT_NAMES, Keypoint

__all__ = ["is_pose_output", "keypoints_from_output", "pose_output", "pose"]


def is_pose_output(shape) -> bool:
    """MoveNet single-pose's output shape: [1, 1, 17, 3]."""
    return tuple(shape) == (1, 1, len(KEYPOINT_NAMES), 3)


def keypoints_from_output(output, placement: Placement) -> list[Keypoint]:
    """Keypoints of a [1, 1, 17, 3] output of (y, x, score) rows normalised to the input
    (real values), in MoveNet's order, positions mapped to image pixels."""
    a = np.asarray(output, np.float64)
    if not is_pose_output(a.shape):
        raise InputError(f"a single-pose output is [1, 1, 17, 3], got {list(a.shape)}")
    rows = a.reshape(-1, 3)
    xs, ys = placement.normalized_to_image(rows[:, 1], rows[:, 0])
    return [Keypoint(name, float(x), float(y), float(s))
            for name, x, y, s in zip(KEYPOINT_NAMES, xs, ys, rows[:, 2])]


def pose(session, image, **preprocess) -> list[Keypoint]:
    """The 17 keypoints of the person in ``image`` (MoveNet single-pose models).

    ``preprocess``: ``fit``, ``resample``, ``mean``, ``std``, ``max_pixels``
    (:mod:`coralrt.vision._preprocess`).
    """
    outputs, placement, _ = run_image(session, image, **preprocess)
    return keypoints_from_output(pose_output(session, outputs), placement)


def pose_output(session, outputs: dict) -> np.ndarray:
    """The [1, 1, 17, 3] output of ``outputs`` as real values."""
    for info, a in zip(session.get_outputs(), outputs.values()):
        if is_pose_output(a.shape):
            return info.dequantize(a) if info.is_quantized else a
    raise InputError(f"pose needs a [1, 1, 17, 3] output; the model's outputs are "
                     f"{[list(a.shape) for a in outputs.values()]}")
