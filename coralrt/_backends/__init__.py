"""CPU backends: whole CPU segments run in an installed TFLite interpreter, or in
coralrt's own NumPy kernels where no interpreter is installed.

>>> backend = get_backend()   # "litert" if usable, else "tflite_runtime", else "numpy"
>>> program = backend.load(model_bytes, kernels="reference")
>>> outputs = program.run([x])

``base.py`` holds the :class:`CpuBackend` interface and :class:`CpuProgram`
(a :class:`~coralrt._runtime.program.Program`); ``litert.py`` the LiteRT
(``ai_edge_litert``) and ``tflite_runtime`` backends and the one function
that translates their errors; ``numpy_backend.py`` the ``numpy`` backend, for
machines without LiteRT wheels (32-bit ARM, RISC-V...), imported only when it
is asked for.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from ..errors import BackendUnavailableError, ConfigError
from coralrt._wheels import LITERT_WHEEL_PLATFORMS, has_wheels
from coralrt._backends.base import KERNEL_SETS, CpuBackend, CpuProgram
from coralrt._backends.litert import LiteRTBackend, TFLiteRuntimeBackend

__all__ = [
    "CpuBackend",
    "CpuProgram",
    "KERNEL_SETS",
    "LITERT_WHEEL_PLATFORMS",
    "available_backends",
    "backend_report",
    "backend_names",
    "get_backend",
    "litert_has_wheels",
]

log = logging.getLogger("coralrt.backends")

def litert_has_wheels(sys_platform: str | None = None, machine: str | None = None) -> bool:
    """Whether ``pip install ai-edge-litert`` can find a wheel for this interpreter."""
    return has_wheels("ai-edge-litert", sys_platform, machine)


def _numpy_backend() -> CpuBackend:
    """The ``numpy`` backend; its module is imported here, not with coralrt."""
    try:
        from coralrt._backends.numpy_backend import NumpyBackend
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.numpy_backend":
            raise
        raise BackendUnavailableError(
            "CPU backend 'numpy' is not part of this copy of coralrt "
            "(coralrt/_backends/numpy_backend.py is missing)") from e
    return NumpyBackend()


# In order of preference for get_backend(None): each entry makes the backend or
# raises BackendUnavailableError.
_REGISTRY: dict[str, Callable[[], CpuBackend]] = {
    "litert": LiteRTBackend,
    "tflite_runtime": TFLiteRuntimeBackend,
    "numpy": _numpy_backend,
}
# The backend get_backend(None) falls back on, saying so once per process.
_FALLBACK = "numpy"
# One instance per backend: creating one imports the native library.
_instances: dict[str, CpuBackend] = {}
_lock = threading.Lock()
_fallback_logged = False


def backend_names() -> list[str]:
    """Every backend name coralrt knows, installed or not."""
    return list(_REGISTRY)


def _fallback_message(failures: list[tuple[str, BackendUnavailableError]]) -> str:
    """Why get_backend(None) took the NumPy kernels: the interpreters it tried."""
    what = "running CPU work with coralrt's NumPy kernels (backend 'numpy')"
    if all("is not installed" in str(e) for _, e in failures):
        packages = ", ".join(getattr(_REGISTRY[n], "_package", n) for n, _ in failures)
        return f"no LiteRT interpreter is installed ({packages}); {what}"
    reasons = "; ".join(f"{n}: {e}" for n, e in failures)
    return f"no LiteRT interpreter is usable ({reasons}); {what}"


def get_backend(name: str | None = None) -> CpuBackend:
    """Return the CPU backend called ``name``.

    ``None`` picks the first usable one of ``"litert"``, ``"tflite_runtime"`` and
    ``"numpy"``; taking ``"numpy"`` that way is logged once per process at INFO
    level, with the reasons the interpreters were not usable. Raises
    :class:`~coralrt.errors.ConfigError` for an unknown name and
    :class:`~coralrt.errors.BackendUnavailableError` when the backend (or, for
    ``None``, every backend) cannot be used.
    """
    if name is None:
        global _fallback_logged
        failures: list[tuple[str, BackendUnavailableError]] = []
        for candidate in _REGISTRY:
            try:
                backend = get_backend(candidate)
            except BackendUnavailableError as e:
                failures.append((candidate, e))
                continue
            if candidate == _FALLBACK and failures:
                with _lock:
                    first, _fallback_logged = not _fallback_logged, True
                if first:
                    log.info("%s", _fallback_message(failures))
            return backend
        raise BackendUnavailableError(
            "no CPU backend is installed; install one with `pip install ai-edge-litert` "
            f"({'; '.join(str(e) for _, e in failures)})"
        )
    make = _REGISTRY.get(name)
    if make is None:
        raise ConfigError(
            f"unknown CPU backend {name!r}; known backends: {', '.join(_REGISTRY)}"
        )
    with _lock:
        backend = _instances.get(name)
        if backend is None:
            try:
                backend = make()
            except BackendUnavailableError:
                raise
            except ImportError as e:   # an import hook, a half-installed package...
                raise BackendUnavailableError(
                    f"CPU backend {name!r} cannot be imported: {e}") from e
            _instances[name] = backend
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
