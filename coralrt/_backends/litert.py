"""CPU backends over the LiteRT (``ai_edge_litert``) and ``tflite_runtime`` interpreters.

Both packages expose the same ``Interpreter`` class, so one implementation
serves both; the subclasses only say which module to import. The import
happens when a backend object is created, never when coralrt is imported.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import re
import sys
import threading
from time import perf_counter as _clock
from typing import Any

import numpy as np

from ..errors import (
    BackendUnavailableError,
    CoralRTError,
    InferenceError,
    InputError,
    ModelError,
    UnsupportedOperatorError,
)
from coralrt._backends.base import CpuBackend, CpuProgram
from coralrt._backends.native_log import native_info_to_log
from coralrt._backends.xnnpack_limits import xnnpack_refuses

__all__ = ["LiteRTBackend", "TFLiteRuntimeBackend", "LiteRTProgram",
           "NO_TFLITE_RUNTIME_WHEELS"]

#: The first Python that tflite-runtime publishes no wheels for (its last
#: release, 2.14.0, stops at Python 3.11).
NO_TFLITE_RUNTIME_WHEELS = (3, 12)

log = logging.getLogger("coralrt.backends")

# Messages of the TFLite C++ core, identical in LiteRT and tflite-runtime.
_UNRESOLVED_CUSTOM = re.compile(r"Encountered unresolved custom op: (.+?)\.(?:\s|$)")
_MISSING_BUILTIN = re.compile(r"Didn't find op for builtin opcode '([^']+)' version '(\d+)'")
_NODE = re.compile(r"Node number (\d+) \(")
_NODE_SENTENCE = re.compile(r"\s*Node number \d+ \([^)]*\) failed to prepare\.?")
_DELEGATE_REFUSED = re.compile(r"\(TfLiteXNNPackDelegate\) failed to prepare")


# -- the real package, past coralrt.compat's aliases ----------------------------------------
#
# coralrt.compat maps ``tflite_runtime`` to coralrt's own stand-in for user programs: a finder
# marked ``coralrt_compat`` first on sys.meta_path and aliases in sys.modules. This backend
# needs the installed package: while it imports it, the marked finders and the aliases are
# set aside, and afterwards the real modules leave sys.modules again (kept here), so the
# user's imports still get the mapping.

_REAL_LOCK = threading.RLock()
_real_modules: dict[str, Any] = {}


def _aliased(top: str) -> bool:
    return any(getattr(f, "coralrt_compat", False) for f in sys.meta_path) or any(
        getattr(m, "__name__", k) != k for k, m in list(sys.modules.items())
        if k == top or k.startswith(top + "."))


@contextlib.contextmanager
def _without_compat_aliases(top: str):
    """Imports of ``top`` inside see only what is installed; yields the real modules
    imported meanwhile (name -> module)."""
    with _REAL_LOCK:
        if not _aliased(top):
            yield {}
            return
        finders = [(i, f) for i, f in enumerate(sys.meta_path)
                   if getattr(f, "coralrt_compat", False)]

        def mine(k: str) -> bool:
            # A name of the package that the finders map (all of tflite_runtime; of
            # ai_edge_litert only its interpreter module), or an alias left behind.
            if not (k == top or k.startswith(top + ".")):
                return False
            maps = [getattr(f, "coralrt_maps", None) for _, f in finders]
            if any(m is None or m(k) for m in maps):
                return True
            module = sys.modules.get(k)
            return module is not None and getattr(module, "__name__", k) != k
        aliases = {k: m for k, m in list(sys.modules.items()) if mine(k)}
        for k, m in aliases.items():        # real modules under a mapped name: reused
            if getattr(m, "__name__", k) == k and not _is_compat_placeholder(m):
                _real_modules.setdefault(k, m)
        for _, f in finders:
            sys.meta_path.remove(f)
        for k in aliases:
            del sys.modules[k]
        sys.modules.update({k: m for k, m in _real_modules.items() if mine(k)})
        imported: dict[str, Any] = {}
        try:
            yield imported
        finally:
            for k in [k for k in sys.modules if mine(k)]:
                imported[k] = sys.modules.pop(k)
            _real_modules.update(imported)
            sys.modules.update(aliases)
            for k, alias in aliases.items():    # the real import rebound the attribute
                parent, _, child = k.rpartition(".")
                if parent and parent in sys.modules:
                    setattr(sys.modules[parent], child, alias)
            for i, f in finders:
                sys.meta_path.insert(i, f)


def _is_compat_placeholder(module) -> bool:
    """A module coralrt.compat's finder is loading (it becomes an alias when done)."""
    loader = getattr(getattr(module, "__spec__", None), "loader", None)
    return bool(getattr(loader, "coralrt_compat", False))


