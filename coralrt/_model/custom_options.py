"""Custom operator options: FlexBuffer decoding and checks for the custom
operators the CPU backends ship themselves.

LiteRT resolves a few custom operators on its own (the SSD post-processing
head is the common one).  Their kernels trust the FlexBuffer options and the
tensor shapes they imply; damaged options crash the process inside the
kernel, so coralrt checks them before loading.
"""

from __future__ import annotations

from flatbuffers import flexbuffers

from coralrt.errors import ModelError
from coralrt._model.types import Operator, Subgraph

__all__ = ["decode_flexbuffer_map", "check_known_custom_op"]


def decode_flexbuffer_map(data) -> dict | None:
    """The custom options as a dict when they are a FlexBuffer map, else None.

    Decoding is bounded by the size of ``data``: FlexBuffer vectors may all
    point at one inner vector, so a kilobyte of options can describe billions
    of values (``flexbuffers.Loads`` would expand them all).  Past
    :func:`_budget` decoded values the options are refused with ModelError.
    """
    if data is None or len(data) < 3:
        return None
    raw = bytes(data)
    budget = [_budget(len(raw))]
    try:
        root = flexbuffers.GetRoot(raw)
        if not root.IsMap:
            return None
        value = _value(root, budget)
    except ModelError:
        raise
    except Exception:  # the decoder raises whatever indexing a bad buffer hits
        return None
    return value if isinstance(value, dict) else None


def _budget(size: int) -> int:
    # An unshared FlexBuffer spends at least one byte per value, so a valid
    # map never comes near four values per byte.
    return 4 * size + 64


def _value(ref, budget: list[int]):
    budget[0] -= 1
    if budget[0] < 0:
        raise ModelError("custom options: the FlexBuffer describes more values than its "
                         "size allows (shared vectors repeated past the decode budget)")
    if ref.IsMap:
        m = ref.AsMap
        keys, values = m.Keys, m.Values
        return {keys[i].AsKey: _value(values[i], budget) for i in range(len(m))}
    if ref.IsVector:
        v = ref.AsVector
        return [_value(v[i], budget) for i in range(len(v))]
    if ref.IsTypedVector or ref.IsFixedTypedVector:
        v = ref.AsTypedVector if ref.IsTypedVector else ref.AsFixedTypedVector
        budget[0] -= len(v) // 16    # scalars, decoded in one call
        return ref.Value
    return ref.Value


def _detection_postprocess(sg: Subgraph, op: Operator, where: str) -> None:
    opts = decode_flexbuffer_map(op.custom_options)
    if opts is None:
        raise ModelError("TFLite_Detection_PostProcess options are not a FlexBuffer map",
                         where=where)

    def positive(key: str, kind=int, required: bool = True):
        value = opts.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ModelError(f"TFLite_Detection_PostProcess option {key}={value!r} must be a "
                             f"positive number", where=where)
        return kind(value)

    num_classes = positive("num_classes")
    positive("max_detections")
    positive("max_classes_per_detection")
    for key in ("x_scale", "y_scale", "w_scale", "h_scale"):
        positive(key, float)
    if opts.get("use_regular_nms"):
        positive("detections_per_class")
    iou = opts.get("nms_iou_threshold")
    if not isinstance(iou, (int, float)) or not 0 < iou <= 1:
        raise ModelError(f"TFLite_Detection_PostProcess nms_iou_threshold={iou!r} must be in "
                         f"(0, 1]", where=where)
    if len(op.inputs) != 3 or len(op.outputs) != 4 or min(op.inputs) < 0:
        raise ModelError("TFLite_Detection_PostProcess needs 3 inputs (boxes, scores, "
                         "anchors) and 4 outputs", where=where)
    boxes, scores, anchors = (sg.tensors[i].shape for i in op.inputs)
    if len(boxes) != 3 or len(scores) != 3 or len(anchors) != 2:
        raise ModelError(f"TFLite_Detection_PostProcess input ranks {len(boxes)}, "
                         f"{len(scores)}, {len(anchors)}; expected 3, 3, 2", where=where)
    if not (boxes[1] == scores[1] == anchors[0]) or boxes[2] != 4 or anchors[1] != 4:
        raise ModelError(f"TFLite_Detection_PostProcess shapes disagree: boxes {list(boxes)}, "
                         f"scores {list(scores)}, anchors {list(anchors)}", where=where)
    n_boxes = boxes[1]
    for key, limit in (("max_classes_per_detection", num_classes),
                       ("max_detections", n_boxes), ("detections_per_class", n_boxes)):
        if key in opts and isinstance(opts[key], int) and opts[key] > limit:
            raise ModelError(f"TFLite_Detection_PostProcess option {key}={opts[key]} exceeds "
                             f"{limit}", where=where)
    if scores[2] not in (num_classes, num_classes + 1):
        raise ModelError(f"TFLite_Detection_PostProcess has num_classes={num_classes} but "
                         f"scores for {scores[2]} classes", where=where)


_CHECKS = {"TFLite_Detection_PostProcess": _detection_postprocess}


def check_known_custom_op(sg: Subgraph, op: Operator, where: str) -> None:
    check = _CHECKS.get(op.name)
    if check is not None:
        check(sg, op, where)
