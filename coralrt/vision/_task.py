"""Which vision task a model does, told from its outputs."""

from __future__ import annotations

from coralrt.errors import InputError
from coralrt.vision._detect import box_score_outputs, postprocess_outputs
from coralrt.vision._pose import is_pose_output

__all__ = ["TASKS", "guess_task"]

TASKS = ("classify", "detect", "segment", "pose")


def guess_task(session) -> str:
    """The task of ``session``'s model, from its outputs, first rule that holds:

    1. ``detect``: the four outputs of a ``TFLite_Detection_PostProcess``
       operator, or two outputs boxes [1, N, 4] + scores [1, N, C];
    2. ``pose``: an output of shape [1, 1, 17, 3] (MoveNet single-pose);
    3. ``segment``: one output [1, H, W] or [1, H, W, C] with H, W > 1;
    4. ``classify``: one output holding more than one value in its last
       dimension only ([1, C] or [C]).
    """
    if postprocess_outputs(session) is not None or box_score_outputs(session) is not None:
        return "detect"
    shapes = [tuple(i.shape) for i in session.get_outputs()]
    if any(is_pose_output(s) for s in shapes):
        return "pose"
    if len(shapes) == 1:
        s = shapes[0]
        if len(s) in (3, 4) and s[0] == 1 and s[1] > 1 and s[2] > 1:
            return "segment"
        size = 1
        for d in s:
            size *= d
        if s and size > 1 and size == s[-1]:
            return "classify"
    raise InputError(f"cannot tell the task from the model's outputs {[list(s) for s in shapes]}"
                     f"; name it (classify, detect, segment or pose)")
