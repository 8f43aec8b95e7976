"""The CPU backend interface: a backend loads model bytes into a program.

A :class:`CpuBackend` wraps one interpreter library (LiteRT, tflite-runtime);
:meth:`CpuBackend.load` turns a complete ``.tflite`` model into a
:class:`CpuProgram` whose :meth:`CpuProgram.run` is the per-inference path.
Everything that can be checked is checked in ``load`` so that ``run`` only
moves tensors and invokes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from coralrt.errors import ConfigError, ModelError
from coralrt._runtime.program import Program

__all__ = ["CpuBackend", "CpuProgram", "KERNEL_SETS"]

#: Accepted values of ``kernels``: ``"optimized"`` is the interpreter's default
#: resolver (XNNPACK and optimized kernels), ``"reference"`` the TFLite
#: reference kernels (``OpResolverType.BUILTIN_REF``), which define the integer
#: semantics the simulated Edge TPU is compared against.
KERNEL_SETS = ("optimized", "reference")


class CpuProgram(Program):
    """A model loaded into a CPU backend, ready to run: a
    :class:`~coralrt._runtime.program.Program` of one step.

    ``input_details`` and ``output_details`` are the interpreter's own detail
    dicts (``name``, ``index``, ``shape``, ``shape_signature``, ``dtype``,
    ``quantization_parameters``, ...), in model input and output order.

    ``lock`` serializes every call into the interpreter, which is not
    thread-safe. It is re-entrant so that a caller can hold it around
    :meth:`resize_inputs` followed by :meth:`run` to make the pair atomic.

    ``label`` names the step in :meth:`profile`; ``operators`` is the model's
    operator count when whoever loaded it knows it (None otherwise);
    ``last_seconds`` is the host time of the last :meth:`run`.
    """

    input_details: list[dict[str, Any]]
    output_details: list[dict[str, Any]]

    def __init__(self, label: str = "cpu: whole model") -> None:
        super().__init__()
        self.input_details = []
        self.output_details = []
        self.label = label
        self.operators: int | None = None
        self.last_seconds = 0.0

    def profile(self) -> list[dict]:
        return [{"step": 0, "kind": "cpu", "label": self.label, "operators": self.operators,
                 "host_seconds": self.last_seconds, "device_seconds": None}]

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run once.

        ``inputs`` are in model input order and already have the dtype and
        shape of ``input_details``. Returns a fresh copy of every output, in
        model output order.
        """
        raise NotImplementedError

    def resize_inputs(self, shapes: list[tuple[int, ...]]) -> None:
        """Give the inputs new shapes (one per input, in model input order).

        Only dimensions that are ``-1`` in an input's ``shape_signature`` may
        change. Refreshes ``input_details`` and ``output_details``.
        """
        raise NotImplementedError


class CpuBackend:
    """One CPU interpreter library.

    ``name`` is the key :func:`coralrt._backends.get_backend` knows it by,
    ``version`` the version of the underlying library.
    """

    name: str = ""
    version: str = ""

    def load(
        self,
        model_bytes: bytes,
        *,
        num_threads: int | None = None,
        kernels: str = "optimized",
    ) -> CpuProgram:
        """Load a complete ``.tflite`` model and allocate its tensors.

        ``num_threads`` ``None`` leaves the choice to the interpreter.
        ``kernels`` is one of :data:`KERNEL_SETS`.
        """
        raise NotImplementedError

    @staticmethod
    def checked_load_arguments(model_bytes, num_threads, kernels: str) -> bytes:
        """``model_bytes`` as bytes, after the checks every backend's :meth:`load`
        makes of its arguments (ConfigError, or ModelError for an empty model)."""
        if kernels not in KERNEL_SETS:
            raise ConfigError(f"unknown kernels {kernels!r}; choose one of "
                              f"{', '.join(KERNEL_SETS)}")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
            raise ConfigError(f"num_threads must be a positive int or None, got {num_threads!r}")
        if not isinstance(model_bytes, bytes):
            model_bytes = bytes(model_bytes)
        if not model_bytes:
            raise ModelError("the CPU backend rejected the model: it is empty (0 bytes)")
        return model_bytes

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.version}>"
