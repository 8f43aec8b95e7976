"""``ai_edge_litert.interpreter`` under coralrt.compat: LiteRT, except for libedgetpu.

Programs moving from tflite_runtime to LiteRT write
``from ai_edge_litert.interpreter import Interpreter, load_delegate`` and load
libedgetpu's delegate.  Under ``python -m coralrt.compat`` or
``CORALRT_COMPAT=1`` that import gets this module, which is LiteRT's own
(every name is the installed module's) with two differences:

* ``load_delegate`` of a libedgetpu library name (``libedgetpu.so.1`` ...)
  returns coralrt's Edge TPU delegate (:func:`coralrt.tflite.load_delegate`,
  with its checks: no stick, no delegate); any other library is LiteRT's;
* ``Interpreter`` given coralrt's Edge TPU delegate is a
  :class:`coralrt.tflite.Interpreter` (the model runs on ``CORALRT_TARGET``);
  without it, it is LiteRT's interpreter (a subclass that adds nothing).

coralrt's own CPU work and its ``driver="libedgetpu"`` path import the
installed module directly (:func:`coralrt._backends.litert._import_real`),
never this one, so nothing here calls back into itself.
"""

from __future__ import annotations

import os

from coralrt._backends.litert import _import_real
from coralrt.tflite import interpreter as _coralrt
from coralrt.tflite._delegate import EDGETPU_LIBRARIES, EdgeTpuDelegate

_real = _import_real("ai_edge_litert.interpreter")

__all__ = ["Interpreter", "load_delegate"]


def _is_libedgetpu(library) -> bool:
    return isinstance(library, (str, os.PathLike)) and \
        os.path.basename(os.fspath(library)) in EDGETPU_LIBRARIES


def load_delegate(library, options=None):
    """LiteRT's ``load_delegate``; coralrt's Edge TPU delegate for libedgetpu."""
    if _is_libedgetpu(library):
        return _coralrt.load_delegate(library, options)
    return _real.load_delegate(library, options)


def _delegates_of(args, kwargs) -> list:
    if "experimental_delegates" in kwargs:
        return list(kwargs["experimental_delegates"] or ())
    return list(args[2] or ()) if len(args) > 2 else []


class Interpreter(_real.Interpreter):
    """LiteRT's ``Interpreter``; a :class:`coralrt.tflite.Interpreter` when one of
    ``experimental_delegates`` is coralrt's Edge TPU delegate."""

    def __new__(cls, *args, **kwargs):
        if any(isinstance(d, EdgeTpuDelegate) for d in _delegates_of(args, kwargs)):
            # Not an instance of cls, so Python does not call __init__ on it again.
            return _coralrt.Interpreter(*args, **kwargs)
        return super().__new__(cls)


def __getattr__(name: str):
    return getattr(_real, name)


def __dir__() -> list[str]:
    return sorted(set(dir(_real)) | set(__all__))
