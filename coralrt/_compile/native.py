"""coralrt's native compiler: a TPU segment -> a coralrt segment for the simulated Edge TPU.

A segment (``docs/segment-format.md``) carries the operators, tensors,
quantization, parameters and on-chip memory plan that the simulated Edge
TPU runs with TFLite's integer semantics.  No real Edge TPU executes it: a
real stick refuses it (:class:`~coralrt.errors.ProgramRefusedError`).  The
segment loop that partitions a model and calls a segment compiler is
:mod:`coralrt._compile.segments`.
"""

from __future__ import annotations

from coralrt._compile.base import Compiler
from coralrt.errors import SegmentNotMapped
from coralrt._formats import segment as seg_format
from coralrt._formats import segment_codec
from coralrt._formats.opnames import SEGMENT_OP
from coralrt._model.types import Model
from coralrt._ops import operator_table
from coralrt._ops.checks import OpView
from coralrt._ops.width import layer_width
from coralrt._version import version as coralrt_version

__all__ = ["NativeCompiler"]


class NativeCompiler(Compiler):
    """Builds coralrt segments; their programs run on the simulated Edge TPU."""

    id = seg_format.COMPILER_ID
    runs_on = ("sim",)
    op_name = SEGMENT_OP

    @property
    def version(self) -> str:
        return f"{coralrt_version()}+seg{segment_codec.FORMAT_VERSION}"

    def compile_segment(self, piece: Model) -> bytes:
        too_wide = _too_wide(piece)
        if too_wide:
            raise SegmentNotMapped(too_wide, too_wide, total_ops=len(piece.main.operators))
        return segment_codec.encode(seg_format.build_segment(
            piece, compiler_id=self.id, compiler_version=self.version))


def _too_wide(piece: Model) -> dict[int, str]:
    """Layers wider than edgetpu_compiler fits on chip (ops/checks.py
    ``layer_width``): the same limit as the support rules, kept here too so a
    segment planned with other rules (a plugin's) cannot hold one either."""
    sg = piece.main
    reasons = {}
    limited = _width_limited()
    for i, op in enumerate(sg.operators):
        if op.name in limited:
            reason = layer_width(OpView(sg, op, i))
            if reason:
                reasons[i] = reason
    return reasons


def _width_limited() -> frozenset[str]:
    """Operators whose spec's Edge TPU rule checks ``layer_width``."""
    return frozenset(name for name, support in operator_table("tpu").items()
                     if layer_width in support.checks)
