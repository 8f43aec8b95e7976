"""Semantic segmentation: a class id per image pixel."""

from __future__ import annotations

import numpy as np

from coralrt.errors import InputError
from coralrt.vision._labels import label_of
from coralrt.vision._preprocess import Placement, run_image
from coralrt.vision._results import Segmentation

__all__ = ["class_map", "mask_to_image", "segmentation_from_output", "segmentation_output",
           "segment"]


def class_map(output: np.ndarray) -> np.ndarray:
    """(H, W) class ids of a segmentation output (batch item 0).

    An ArgMax output [1, H, W] (or [1, H, W, 1]) already holds class ids; a
    score volume [1, H, W, C] gets the argmax over C (the first class on ties).
    Quantized scores need no dequantizing: the mapping keeps their order.
    """
    a = np.asarray(output)
    if a.ndim == 4 and a.shape[0] == 1:
        a = a[0]
        return a[..., 0].astype(np.int64) if a.shape[-1] == 1 else a.argmax(axis=-1)
    if a.ndim == 3 and a.shape[0] == 1:
        return a[0].astype(np.int64)
    raise InputError(f"a segmentation output is [1, H, W] class ids or [1, H, W, C] scores, "
                     f"got {list(a.shape)}")


def mask_to_image(classes: np.ndarray, placement: Placement) -> np.ndarray:
    """``classes`` (H', W', over the whole input) resampled to the image's pixels,
    nearest neighbour: each image pixel takes the class under its centre."""
    w, h = placement.image_size
    # image pixel centre -> input pixel (input = image * scale + offset) -> output cell
    xs = (np.arange(w) + 0.5) * placement.scale_x + placement.offset_x
    ys = (np.arange(h) + 0.5) * placement.scale_y + placement.offset_y
    out_h, out_w = classes.shape
    cols = np.clip(np.floor(xs * out_w / placement.input_size[0]).astype(np.int64), 0,
                   out_w - 1)
    rows = np.clip(np.floor(ys * out_h / placement.input_size[1]).astype(np.int64), 0,
                   out_h - 1)
    return classes[rows[:, None], cols[None, :]]


def segmentation_from_output(output: np.ndarray, placement: Placement,
                             labels=None) -> Segmentation:
    """The :class:`Segmentation` of one output at the image's size."""
    mask = mask_to_image(class_map(output), placement)
    ids = tuple(int(i) for i in np.unique(mask))
    return Segmentation(mask, ids, tuple(label_of(labels, i) for i in ids))


def segmentation_output(session, outputs: dict) -> np.ndarray:
    """The one output [1, H, W] or [1, H, W, C] (H, W > 1) of ``outputs``."""
    found = [a for a in outputs.values() if a.ndim in (3, 4) and a.shape[0] == 1
             and a.shape[1] > 1 and a.shape[2] > 1]
    if len(found) != 1:
        raise InputError(f"segment needs one [1, H, W] or [1, H, W, C] output; the model's "
                         f"outputs are {[list(a.shape) for a in outputs.values()]}")
    return found[0]


def segment(session, image, labels=None, **preprocess) -> Segmentation:
    """The class of every pixel of ``image`` (mask at the image's size).

    ``preprocess``: ``fit``, ``resample``, ``mean``, ``std``, ``max_pixels``
    (:mod:`coralrt.vision._preprocess`).
    """
    outputs, placement, _ = run_image(session, image, **preprocess)
    return segmentation_from_output(segmentation_output(session, outputs), placement, labels)
