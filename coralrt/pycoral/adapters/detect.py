"""Object detection results: SSD models with the TFLite detection post-process, and
models whose only output is a YOLO head (decoded by :mod:`coralrt.vision`)."""

from __future__ import annotations

import collections
import math

import numpy as np

from coralrt.pycoral.adapters import common
from coralrt.vision._detect import postprocess_order
from coralrt.vision._preprocess import Placement
from coralrt.vision._yolo import decode_yolo, yolo_layout
from coralrt.vision._results import box_intersection, box_iou, box_union

__all__ = ["Object", "BBox", "get_objects"]

Object = collections.namedtuple("Object", ["id", "score", "bbox"])
Object.__doc__ = "One detection: class ``id`` (int), ``score`` (float), ``bbox`` (:class:`BBox`)."


class BBox(collections.namedtuple("BBox", ["xmin", "ymin", "xmax", "ymax"])):
    """An axis-aligned box; x grows rightwards, y downwards."""

    __slots__ = ()

    @property
    def width(self):
        return self.xmax - self.xmin

    @property
    def height(self):
        return self.ymax - self.ymin

    @property
    def area(self):
        return self.width * self.height

    @property
    def valid(self) -> bool:
        """True when neither side is negative (an empty box is valid)."""
        return self.width >= 0 and self.height >= 0

    def scale(self, sx, sy) -> BBox:
        """All x coordinates times ``sx``, all y coordinates times ``sy``."""
        return BBox(sx * self.xmin, sy * self.ymin, sx * self.xmax, sy * self.ymax)

    def translate(self, dx, dy) -> BBox:
        """The box moved by (``dx``, ``dy``)."""
        return BBox(dx + self.xmin, dy + self.ymin, dx + self.xmax, dy + self.ymax)

    def map(self, f) -> BBox:
        """``f`` applied to each of the four coordinates."""
        return BBox(f(self.xmin), f(self.ymin), f(self.xmax), f(self.ymax))

    @staticmethod
    def intersect(a: BBox, b: BBox) -> BBox:
        """The overlap of ``a`` and ``b``; not :attr:`valid` when they do not overlap."""
        return BBox(*box_intersection(a, b))

    @staticmethod
    def union(a: BBox, b: BBox) -> BBox:
        """The smallest box holding both ``a`` and ``b``."""
        return BBox(*box_union(a, b))

    @staticmethod
    def iou(a: BBox, b: BBox) -> float:
        """Intersection over union: 0.0 when the boxes do not overlap, 1.0 when equal."""
        return box_iou(a, b)


def _signature_outputs(interpreter):
    """{output name: tensor index} of the model's only signature; None without signatures."""
    full = getattr(interpreter, "_get_full_signature_list", None)
    signatures = full() if callable(full) else None
    if not signatures:
        return None
    if len(signatures) > 1:
        raise ValueError("Only support model with one signature.")
    return next(iter(signatures.values()))["outputs"]


def _raw_outputs(interpreter):
    """(boxes, class ids, scores) of batch item 0, found as pycoral finds them."""
    outputs = _signature_outputs(interpreter)
    if outputs:
        # Signature names: output_0 count, output_1 scores, output_2 classes, output_3 boxes.
        def named(name):
            return interpreter.tensor(outputs[name])()[0]
        return named("output_3"), named("output_2"), named("output_1")
    # TF1 post-process order: boxes, classes, scores, count; TF2: scores, boxes, count, classes.
    order = postprocess_order(common.output_tensor(interpreter, 3).size)
    return tuple(common.output_tensor(interpreter, i)[0] for i in order[:3])


def get_objects(interpreter, score_threshold=-math.inf, image_scale=(1.0, 1.0)) -> list[Object]:
    """Detections with score >= ``score_threshold``, in the model's output order.

    Boxes come out of the model as normalized (ymin, xmin, ymax, xmax); they
    are scaled to input pixels, divided by ``image_scale`` (x, y) (the scale
    :func:`~coralrt.pycoral.adapters.common.set_resized_input` returns, so that
    boxes land in the original image's pixels) and truncated to ints.  As in
    pycoral, every row of the outputs is looked at (the count output is not
    used: rows past it have score 0).

    A model whose only output is a YOLO head (YOLOv5, v8/v11, v10; pycoral
    itself reads none) is decoded by :func:`coralrt.vision.decode_yolo` with
    its default suppression (IoU 0.5): the objects come best first, boxes
    likewise scaled and truncated.
    """
    yolo = _yolo_objects(interpreter, score_threshold, image_scale)
    if yolo is not None:
        return yolo
    boxes, class_ids, scores = _raw_outputs(interpreter)
    width, height = common.input_size(interpreter)
    scale_x, scale_y = image_scale
    sx, sy = width / scale_x, height / scale_y

    def make(i):
        ymin, xmin, ymax, xmax = boxes[i]
        box = BBox(xmin=xmin, ymin=ymin, xmax=xmax, ymax=ymax).scale(sx, sy).map(int)
        return Object(id=int(class_ids[i]), score=float(scores[i]), bbox=box)

    return [make(i) for i in range(len(scores)) if scores[i] >= score_threshold]


def _yolo_objects(interpreter, score_threshold, image_scale) -> list[Object] | None:
    """The objects of a model whose only output is a YOLO head, else None."""
    details = interpreter.get_output_details()
    if len(details) != 1:
        return None
    size = common.input_size(interpreter)
    if yolo_layout(details[0]["shape"], size) is None:
        return None
    raw = np.asarray(common.output_tensor(interpreter, 0))
    scale, zero_point = details[0].get("quantization", (0.0, 0)) or (0.0, 0)
    real = (raw.astype(np.float64) - zero_point) * scale if scale else raw.astype(np.float64)
    found = decode_yolo(real, Placement.compute(size, size), score_threshold)
    sx, sy = image_scale
    return [Object(id=d.id, score=d.score,
                   bbox=BBox(*d.bbox.astuple()).scale(1 / sx, 1 / sy).map(int))
            for d in found]