def _import_real(name: str) -> Any:
    """``importlib.import_module(name)`` of the installed package, never coralrt.compat's
    stand-in for it; the same module object every time."""
    with _REAL_LOCK:
        known = _real_modules.get(name)
        if known is not None:
            return known
        top = name.partition(".")[0]
        with _without_compat_aliases(top) as imported:
            module = importlib.import_module(name)
        module = imported.get(name, module)
        _real_modules[name] = module
        return module


class _NativeFailure(Exception):
    """An exception of the native interpreter and the stage that raised it."""

    def __init__(self, error: BaseException, stage: str):
        super().__init__(str(error))
        self.error, self.stage = error, stage


def _native_text(exc: BaseException) -> str:
    # The native error reporter appends to one buffer across calls and adds
    # a tutorial URL: keep one readable line.
    text = re.sub(r"\s*See instructions: \S+", "", str(exc))
    return " ".join(text.split()) or type(exc).__name__


def _translate(exc: BaseException, stage: str) -> CoralRTError:
    """Map an exception raised by the native interpreter to a coralrt error.

    ``stage`` is where it was raised: ``"load"``, ``"allocate"``,
    ``"resize"``, ``"set_input"`` or ``"invoke"``.
    """
    raw = str(exc)
    text = _native_text(exc)
    log.debug("native %s error: %s", stage, raw)
    node = _NODE.search(raw)
    where = f"operator {node.group(1)}" if node else None

    m = _UNRESOLVED_CUSTOM.search(raw)
    if m and stage in ("load", "allocate"):
        # The node number goes into ``where``, where a compiled model's CPU step
        # renumbers it as the user's model numbers it (runtime/executor.py).
        said = _NODE_SENTENCE.sub("", text).strip() or text
        return UnsupportedOperatorError(
            m.group(1), where=where, detail=f"the CPU backend says: {said}"
        )
    m = _MISSING_BUILTIN.search(raw)
    if m and stage in ("load", "allocate"):
        op, version = m.groups()
        return UnsupportedOperatorError(
            op,
            where=where,
            detail=(
                f"the CPU backend has no kernel for {op} version {version}; a newer "
                f"ai-edge-litert may have it"
            ),
        )
    if stage in ("load", "allocate"):
        # No ``where``: it would go before the required message prefix, and the
        # native text already names the node.
        return ModelError(f"the CPU backend rejected the model: {text}")
    if stage in ("resize", "set_input"):
        return InputError(f"the CPU backend rejected the inputs: {text}")
    return InferenceError(f"the CPU backend failed while running the model: {text}")


