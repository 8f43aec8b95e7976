"""What plugins see of the runtime: read-only descriptions of operators and steps.

Both are part of the plugin contract (``coralrt/plugins/_hookspecs.py``): a
plugin CPU kernel receives an :class:`OpInfo`, the ``coralrt_run_step`` hook a
:class:`StepInfo`.  The executor builds them once, when a program is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from coralrt._tensors import TensorInfo

__all__ = ["OpInfo", "StepInfo"]


@dataclass
class OpInfo:
    """What a plugin CPU kernel sees of its operator."""

    name: str
    options: dict
    custom_options: bytes
    flex_options: dict | None
    inputs: list[TensorInfo | None]
    outputs: list[TensorInfo]
    index: int = -1


@dataclass(frozen=True)
class StepInfo:
    """What the ``coralrt_run_step`` hook sees of a step: a read-only description.

    ``index`` is the step's position in its program, ``kind`` one of "tpu",
    "cpu" or "plugin", ``operators`` the operator indices of the compiled
    model it runs, ``device`` the stick's path for Edge TPU steps (else
    None).  ``run(inputs)`` executes the step; coralrt's own implementation
    of the hook calls it.
    """

    index: int
    kind: str
    label: str
    operators: tuple[int, ...]
    device: str | None
    run: Callable[[list], list] = field(repr=False, compare=False)
