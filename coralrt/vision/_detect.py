"""Object detection: boxes out of the two common output layouts, in image pixels.

* **SSD post-process** (``TFLite_Detection_PostProcess``): outputs boxes
  [1, N, 4] (ymin, xmin, ymax, xmax normalised to the input), class ids
  [1, N], scores [1, N] and the count [1].  Found by the operator that
  produces them; without it (a model whose outputs were renamed or
  reordered), by their shapes as pycoral does: a last output of one value is
  TF1's order (boxes, classes, scores, count), otherwise TF2's (scores,
  boxes, count, classes).
* **Plain boxes and scores**: two outputs, boxes [1, N, 4] (same
  coordinates) and scores [1, N, C].  Each box takes its best class.  With
  ``background=True`` (default) and C > 1, column 0 is the background class:
  it is left out, and class ids are the column minus 1 (the ids the SSD
  post-process reports, so one label file serves both layouts).  Boxes below
  ``threshold`` are dropped, then greedy non-maximum suppression per class
  removes a box whose IoU with a better-scoring box of the same class
  exceeds ``iou_threshold`` (0.5).
* **YOLO head**: the model's only output is one tensor of boxes and class
  scores per anchor (YOLOv5, v8/v11, v10): :mod:`coralrt.vision._yolo`.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import InputError
from coralrt._model.shapes import DETECTION_POSTPROCESS
from coralrt.vision._labels import label_of
from coralrt.vision._preprocess import Placement, run_image
from coralrt.vision._results import BBox, Detection, nms
from coralrt.vision._yolo import decode_yolo, head_shape, yolo_layout

__all__ = ["postprocess_outputs", "postprocess_order", "box_score_outputs", "nms",
           "decode_postprocess", "decode_box_scores", "detections_from_outputs", "detect",
           "yolo_output", "not_a_detector"]

# Positions of (boxes, classes, scores, count) among the four outputs.
TF1_ORDER = (0, 1, 2, 3)
TF2_ORDER = (1, 3, 0, 2)


def postprocess_order(last_size: int) -> tuple[int, int, int, int]:
    """(boxes, classes, scores, count) positions among four post-process outputs when
    no operator says: TF1's order when the last output holds ``last_size`` == 1
    value, otherwise TF2's."""
    return TF1_ORDER if last_size == 1 else TF2_ORDER


def postprocess_operator_outputs(session) -> list[int] | None:
    """Positions in ``session.get_outputs()`` of (boxes, classes, scores, count) when the
    model's outputs include the four of a ``TFLite_Detection_PostProcess`` operator."""
    pos = {info.index: k for k, info in enumerate(session.get_outputs())}
    for op in session.model.main.operators:
        if op.name == DETECTION_POSTPROCESS and len(op.outputs) == 4 \
                and all(t in pos for t in op.outputs):
            return [pos[t] for t in op.outputs]
    return None


def postprocess_outputs(session) -> list[int] | None:
    """:func:`postprocess_operator_outputs`, else four outputs shaped like the
    post-process's in TF1's or TF2's order (pycoral's rule for models whose
    operator is not visible, such as a compiled model's CPU tail)."""
    found = postprocess_operator_outputs(session)
    if found is not None:
        return found
    infos = session.get_outputs()
    if len(infos) == 4:
        order = postprocess_order(int(np.prod(infos[3].shape)))
        boxes, classes, scores, _ = (infos[k].shape for k in order)
        if len(boxes) == 3 and boxes[-1] == 4 and tuple(classes) == tuple(scores) \
                == tuple(boxes[:2]):
            return list(order)
    return None


def box_score_outputs(session) -> list[int] | None:
    """Positions of (boxes [1, N, 4], scores [1, N, C]) when those are the model's
    two outputs."""
    shapes = [tuple(i.shape) for i in session.get_outputs()]
    if len(shapes) != 2:
        return None
    for b, s in ((0, 1), (1, 0)):
        if len(shapes[b]) == 3 and shapes[b][-1] == 4 and len(shapes[s]) == 3 \
                and shapes[s][:2] == shapes[b][:2]:
            return [b, s]
    return None


def yolo_output(session, *, strict: bool = False) -> int | None:
    """Position of the model's output when it is its only one and a YOLO head
    (:func:`~coralrt.vision._yolo.yolo_layout`, ``strict`` as there)."""
    infos = session.get_outputs()
    if len(infos) != 1:
        return None
    return 0 if yolo_layout(infos[0].shape, _input_size(session), strict=strict) else None


def _input_size(session) -> tuple[int, int] | None:
    """(width, height) of the model's only input when it is an NHWC image, else None."""
    inputs = [tuple(i.shape) for i in session.get_inputs()]
    if len(inputs) == 1 and len(inputs[0]) == 4 and min(inputs[0][1:3]) > 0:
        return int(inputs[0][2]), int(inputs[0][1])
    return None


def not_a_detector(infos) -> InputError:
    """The error for outputs that are no layout these helpers read."""
    shapes = [list(i.shape) for i in infos]
    hint = ""
    if len(shapes) > 1 and any(head_shape(s) for s in shapes):
        hint = ("; one output looks like a YOLO head, but a YOLO model is read only when "
                "that head is its only output: pass it to decode_yolo() yourself")
    return InputError(f"not a detection model coralrt.vision reads: no TFLite_Detection_"
                      f"PostProcess outputs, no boxes [1, N, 4] + scores [1, N, C] outputs "
                      f"and no single YOLO head output [1, 4 + C, N], [1, N, 5 + C] or "
                      f"[1, N, 6] (outputs {shapes}){hint}")


