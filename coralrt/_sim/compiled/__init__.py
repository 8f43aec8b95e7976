"""Compiled kernels: the optional ``coralrt[fast]`` extra (numba).

With numba installed, CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED run as
compiled loops that compute in integers what TFLite's reference kernels do,
with the requantization in the same loop (:mod:`coralrt._sim.compiled._jit`);
the simulated Edge TPU and the NumPy CPU backend both use them.  Without
numba, or when it fails to import or to compile, or with
``CORALRT_COMPILED_KERNELS=0``, the NumPy kernels run (one log line says
why).  Operators whose arithmetic the compiled loops do not cover (an
accumulator that may leave int32, shifts past 31, other types) keep the NumPy
kernel, operator by operator.

The first use in a process compiles the loops, or loads them from numba's
disk cache (``__pycache__`` beside the module, or numba's user cache folder
when that is not writable); :func:`status` reports how long that took.
"""

from __future__ import annotations

import logging
import os
import threading
import time

__all__ = ["ENV", "enabled", "status", "summary", "jit"]

log = logging.getLogger("coralrt.sim")

#: Environment variable: 0, false, no or off force the NumPy kernels.
ENV = "CORALRT_COMPILED_KERNELS"
_OFF = ("0", "false", "no", "off", "numpy")

_lock = threading.Lock()
_state: dict = {}        # "module", "error", "seconds", "version"


def _forced_off() -> bool:
    return os.environ.get(ENV, "").strip().lower() in _OFF


def _load() -> None:
    """Import numba and compile (or load from the disk cache) every loop once."""
    with _lock:
        if _state:
            return
        t0 = time.perf_counter()
        try:
            import numba
            from coralrt._sim.compiled import _jit, warm
            warm.warm_up(_jit)
        except ImportError as exc:
            _state["error"] = f"numba is not installed ({exc})"
            log.info("compiled kernels unavailable: %s; the NumPy kernels run "
                     "(pip install 'coralrt[fast]' to add them)", _state["error"])
            return
        except Exception as exc:   # numba present but broken (LLVM, NumPy too new, ...)
            _state["error"] = f"numba failed: {type(exc).__name__}: {exc}"
            log.warning("compiled kernels unavailable: %s; the NumPy kernels run",
                        _state["error"])
            return
        _state.update(module=_jit, version=numba.__version__,
                      seconds=time.perf_counter() - t0)
        log.info("compiled kernels (numba %s) ready in %.2f s (first use in this process; "
                 "compiled code is cached on disk)", numba.__version__, _state["seconds"])


def jit():
    """The compiled loops' module when they are to be used, else None."""
    if _forced_off():
        return None
    _load()
    return _state.get("module")


def enabled() -> bool:
    """Whether new kernels will be the compiled ones."""
    return jit() is not None


def status() -> dict:
    """What :func:`jit` would give: ``kernels`` ("compiled" or "numpy"), ``reason``,
    ``numba`` (version or None) and ``first_use_seconds`` (import plus compile or
    cache load, once per process)."""
    if _forced_off():
        return {"kernels": "numpy", "reason": f"{ENV}={os.environ.get(ENV)}", "numba": None,
                "first_use_seconds": None}
    _load()
    if "module" not in _state:
        return {"kernels": "numpy", "reason": _state.get("error", ""), "numba": None,
                "first_use_seconds": None}
    return {"kernels": "compiled", "reason": "", "numba": _state["version"],
            "first_use_seconds": _state["seconds"]}


def summary() -> str:
    """One line for ``coralrt doctor``: which convolution kernels run, and why."""
    s = status()
    if s["kernels"] == "compiled":
        return (f"compiled (numba {s['numba']}; first use in this process "
                f"{s['first_use_seconds']:.2f} s, compiled code cached on disk)")
    return (f"NumPy ({s['reason']}; pip install 'coralrt[fast]' adds compiled kernels, "
            f"{ENV}=0 forces NumPy)")
