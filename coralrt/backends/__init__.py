"""CPU backends: whole CPU segments run in an installed TFLite interpreter.

>>> backend = get_backend()            # "litert" if installed, else "tflite_runtime"
>>> program = backend.load(model_bytes, kernels="reference")
>>> outputs = program.run([x])

``base.py`` holds the :class:`CpuBackend` interface and :class:`CpuProgram`
(a :class:`~coralrt.runtime.program.Program`); ``litert.py`` the LiteRT
(``ai_edge_litert``) and ``tflite_runtime`` backends and the one function
that translates their errors.

May import (layer 8): errors, version, config, fileio, model, tensors,
formats, compile, sim (not sim.stick), runtime.
"""

from __future__ import annotations

import threading

from ..errors import BackendUnavailableError, ConfigError
from .base import KERNEL_SETS, CpuBackend, CpuProgram
from .litert import LiteRTBackend, TFLiteRuntimeBackend

__all__ = [
    "CpuBackend",
    "CpuProgram",
    "KERNEL_SETS",
    "available_backends",
    "backend_report",
    "backend_names",
    "get_backend",
]

# In order of preference for get_backend(None).
_REGISTRY: dict[str, type[CpuBackend]] = {
    "litert": LiteRTBackend,
    "tflite_runtime": TFLiteRuntimeBackend,
}
# One instance per backend: creating one imports the native library.
_instances: dict[str, CpuBackend] = {}
_lock = threading.Lock()


def backend_names() -> list[str]:
    """Every backend name coralrt knows, installed or not."""
    return list(_REGISTRY)


def get_backend(name: str | None = None) -> CpuBackend:
    """Return the CPU backend called ``name``.

    ``None`` picks the first installed one of ``"litert"`` and
    ``"tflite_runtime"``. Raises :class:`~coralrt.errors.ConfigError` for an
    unknown name and :class:`~coralrt.errors.BackendUnavailableError` when the
    backend (or, for ``None``, every backend) cannot be used.
    """
    if name is None:
        reasons = []
        for candidate in _REGISTRY:
            try:
                return get_backend(candidate)
            except BackendUnavailableError as e:
                reasons.append(str(e))
        raise BackendUnavailableError(
            "no CPU backend is installed; install one with `pip install ai-edge-litert` "
            f"({'; '.join(reasons)})"
        )
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ConfigError(
            f"unknown CPU backend {name!r}; known backends: {', '.join(_REGISTRY)}"
        )
    with _lock:
        backend = _instances.get(name)
        if backend is None:
            backend = _instances[name] = cls()
    return backend


def backend_report() -> list[dict]:
    """Every known backend: ``name``, ``usable``, ``version`` (when usable) and
    ``reason`` (why not, with what to do), in order of preference."""
    report = []
    for name in _REGISTRY:
        try:
            backend = get_backend(name)
        except BackendUnavailableError as e:
            report.append({"name": name, "usable": False, "version": None, "reason": str(e)})
        else:
            report.append({"name": name, "usable": True, "version": backend.version,
                           "reason": None})
    return report


def available_backends() -> list[str]:
    """Names of the backends that are installed and usable, in order of preference."""
    names = []
    for name in _REGISTRY:
        try:
            get_backend(name)
        except BackendUnavailableError:
            continue
        names.append(name)
    return names
