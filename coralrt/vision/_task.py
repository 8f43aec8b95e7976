"""Which vision task a model does, told from its outputs."""

from __future__ import annotations

from coralrt.errors import InputError
from coralrt.vision._detect import box_score_outputs, postprocess_outputs, yolo_output
from coralrt.vision._yolo import head_shape
from coralrt.vision._pose import is_pose_output

__all__ = ["TASKS", "guess_task"]

TASKS = ("classify", "detect", "segment", "pose")


def guess_task(session) -> str:
    """The task of ``session``'s model, from its outputs, first rule that holds:

    1. ``detect``: the four outputs of a ``TFLite_Detection_PostProcess``
       operator, or two outputs boxes [1, N, 4] + scores [1, N, C];
    2. ``pose``: an output of shape [1, 1, 17, 3] (MoveNet single-pose);
    3. ``segment``: one output [1, H, W] or [1, H, W, C] with H, W > 1 whose
       aspect ratio H / W is within a factor of 2 of the image input's (a mask
       covers the image);
    4. ``detect``: one output that is a YOLO head whose layout its shape tells
       (:func:`~coralrt.vision._yolo.yolo_layout` with ``strict``: [1, 4 + C, N],
       [1, N, 6], or N the anchor count of the input's grid);
    5. ``classify``: one output holding more than one value in its last
       dimension only ([1, C] or [C]).

    Any other output shaped like a YOLO head makes the error say to name the task.
    """
    if postprocess_outputs(session) is not None or box_score_outputs(session) is not None:
        return "detect"
    shapes = [tuple(i.shape) for i in session.get_outputs()]
    if any(is_pose_output(s) for s in shapes):
        return "pose"
    if len(shapes) == 1:
        s = shapes[0]
        if len(s) in (3, 4) and s[0] == 1 and s[1] > 1 and s[2] > 1 \
                and _image_like(session, s[1], s[2]):
            return "segment"
        if yolo_output(session, strict=True) is not None:
            return "detect"
        size = 1
        for d in s:
            size *= d
        if s and size > 1 and size == s[-1]:
            return "classify"
    hint = ""
    if any(head_shape(s) for s in shapes):
        hint = (" (an output looks like a YOLO head, but its shape does not say which layout: "
                "name the task detect, and the layout if the default rule is wrong)")
    raise InputError(f"cannot tell the task from the model's outputs {[list(s) for s in shapes]}"
                     f"; name it (classify, detect, segment or pose){hint}")


def _image_like(session, height: int, width: int) -> bool:
    """Whether a [height, width] map has about the aspect ratio of the model's image
    input (within a factor of 2); True when the input is not one [1, H, W, C] image."""
    inputs = [i.shape for i in session.get_inputs()]
    if len(inputs) != 1 or len(inputs[0]) != 4 or min(inputs[0][1:3]) < 1:
        return True
    ratio = (height / width) / (inputs[0][1] / inputs[0][2])
    return 0.5 <= ratio <= 2.0
