"""The compiler contract: what a segment compiler is and what it may answer.

A segment compiler turns one Edge TPU segment, cut out of a model as a
standalone :class:`~coralrt._model.Model`, into the program a device runs.
:func:`coralrt._compile.segments.compile_model` partitions a model, calls
:meth:`Compiler.compile_segment` on each segment and puts each program back
into the model as one CUSTOM operator named :attr:`Compiler.op_name`, whose
``custom_options`` are the program's bytes.  coralrt's own compilers
subclass :class:`Compiler`: the native one
(:class:`~coralrt._compile.native.NativeCompiler`, programs for the simulated
Edge TPU), edgetpu_compiler
(:class:`~coralrt._compile.edgetpu_compiler.EdgeTpuCompiler`) and the compile
service's client (:class:`~coralrt._compile.remote.RemoteCompiler`).

A compiler may also be any object with the same attributes (duck typing, as
third-party plugins registered them before this class existed): the plugin
registry accepts it as it is, and the compile paths wrap it with
:func:`as_compiler`, which fills in what such an object may leave out.

What ``compile_segment`` may answer, besides the program:

* :class:`~coralrt.errors.SegmentNotMapped` (re-exported here): the compiler
  maps only part of the segment.  This is not a failure of the compile: it is
  how a compiler hands operators back to the CPU.  ``cpu_ops`` lists them as
  indices into the piece's operators, ``reasons`` says why per operator;
  ``compile_model`` moves them to the CPU with those reasons and compiles
  the rest of the segment again, cut into convex groups.  With ``cpu_ops``
  empty, the compiler mapped everything but not as one program: the segment
  is cut in two halves.  Compiler runs spent on such pieces are bounded
  (``max_compiles``); what is left when the budget is spent stays on the
  CPU.  It never reaches the caller of ``compile_model``.
* :class:`~coralrt.errors.SegmentTooLargeError`: the segment's activations
  do not fit in on-chip memory; the segment is cut in two halves (one
  operator alone stays on the CPU).
* any other error (:class:`~coralrt.errors.CompileError`, ...) ends the
  compile and reaches the caller.

The program is ``bytes``; a ``bytes`` subclass may also carry
``input_names`` and ``output_names`` (the program's own order of its
tensors, when it differs from the plan's) and ``report`` (a dict; its
``on_chip_bytes`` and ``off_chip_bytes`` enter the partition summary), as
:class:`~coralrt._compile.edgetpu_compiler.CompiledSegment` does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from coralrt.errors import SegmentNotMapped
from coralrt._formats.opnames import SEGMENT_OP
from coralrt._model.types import Model

__all__ = ["Compiler", "SegmentNotMapped", "as_compiler"]


class Compiler(ABC):
    """Base class of segment compilers.

    A subclass sets :attr:`id`, :attr:`version` and :attr:`runs_on` (plain
    class attributes, or properties) and implements :meth:`compile_segment`;
    :attr:`op_name` defaults to coralrt's native segment operator.
    """

    #: The custom operator that carries this compiler's programs in a compiled
    #: model: one of the program formats of :mod:`coralrt._formats.opnames`
    #: (``coralrt-segment`` or ``edgetpu-custom-op``), which tells the executor
    #: and the device how to load them.
    op_name: str = SEGMENT_OP

    @property
    @abstractmethod
    def id(self) -> str:
        """The compiler's name; with :attr:`version` it keys the compile cache."""

    @property
    @abstractmethod
    def version(self) -> str:
        """The compiler's version (part of cache keys).  May be a property that asks
        something slow (a binary, a compile service): it is read only when a compile
        first needs it, never at plugin registration."""

    @property
    @abstractmethod
    def runs_on(self) -> tuple[str, ...]:
        """The device kinds that execute this compiler's programs (``("sim",)``...);
        the compile cache records them, so that a machine without this compiler
        finds entries for its device."""

    @abstractmethod
    def compile_segment(self, piece: Model) -> bytes:
        """The program for ``piece`` (one segment as a standalone model).

        Raises :class:`SegmentNotMapped` to leave operators on the CPU (see the
        module docstring: it is an answer, not a failure)."""


class _DuckCompiler(Compiler):
    """A compiler object that does not subclass :class:`Compiler`, seen through the
    contract: ``runs_on`` defaults to ``()`` and ``op_name`` to ``coralrt-segment``."""

    def __init__(self, compiler) -> None:
        self.compiler = compiler

    @property
    def id(self) -> str:
        return self.compiler.id

    @property
    def version(self) -> str:
        return self.compiler.version

    @property
    def runs_on(self) -> tuple[str, ...]:
        return tuple(getattr(self.compiler, "runs_on", ()))

    @property
    def op_name(self) -> str:  # type: ignore[override]
        return getattr(self.compiler, "op_name", SEGMENT_OP)

    def compile_segment(self, piece: Model) -> bytes:
        return self.compiler.compile_segment(piece)

    def __repr__(self) -> str:
        return repr(self.compiler)


def as_compiler(compiler) -> Compiler:
    """``compiler`` as a :class:`Compiler`: itself when it subclasses it, else a
    wrapper that reads its ``id``, ``version``, ``runs_on``, ``op_name`` and
    ``compile_segment`` when they are asked for (``runs_on`` and ``op_name`` may be
    missing)."""
    return compiler if isinstance(compiler, Compiler) else _DuckCompiler(compiler)
