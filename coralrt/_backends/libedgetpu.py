"""``driver="libedgetpu"``: Edge TPU segments through Google's libedgetpu.

Where libedgetpu is installed, ``target="coral"`` can hand the model that
coralrt prepared (a ``*_edgetpu.tflite``, or the JIT's compiled model with
``edgetpu-custom-op`` operators) to the LiteRT interpreter with the Edge TPU
delegate (``load_delegate("libedgetpu.so.1", {"device": "usb:0"})``): the
delegate takes the custom operators, LiteRT's CPU kernels the rest.  It is a
cross-check of coralrt's own USB driver and a fallback, never chosen by
itself (docs/libedgetpu.md).

A libedgetpu build made for another LiteRT version can crash the process
that loads it (a segfault, not an exception).  So the library is first
loaded in a child process (:func:`~coralrt._backends.libedgetpu_probe.probe`),
which reports what happened; a crash, an error or a timeout there becomes a
:class:`~coralrt.errors.DriverUnavailableError` and the user's process
never loads it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from ..errors import ConfigError, DriverUnavailableError, ModelError
from coralrt._formats.opnames import EDGETPU_OP, SEGMENT_OP
from coralrt._backends.base import KERNEL_SETS, CpuBackend
from coralrt._backends.litert import (
    _DELEGATE_REFUSED,
    LiteRTProgram,
    _import_real,
    _native_text,
    _NativeFailure,
    _translate,
)
from coralrt._backends.libedgetpu_probe import (LIBRARY, PROBE_TIMEOUT, Probe, clear_probe_cache, failure,
                               probe)
from coralrt._backends.native_log import native_info_to_log

__all__ = ["LIBRARY", "PROBE_TIMEOUT", "Probe", "probe", "clear_probe_cache",
           "delegate_options", "check_ready", "load_program",
           "DelegateProgram"]

log = logging.getLogger("coralrt.backends")

# -- options ------------------------------------------------------------------------------

_INDEXED = re.compile(r"(?:usb)?:(\d+)")


def delegate_options(device) -> dict[str, str]:
    """The Edge TPU delegate's options for the session's ``device=``: None ->
    ``{"device": "usb"}`` (the first USB stick libedgetpu finds); ``"usb"``;
    ``"usb:N"`` or ``":N"`` -> ``{"device": "usb:N"}`` (libedgetpu's own
    numbering).  A list of sticks, an open device object and a port path are
    ConfigErrors: libedgetpu opens one stick itself, by its number."""
    if device is None:
        return {"device": "usb"}
    if isinstance(device, (list, tuple)):
        raise ConfigError(
            f"device={list(device)!r}: several sticks are not supported with "
            f"driver='libedgetpu' (libedgetpu binds one interpreter to one stick); give one "
            f"stick, e.g. device='usb:0', or use driver='coralrt' for replicate/pipeline")
    if not isinstance(device, str):
        raise ConfigError(
            f"device={type(device).__name__} object: with driver='libedgetpu' libedgetpu "
            f"opens the stick itself; give device='usb' or 'usb:N' instead of an open device")
    path = device.strip().lower()
    if path == "usb":
        return {"device": "usb"}
    m = _INDEXED.fullmatch(path)
    if m is None:
        raise ConfigError(
            f"device={device!r} is not understood with driver='libedgetpu': give 'usb' (the "
            f"first stick) or 'usb:N' (libedgetpu's N-th USB stick); port paths are "
            f"understood by driver='coralrt' only")
    return {"device": f"usb:{int(m.group(1))}"}


# -- loading ------------------------------------------------------------------------------

def _module_of(backend: CpuBackend) -> str:
    module = getattr(backend, "_module", "")
    if not module:
        raise ConfigError(f"driver='libedgetpu' needs a LiteRT interpreter backend ('litert' "
                          f"or 'tflite_runtime'); backend {backend.name!r} cannot load "
                          f"delegates")
    return module


def check_ready(backend: CpuBackend, device=None, *, library: str | None = None,
                timeout: float = PROBE_TIMEOUT) -> dict[str, str]:
    """The delegate options for ``device`` once a child process has loaded the
    library and created the delegate; DriverUnavailableError otherwise."""
    options = delegate_options(device)
    p = probe(library or LIBRARY, module=_module_of(backend), options=options, timeout=timeout)
    if not p.ok:
        raise failure(p, options, timeout)
    return options


def _refuse(model, host, override_builtins: bool) -> None:
    names = {op.name for op in model.main.operators}
    if SEGMENT_OP in names:
        raise ModelError("this model holds coralrt-segment operators (coralrt's native "
                         "compiler), which only the simulated Edge TPU runs; libedgetpu runs "
                         "edgetpu_compiler programs: use target='sim', or driver='coralrt'")
    if host is None:
        return
    kernels = host.ops.kernels
    plugged = sorted(n for n in names if n in kernels and n != EDGETPU_OP and (
        override_builtins or any(op.opcode.is_custom for op in model.main.operators
                                 if op.name == n)))
    if host.wraps_steps or plugged:
        why = (f"plugin kernels for {plugged}" if plugged
               else "a plugin that wraps each step (coralrt_run_step)")
        raise ConfigError(f"driver='libedgetpu' runs the whole model in one LiteRT "
                          f"interpreter, so {why} cannot run there; use driver='coralrt'")


def load_program(model, data: bytes | None = None, *, backend: CpuBackend, device=None,
                 num_threads: int | None = None, kernels: str = "optimized", host=None,
                 override_builtins: bool = False, library: str | None = None,
                 timeout: float = PROBE_TIMEOUT) -> DelegateProgram:
    """``model`` (its bytes ``data``, else serialized here) in ``backend``'s
    interpreter with the Edge TPU delegate of ``library``, after a probe."""
    _module_of(backend)       # a backend without an interpreter has no delegates
    resolver = getattr(backend, "_resolvers", {}).get(kernels)
    if kernels not in KERNEL_SETS or resolver is None:
        raise ConfigError(f"unknown kernels {kernels!r}; choose one of {', '.join(KERNEL_SETS)}")
    if num_threads is not None and (not isinstance(num_threads, int) or num_threads < 1):
        raise ConfigError(f"num_threads must be a positive int or None, got {num_threads!r}")
    _refuse(model, host, override_builtins)
    library = library or LIBRARY
    options = check_ready(backend, device, library=library, timeout=timeout)
    data = bytes(data) if data else model.to_bytes()
    mod = _import_real(_module_of(backend))
    with native_info_to_log():
        try:
            delegate = mod.load_delegate(library, options)
        except (ValueError, RuntimeError, OSError) as e:
            p = Probe(library, backend._module, "delegate", _native_text(e))
            raise failure(p, options, timeout) from e
    try:
        interp = _interpreter(backend, data, num_threads, resolver, delegate, kernels)
    except _NativeFailure as native:
        error = _translate(native.error, native.stage)
        if getattr(error, "op_name", None) == EDGETPU_OP:   # the delegate left them
            raise DriverUnavailableError(
                f"the delegate of {library} did not take the model's {EDGETPU_OP} "
                f"operators, so nothing can run them; is {library} really libedgetpu? "
                f"[{error}]", library=library, cause="delegate",
                detail=str(error)) from native.error
        raise error from native.error
    n_tpu = sum(1 for op in model.main.operators if op.name == EDGETPU_OP)
    program = DelegateProgram(interp, delegate, n_tpu,
                              f"libedgetpu {options['device']} + {backend.name}: whole model")
    program.operators = len(model.main.operators)
    log.info("driver 'libedgetpu': %d Edge TPU segment(s) on %s through %s, the rest on %s",
             n_tpu, options["device"], library, backend.name)
    return program


def _interpreter(backend, data, num_threads, resolver, delegate, kernels):
    def make(res):
        return backend._prepared(data, num_threads, res, delegates=[delegate])

    try:
        return make(resolver)
    except _NativeFailure as native:   # as the CPU backend does: XNNPACK's refusals
        if kernels != "optimized" or not _DELEGATE_REFUSED.search(str(native.error)):
            raise
        log.info("libedgetpu: the XNNPACK delegate cannot prepare this model (%s); using "
                 "the builtin kernels without it", _native_text(native.error))
        return make(backend._without_delegates)


class DelegateProgram(LiteRTProgram):
    """A whole model in one interpreter whose Edge TPU delegate runs its
    ``edgetpu-custom-op`` operators: one profile row, kind ``"tpu"`` when the
    model has such operators (the device time is not known: None)."""

    def __init__(self, interpreter: Any, delegate: Any, edgetpu_ops: int, label: str) -> None:
        self._delegate = delegate    # outlives the interpreter
        self.edgetpu_ops = edgetpu_ops
        super().__init__(interpreter, label)

    def profile(self) -> list[dict]:
        return [{"step": 0, "kind": "tpu" if self.edgetpu_ops else "cpu", "label": self.label,
                 "operators": self.operators, "host_seconds": self.last_seconds,
                 "device_seconds": None}]

    def close(self) -> None:
        # Releases the stick: the interpreter first (it holds the delegate), then the delegate.
        with self.lock:
            self._interp = self._set_tensor = self._invoke = self._get_tensor = None
            self._delegate = None