class LiteRTProgram(CpuProgram):
    """A model loaded into one interpreter instance."""

    def __init__(self, interpreter: Any, label: str = "cpu: whole model") -> None:
        super().__init__(label)
        self._interp = interpreter
        # Bound methods fetched once: run() is the hot path.
        self._set_tensor = interpreter.set_tensor
        self._invoke = interpreter.invoke
        self._get_tensor = interpreter.get_tensor
        self._refresh()

    def _refresh(self) -> None:
        self.input_details = self._interp.get_input_details()
        self.output_details = self._interp.get_output_details()
        self._in_idx = tuple(int(d["index"]) for d in self.input_details)
        self._out_idx = tuple(int(d["index"]) for d in self.output_details)
        self._n_in = len(self._in_idx)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if len(inputs) != self._n_in:
            raise InputError(
                f"the model has {self._n_in} input(s), got {len(inputs)} array(s)"
            )
        set_tensor, get_tensor = self._set_tensor, self._get_tensor
        start = _clock()
        with self.lock:
            try:
                for index, value in zip(self._in_idx, inputs):
                    set_tensor(index, value)
            except (ValueError, RuntimeError) as e:
                raise _translate(e, "set_input") from e
            try:
                self._invoke()
            except (ValueError, RuntimeError) as e:
                raise _translate(e, "invoke") from e
            # get_tensor copies, so the caller owns what it gets.
            outputs = [get_tensor(index) for index in self._out_idx]
            self.last_seconds = _clock() - start
            return outputs

    def resize_inputs(self, shapes: list[tuple[int, ...]]) -> None:
        shapes = [tuple(int(d) for d in s) for s in shapes]
        with self.lock:
            current = [tuple(int(d) for d in det["shape"]) for det in self.input_details]
            if shapes == current:
                return
            self._check_shapes(shapes)
            try:
                for index, shape in zip(self._in_idx, shapes):
                    self._interp.resize_tensor_input(index, list(shape), strict=True)
                self._interp.allocate_tensors()
            except (ValueError, RuntimeError) as e:
                self._restore(current)
                raise _translate(e, "resize") from e
            self._refresh()

    def _check_shapes(self, shapes: list[tuple[int, ...]]) -> None:
        # Checked here so that the caller gets a message naming the input
        # instead of the interpreter's accumulated error text.
        if len(shapes) != self._n_in:
            raise InputError(f"the model has {self._n_in} input(s), got {len(shapes)} shape(s)")
        for det, shape in zip(self.input_details, shapes):
            sig = tuple(int(d) for d in det.get("shape_signature", det["shape"]))
            ok = len(shape) == len(sig) and all(
                s >= 0 and (g == -1 or s == g) for s, g in zip(shape, sig)
            )
            if not ok:
                raise InputError(
                    f"input {det['name']!r}: cannot take shape {shape}; its shape "
                    f"signature is {sig} and only the -1 dimensions may change"
                )

    def _restore(self, shapes: list[tuple[int, ...]]) -> None:
        try:
            for index, shape in zip(self._in_idx, shapes):
                self._interp.resize_tensor_input(index, list(shape), strict=True)
            self._interp.allocate_tensors()
        except (ValueError, RuntimeError):
            log.warning("could not restore the input shapes after a failed resize", exc_info=True)

    def __repr__(self) -> str:
        return f"<LiteRTProgram inputs={self._n_in} outputs={len(self._out_idx)}>"


