"""coralrt's native compiler: a TPU segment -> a coralrt segment for the simulated Edge TPU.

A segment (``docs/segment-format.md``) carries the operators, tensors,
quantization, parameters and on-chip memory plan that the simulated Edge
TPU runs with TFLite's integer semantics.  No real Edge TPU executes it: a
real stick refuses it (:class:`~coralrt.errors.ProgramRefusedError`).  The
generic driver that partitions a model and calls a segment compiler is
:mod:`coralrt.compile.driver`.
"""

from __future__ import annotations

from coralrt.formats import segment as seg_format
from coralrt.formats import segment_codec
from coralrt.formats.opnames import SEGMENT_OP
from coralrt.model.types import Model
from coralrt.version import version as coralrt_version

__all__ = ["NativeCompiler"]


class NativeCompiler:
    """Builds coralrt segments; their programs run on the simulated Edge TPU."""

    id = seg_format.COMPILER_ID
    runs_on = ("sim",)
    op_name = SEGMENT_OP

    @property
    def version(self) -> str:
        return f"{coralrt_version()}+seg{segment_codec.FORMAT_VERSION}"

    def compile_segment(self, piece: Model) -> bytes:
        return segment_codec.encode(seg_format.build_segment(
            piece, compiler_id=self.id, compiler_version=self.version))
