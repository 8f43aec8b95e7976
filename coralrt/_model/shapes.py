"""Shapes a model file leaves out: the outputs of custom operators it declares
without a shape.

Converters write the outputs of some custom operators with an empty shape and
no rank (``has_rank`` false): the kernel sets their shapes when the
interpreter prepares the operator.  A rank-0 shape would read as a scalar, so
whatever reports tensor information (``InferenceSession.get_outputs()``,
``coralrt inspect``) asks :func:`inferred_shapes` first.  Shapes a file
declares (any rank, or ``has_rank``) are never replaced.

Known operators:

* ``TFLite_Detection_PostProcess``: boxes (1, N, 4), classes (1, N), scores
  (1, N) and the number of detections (1,), with N = ``max_detections`` *
  ``max_classes_per_detection`` from its FlexBuffer options, as LiteRT's
  ``detection_postprocess`` kernel sets them in its Prepare (batch size 1).
"""

from __future__ import annotations

from coralrt.errors import ModelError
from coralrt._model.custom_options import decode_flexbuffer_map
from coralrt._model.types import Operator, Subgraph, Tensor

__all__ = ["DETECTION_POSTPROCESS", "declares_shape", "inferred_shapes", "output_shapes"]

#: The SSD post-processing head LiteRT ships: outputs boxes, classes, scores, count.
DETECTION_POSTPROCESS = "TFLite_Detection_PostProcess"


def declares_shape(t: Tensor) -> bool:
    """Whether the file gives ``t`` a shape (a non-empty one, or a rank-0 one on purpose)."""
    return bool(t.shape) or t.has_rank


def _positive_int(opts: dict, key: str) -> int | None:
    value = opts.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def _detection_postprocess(op: Operator) -> list[tuple[int, ...]] | None:
    try:
        opts = decode_flexbuffer_map(op.custom_options)
    except ModelError:
        return None
    if opts is None:
        return None
    detections = _positive_int(opts, "max_detections")
    per_box = _positive_int(opts, "max_classes_per_detection")
    if detections is None or per_box is None:
        return None
    n = detections * per_box
    return [(1, n, 4), (1, n), (1, n), (1,)]


# custom code -> the shapes of its outputs, or None when its options do not say
_RULES = {DETECTION_POSTPROCESS: _detection_postprocess}


def output_shapes(op: Operator) -> list[tuple[int, ...]] | None:
    """The shapes the kernel of custom operator ``op`` gives its outputs, when coralrt knows."""
    rule = _RULES.get(op.name) if op.opcode.is_custom else None
    return None if rule is None else rule(op)


def inferred_shapes(sg: Subgraph) -> dict[int, tuple[int, ...]]:
    """Tensor index -> shape, for the outputs of ``sg`` 's operators the file declares none of."""
    out: dict[int, tuple[int, ...]] = {}
    for op in sg.operators:
        if op.name not in _RULES or all(
                declares_shape(sg.tensors[i]) for i in op.outputs if 0 <= i < len(sg.tensors)):
            continue
        shapes = output_shapes(op)
        for i, shape in zip(op.outputs, shapes or ()):
            if 0 <= i < len(sg.tensors) and not declares_shape(sg.tensors[i]):
                out[i] = shape
    return out
