"""coralrt: a pure-Python inference runtime for the Google Coral Edge TPU.

    from coralrt import InferenceSession
    sess = InferenceSession("model.tflite", target="cpu")
    outputs = sess.run({"input": image})
"""

from __future__ import annotations

from coralrt.plugins.hookspecs import hookimpl
from coralrt.errors import CoralRTError
from coralrt.model import Model, load_model
from coralrt.session import TARGETS, InferenceSession
from coralrt.tensors import TensorInfo, dequantize, quantize

__all__ = [
    "InferenceSession", "TARGETS", "TensorInfo", "Model", "load_model", "quantize",
    "dequantize", "CoralRTError", "hookimpl", "__version__",
]


def __getattr__(name: str):
    # Computed lazily: importlib.metadata is slow to import.
    if name == "__version__":
        from coralrt.version import version
        return version()
    raise AttributeError(f"module 'coralrt' has no attribute {name!r}")