class _InterpreterBackend(CpuBackend):
    """Shared implementation; subclasses name the module and its package."""

    _module = ""
    _package = ""

    def __init__(self) -> None:
        top = self._module.partition(".")[0]
        with _without_compat_aliases(top):
            if importlib.util.find_spec(top) is None:
                raise BackendUnavailableError(self._not_installed())
        # Before the import: a broken native module may fail noisily on import.
        self._check_usable()
        try:
            mod = _import_real(self._module)
        except ImportError as e:
            raise BackendUnavailableError(
                f"CPU backend {self.name!r} is installed but cannot be imported ({e}); "
                f"reinstall it with `pip install --force-reinstall {self._package}`"
            ) from e
        self._Interpreter = mod.Interpreter
        self._resolvers = {
            "optimized": mod.OpResolverType.AUTO,
            "reference": mod.OpResolverType.BUILTIN_REF,
        }
        self._without_delegates = mod.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES
        self.version = str(getattr(_import_real(top), "__version__", "unknown"))

    def _check_usable(self) -> None:
        pass

    def _prepared(self, model_bytes: bytes, num_threads, resolver, delegates=()):
        """A native interpreter with its tensors allocated (with ``delegates``, e.g.
        libedgetpu's), or _NativeFailure."""
        extra = {"experimental_delegates": list(delegates)} if delegates else {}
        with native_info_to_log():
            try:
                interp = self._Interpreter(model_content=model_bytes, num_threads=num_threads,
                                           experimental_op_resolver_type=resolver, **extra)
            except (ValueError, RuntimeError) as e:
                raise _NativeFailure(e, "load") from e
            try:
                interp.allocate_tensors()
            except (ValueError, RuntimeError) as e:
                raise _NativeFailure(e, "allocate") from e
        return interp

    def _not_installed(self) -> str:
        return (f"CPU backend {self.name!r} is not installed; "
                f"install it with `pip install {self._package}`")

    def load(
        self,
        model_bytes: bytes,
        *,
        num_threads: int | None = None,
        kernels: str = "optimized",
    ) -> CpuProgram:
        # The native loader only takes bytes (it keeps a reference, no copy).
        model_bytes = self.checked_load_arguments(model_bytes, num_threads, kernels)
        resolver = self._resolvers[kernels]
        if kernels == "optimized":
            refusal = xnnpack_refuses(model_bytes)
            if refusal is not None:
                log.info("%s: the XNNPACK delegate cannot run this model (%s); using the "
                         "builtin kernels without it", self.name, refusal)
                resolver = self._without_delegates
        try:
            interp = self._prepared(model_bytes, num_threads, resolver)
        except _NativeFailure as failure:
            # The default kernels apply the XNNPACK delegate, which refuses some
            # operators that TFLite's builtin kernels run (the RESIZE_BILINEAR of
            # older DeepLab files): run without the delegate rather than refuse.
            if kernels != "optimized" or not _DELEGATE_REFUSED.search(str(failure.error)):
                raise _translate(failure.error, failure.stage) from failure.error
            log.info("%s: the XNNPACK delegate cannot prepare this model (%s); using the "
                     "builtin kernels without it", self.name, _native_text(failure.error))
            try:
                interp = self._prepared(model_bytes, num_threads, self._without_delegates)
            except _NativeFailure as again:
                raise _translate(again.error, again.stage) from again.error
        program = LiteRTProgram(interp, f"cpu: whole model ({self.name})")
        log.debug(
            "%s %s loaded %d-byte model: kernels=%s num_threads=%s, %d inputs, %d outputs",
            self.name, self.version, len(model_bytes), kernels, num_threads,
            len(program.input_details), len(program.output_details),
        )
        return program


class LiteRTBackend(_InterpreterBackend):
    """The LiteRT interpreter from the ``ai-edge-litert`` package (the default)."""

    name = "litert"
    _module = "ai_edge_litert.interpreter"
    _package = "ai-edge-litert"


class TFLiteRuntimeBackend(_InterpreterBackend):
    """The interpreter from the ``tflite-runtime`` package."""

    name = "tflite_runtime"
    _module = "tflite_runtime.interpreter"
    _package = "tflite-runtime"

    def _not_installed(self) -> str:
        if sys.version_info >= NO_TFLITE_RUNTIME_WHEELS:
            return (f"CPU backend 'tflite_runtime' is not installed, and cannot be on Python "
                    f"{sys.version_info[0]}.{sys.version_info[1]}: tflite-runtime has no "
                    f"wheels for Python 3.12 or newer, so `pip install tflite-runtime` finds "
                    f"nothing and the 'coralrt[tflite-runtime]' extra installs nothing. Use "
                    f"the default backend 'litert' (`pip install ai-edge-litert`)")
        return ("CPU backend 'tflite_runtime' is not installed; install it with "
                "`pip install tflite-runtime 'numpy<2'` (its wheels need NumPy 1)")

    def _check_usable(self) -> None:
        # Its wheels are built against NumPy 1: under NumPy 2 the import works
        # but creating an Interpreter fails with "_ARRAY_API not found".
        if int(np.__version__.split(".")[0]) >= 2:
            raise BackendUnavailableError(
                f"CPU backend 'tflite_runtime' needs numpy<2 but numpy {np.__version__} "
                f"is installed; use `pip install ai-edge-litert` instead, or "
                f"`pip install 'numpy<2'`"
            )
