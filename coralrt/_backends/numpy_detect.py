"""The SSD post-processing operator ``TFLite_Detection_PostProcess`` for the NumPy backend.

Runs on the host CPU in NumPy, as a kernel factory of the simulated Edge
TPU's form (see :mod:`coralrt._backends.numpy_kernels`).  It follows the
semantics of LiteRT's kernel:

1. 8-bit box encodings, class scores and anchors are dequantized in float32
   (``(q - zero_point) * scale``).
2. Each box ``(y, x, h, w)`` is decoded against its anchor ``(y, x, h, w)``
   with the ``y_scale``/``x_scale``/``h_scale``/``w_scale`` options, in double
   precision rounded to float32: ``ycenter = y / y_scale * anchor_h +
   anchor_y``, ``half_h = 0.5 * exp(h / h_scale) * anchor_h``; corners
   ``(ymin, xmin, ymax, xmax)``.
3. Scores past the ``num_classes_with_background - num_classes`` leading
   columns are the classes.  Fast NMS (``use_regular_nms`` false) keeps each
   box's best ``max_classes_per_detection`` classes and suppresses on the best
   score; regular NMS suppresses per class (at most ``detections_per_class``)
   and keeps the ``max_detections`` best over all classes.  Single-class NMS
   keeps scores ``>= nms_score_threshold``, visits them in descending order
   (a stable sort) and drops boxes whose IoU with a kept box is above
   ``nms_iou_threshold``.
4. Outputs: boxes [1, N, 4], classes [1, N], scores [1, N] (float32, unused
   rows 0) and the count [1], N = ``max_detections * max_classes_per_detection``.

Tolerance: boxes differ from LiteRT's only where ``exp`` differs from the C
library's in the last bit (within 1e-6 relative); classes, the count and the
order of the detections are the same except where two candidates tie exactly
(score ties broken towards the lower index, as a stable sort does).
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import InferenceError, ModelError
from coralrt._model.custom_options import decode_flexbuffer_map
from coralrt._sim.kernels import OpContext

__all__ = ["detection_postprocess", "DETECTION_POSTPROCESS"]

DETECTION_POSTPROCESS = "TFLite_Detection_PostProcess"


def _refuse(detail: str):
    raise ModelError(detail, where=f"{DETECTION_POSTPROCESS} operator")


def _option(opts: dict, key: str, kind, default=None):
    value = opts.get(key, default)
    if value is None or isinstance(value, bool) and kind is not bool:
        _refuse(f"option {key!r} is missing or invalid ({value!r})")
    try:
        return kind(value)
    except (TypeError, ValueError):
        _refuse(f"option {key!r} is not a number ({value!r})")


def _dequantizer(ctx: OpContext, t):
    dtype = ctx.dtype(t)
    if dtype == np.dtype(np.float32):
        return lambda v: np.asarray(v, np.float32)
    if dtype in (np.dtype(np.uint8), np.dtype(np.int8)) and len(t.scales):
        scale, zp = np.float32(ctx.scale(t)), np.float32(ctx.zero_point(t))
        return lambda v: (np.asarray(v).astype(np.float32) - zp) * scale
    _refuse(f"tensor {t.name!r} is {t.type_name}; FLOAT32, UINT8 or INT8 are supported")


def _iou_row(b: np.ndarray, area_i, o: np.ndarray, area_o: np.ndarray) -> np.ndarray:
    """IoU of box ``b`` (area ``area_i``) with the boxes ``o`` (areas ``area_o``),
    in float32 as LiteRT computes it."""
    zero = np.float32(0)
    ih = np.maximum(np.minimum(b[2], o[:, 2]) - np.maximum(b[0], o[:, 0]), zero)
    iw = np.maximum(np.minimum(b[3], o[:, 3]) - np.maximum(b[1], o[:, 1]), zero)
    inter = ih * iw
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / (area_i + area_o - inter)
    if area_i <= 0:
        return np.zeros(len(o), np.float32)
    return np.where(area_o <= 0, zero, iou)


def _nms_single(boxes, scores, threshold, iou_threshold, limit) -> list[int]:
    """Indices of the boxes single-class NMS keeps, best first."""
    keep = np.flatnonzero(scores >= threshold)
    order = keep[np.argsort(-scores[keep], kind="stable")]
    # The candidates in score order, with their areas, gathered once.  A box
    # already suppressed stays so, so each step compares with every later one.
    cand = boxes[order]
    areas = (cand[:, 2] - cand[:, 0]) * (cand[:, 3] - cand[:, 1])
    active = np.ones(len(order), bool)
    selected: list[int] = []
    i = 0
    while len(selected) < limit and i < len(order):
        i += int(np.argmax(active[i:]))        # the next box not yet suppressed
        if not active[i]:
            break                              # none is left
        selected.append(int(order[i]))
        if i + 1 < len(order):
            iou = _iou_row(cand[i], areas[i], cand[i + 1:], areas[i + 1:])
            active[i + 1:] &= ~(iou > iou_threshold)
        i += 1
    return selected


def detection_postprocess(ctx: OpContext):
    opts = decode_flexbuffer_map(ctx.op.custom_options)
    if opts is None:
        _refuse("the custom options are not a FlexBuffer map")
    max_det = _option(opts, "max_detections", int)
    per_det = _option(opts, "max_classes_per_detection", int, 1)
    per_class = _option(opts, "detections_per_class", int, 100)
    num_classes = _option(opts, "num_classes", int)
    score_th = np.float32(_option(opts, "nms_score_threshold", float))
    iou_th = np.float32(_option(opts, "nms_iou_threshold", float))
    regular = bool(opts.get("use_regular_nms", False))
    scales = [np.float64(np.float32(_option(opts, k, float)))
              for k in ("y_scale", "x_scale", "h_scale", "w_scale")]
    if len(ctx.inputs) != 3 or len(ctx.outputs) != 4:
        _refuse("takes 3 inputs (boxes, scores, anchors) and gives 4 outputs")
    box_t, score_t, anchor_t = ctx.inputs
    if len(box_t.shape) != 3 or box_t.shape[0] != 1 or box_t.shape[2] < 4:
        _refuse(f"box encodings have shape {tuple(box_t.shape)}, not (1, boxes, >=4)")
    num_boxes = box_t.shape[1]
    with_bg = score_t.shape[-1]
    offset = with_bg - num_classes
    if tuple(anchor_t.shape) != (num_boxes, 4) or offset < 0 or score_t.shape[1] != num_boxes:
        _refuse(f"anchors {tuple(anchor_t.shape)} / scores {tuple(score_t.shape)} do not "
                f"match {num_boxes} boxes of {num_classes} classes")
    if max_det <= 0 or per_det <= 0 or not 0 < iou_th <= 1 or (regular and per_class <= 0):
        _refuse("max_detections, max_classes_per_detection, detections_per_class must be "
                "positive and nms_iou_threshold in (0, 1]")
    de_box, de_score, de_anchor = (_dequantizer(ctx, t) for t in ctx.inputs)
    n_out = max_det * per_det
    ys, xs, hs, ws = scales

    def run(inputs):
        enc = de_box(inputs[0]).reshape(num_boxes, -1)[:, :4].astype(np.float64)
        anc = de_anchor(inputs[2]).reshape(num_boxes, 4).astype(np.float64)
        yc = (enc[:, 0] / ys * anc[:, 2] + anc[:, 0]).astype(np.float32)
        xc = (enc[:, 1] / xs * anc[:, 3] + anc[:, 1]).astype(np.float32)
        with np.errstate(over="ignore"):
            hh = (0.5 * np.exp(enc[:, 2] / hs) * anc[:, 2]).astype(np.float32)
            hw = (0.5 * np.exp(enc[:, 3] / ws) * anc[:, 3]).astype(np.float32)
        boxes = np.stack([yc - hh, xc - hw, yc + hh, xc + hw], axis=1)
        # LiteRT checks every decoded box before its suppression
        # (detection_postprocess.cc, ValidateBoxes) and fails the inference
        # on one whose corners are the wrong way round (a negative anchor or
        # scale); NaN corners pass, as they do there.
        if (boxes[:, 0] > boxes[:, 2]).any() or (boxes[:, 1] > boxes[:, 3]).any():
            raise InferenceError(f"{DETECTION_POSTPROCESS}: a decoded box has ymin > ymax or "
                                 f"xmin > xmax (negative anchor sizes or box scales)")
        scores = de_score(inputs[1]).reshape(num_boxes, with_bg)[:, offset:]
        out_boxes = np.zeros((n_out, 4), np.float32)
        out_classes = np.zeros(n_out, np.float32)
        out_scores = np.zeros(n_out, np.float32)
        if regular:
            count = _regular(boxes, scores, score_th, iou_th, max_det, per_class,
                             out_boxes, out_classes, out_scores)
        else:
            count = _fast(boxes, scores, score_th, iou_th, max_det, per_det,
                          out_boxes, out_classes, out_scores)
        return [out_boxes.reshape(1, n_out, 4), out_classes.reshape(1, n_out),
                out_scores.reshape(1, n_out), np.array([count], np.float32)]
    return run


def _fast(boxes, scores, score_th, iou_th, max_det, per_det, ob, oc, os_) -> int:
    k = min(per_det, scores.shape[1])
    if k == 1:
        top = np.argmax(scores, axis=1)[:, None]       # the first maximum, as max_element
    else:
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    best = scores[np.arange(len(scores)), top[:, 0]]
    selected = _nms_single(boxes, best, score_th, iou_th, max_det)
    for n, i in enumerate(selected):
        rows = slice(per_det * n, per_det * n + k)
        ob[rows] = boxes[i]
        oc[rows] = top[i]
        os_[rows] = scores[i, top[i]]
    return len(selected)


def _regular(boxes, scores, score_th, iou_th, max_det, per_class, ob, oc, os_) -> int:
    limit = min(per_class, max_det)
    cand_scores = np.zeros(0, np.float32)
    cand_box = np.zeros(0, np.int64)
    cand_class = np.zeros(0, np.int64)
    for c in range(scores.shape[1]):
        column = np.ascontiguousarray(scores[:, c])
        sel = np.asarray(_nms_single(boxes, column, score_th, iou_th, limit), np.int64)
        cand_scores = np.concatenate([cand_scores, column[sel]])
        cand_box = np.concatenate([cand_box, sel])
        cand_class = np.concatenate([cand_class, np.full(sel.size, c, np.int64)])
        order = np.argsort(-cand_scores, kind="stable")[:max_det]
        cand_scores, cand_box, cand_class = cand_scores[order], cand_box[order], \
            cand_class[order]
    n = len(cand_scores)
    ob[:n] = boxes[cand_box]
    oc[:n] = cand_class
    os_[:n] = cand_scores
    return n
