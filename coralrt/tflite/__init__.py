"""tflite_runtime's API on coralrt: ``Interpreter``, ``load_delegate``.

``import tflite_runtime.interpreter as tflite`` becomes
``import coralrt.tflite.interpreter as tflite`` (coralrt's import hook does
that mapping).  See :mod:`coralrt.tflite.interpreter`.
"""

from __future__ import annotations

from coralrt.tflite._delegate import EdgeTpuDelegate, load_delegate
from coralrt.tflite.interpreter import Interpreter, OpResolverType, SignatureRunner

__all__ = ["Interpreter", "SignatureRunner", "OpResolverType", "load_delegate",
           "EdgeTpuDelegate", "__version__"]


def __getattr__(name: str):
    if name == "__version__":   # coralrt's version (tflite_runtime has its own there)
        from coralrt._version import version
        return version()
    raise AttributeError(f"module 'coralrt.tflite' has no attribute {name!r}")