def _real(info, a) -> np.ndarray:
    # The post-process leaves the rows past its count uninitialised: whatever bits
    # they hold (NaN included) are converted without a warning and never read.
    with np.errstate(invalid="ignore", over="ignore"):
        return info.dequantize(a) if info.is_quantized else np.asarray(a, np.float64)


def _to_bbox(yxyx, placement: Placement) -> BBox:
    ymin, xmin, ymax, xmax = (float(v) for v in yxyx)
    (x0, x1), (y0, y1) = placement.normalized_to_image([xmin, xmax], [ymin, ymax])
    w, h = placement.image_size
    return BBox(float(np.clip(x0, 0, w)), float(np.clip(y0, 0, h)),
                float(np.clip(x1, 0, w)), float(np.clip(y1, 0, h)))


def decode_postprocess(boxes, classes, scores, count, placement: Placement,
                       threshold: float = 0.5, labels=None) -> list[Detection]:
    """Detections of the post-process outputs (real values, batch item 0): the first
    ``count`` rows scoring >= ``threshold``, best first."""
    scores = np.asarray(scores, np.float64).reshape(-1)
    classes = np.asarray(classes).reshape(-1)
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    count = np.asarray(count).reshape(-1)
    n = int(count[0]) if count.size and np.isfinite(count[0]) else scores.size
    n = max(0, min(n, scores.size, classes.size, len(boxes)))
    out = []
    for i in np.argsort(-scores[:n], kind="stable"):
        if scores[i] >= threshold:
            cid = int(classes[i])
            out.append(Detection(cid, float(scores[i]), _to_bbox(boxes[i], placement),
                                 label_of(labels, cid)))
    return out


def decode_box_scores(boxes, scores, placement: Placement, threshold: float = 0.5,
                      labels=None, iou_threshold: float = 0.5,
                      background: bool = True) -> list[Detection]:
    """Detections of plain boxes [1, N, 4] and scores [1, N, C] (real values); see the
    module doc for the background and suppression rules."""
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    scores = np.asarray(scores, np.float64)
    scores = scores.reshape(len(boxes), -1)
    first = 1 if background and scores.shape[1] > 1 else 0
    cls = scores[:, first:].argmax(axis=1)
    best = scores[np.arange(len(boxes)), cls + first]
    picked = np.flatnonzero(best >= threshold)
    out = []
    for c in np.unique(cls[picked]):
        rows = picked[cls[picked] == c]
        yxyx = boxes[rows]
        xyxy = yxyx[:, [1, 0, 3, 2]]
        for k in nms(xyxy, best[rows], iou_threshold):
            i = rows[k]
            out.append(Detection(int(c), float(best[i]), _to_bbox(boxes[i], placement),
                                 label_of(labels, int(c))))
    out.sort(key=lambda d: -d.score)   # stable: equal scores stay in class order
    return out


def detections_from_outputs(session, outputs: dict, placement: Placement,
                            threshold: float = 0.5, labels=None,
                            iou_threshold: float = 0.5, background: bool = True, *,
                            layout: str = "auto", coordinates: str = "auto"
                            ) -> list[Detection]:
    """Detections in ``outputs`` (``session.run``'s dict) of any layout the module doc
    lists; ``layout`` and ``coordinates`` apply to a YOLO head (``decode_yolo``)."""
    infos = session.get_outputs()
    arrays = list(outputs.values())
    pos = postprocess_outputs(session)
    if pos is not None:
        b, c, s, n = (_real(infos[k], arrays[k]) for k in pos)
        return decode_postprocess(b, c, s, n, placement, threshold, labels)
    pos = box_score_outputs(session)
    if pos is not None:
        b, s = (_real(infos[k], arrays[k]) for k in pos)
        return decode_box_scores(b, s, placement, threshold, labels, iou_threshold,
                                 background)
    if len(infos) == 1 and (layout != "auto" or yolo_output(session) is not None):
        return decode_yolo(_real(infos[0], arrays[0]), placement, threshold, labels,
                           iou_threshold, layout=layout, coordinates=coordinates)
    raise not_a_detector(infos)


def detect(session, image, threshold: float = 0.5, labels=None, *,
           iou_threshold: float = 0.5, background: bool = True, layout: str = "auto",
           coordinates: str = "auto", **preprocess) -> list[Detection]:
    """Objects in ``image`` scoring >= ``threshold``, best first, boxes in image pixels.

    ``preprocess``: ``fit``, ``resample``, ``mean``, ``std``, ``max_pixels``
    (:mod:`coralrt.vision._preprocess`); ``fit="letterbox"`` keeps the aspect
    ratio and the boxes still come back in the image's pixels.  ``layout`` and
    ``coordinates``: a YOLO head's (:func:`decode_yolo`).
    """
    outputs, placement, _ = run_image(session, image, **preprocess)
    return detections_from_outputs(session, outputs, placement, threshold, labels,
                                   iou_threshold, background, layout=layout,
                                   coordinates=coordinates)
