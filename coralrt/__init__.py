"""coralrt: a pure-Python inference runtime for the Google Coral Edge TPU.

    from coralrt import InferenceSession
    sess = InferenceSession("model.tflite", target="cpu")
    outputs = sess.run({"input": image})

The public facade (``docs/api.md``): the session and its options, the model
layer's entry points, tensor descriptions, the plugin marker, target
registration, and (imported on first use, since they pull
in the USB driver and the compile cache) ``open_device``, ``list_devices``,
``EdgeTpuDevice`` and ``CompileCache``.
"""

from __future__ import annotations

import importlib

from coralrt.errors import CoralRTError
from coralrt._model import Model, load_model
from coralrt.plugins._hookspecs import hookimpl
from coralrt._session import TARGETS, InferenceSession, SessionOptions
from coralrt._targets import Target, prepare_on_device
from coralrt._targets import register as register_target
from coralrt._targets import unregister as unregister_target
from coralrt._tensors import TensorInfo, dequantize, quantize

__all__ = [
    "InferenceSession", "SessionOptions", "TARGETS", "TensorInfo", "Model", "load_model",
    "quantize", "dequantize", "CoralRTError", "hookimpl", "open_device", "list_devices",
    "EdgeTpuDevice", "CompileCache", "__version__", "Target", "register_target",
    "unregister_target", "prepare_on_device",
]

# name -> module that defines it; imported when first asked for.
_LAZY = {
    "open_device": "coralrt._usb",
    "list_devices": "coralrt._usb",
    "EdgeTpuDevice": "coralrt._runtime.device",
    "CompileCache": "coralrt._compile.cache",
}


def __getattr__(name: str):
    if name == "__version__":   # importlib.metadata is slow to import
        from coralrt._version import version
        return version()
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'coralrt' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
