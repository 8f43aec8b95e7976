"""tflite_runtime's ``Interpreter`` over coralrt's :class:`~coralrt.InferenceSession`.

The same methods, detail dicts, value types and exception types as
``tflite_runtime.interpreter`` (and LiteRT's ``ai_edge_litert.interpreter``):
a program written for tflite_runtime runs unchanged.  Without a delegate the
model runs on the ``cpu`` target; with the Edge TPU delegate
(:func:`load_delegate`) on ``CORALRT_TARGET`` (default ``auto``) and the
delegate's ``device``.

coralrt keeps the model's inputs and outputs only: reading an intermediate
tensor raises ``ValueError`` (tflite_runtime returns it, with
``experimental_preserve_all_tensors=True``).

As in tflite_runtime, ``allocate_tensors()``, ``invoke()`` and
``resize_tensor_input()`` raise ``RuntimeError`` while an array returned by
``tensor(i)()`` (or a view of it) is still referenced
(:mod:`coralrt.tflite._memory`), and a non-strict resize may change any
dimension of an input: on the ``cpu`` target the model then runs with those
dimensions made dynamic; elsewhere (Edge TPU programs have fixed shapes),
and for a change of rank, ``allocate_tensors()`` raises ``RuntimeError``.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import operator
import os
import weakref

import numpy as np

from coralrt import _config as config
from coralrt._session import InferenceSession
from coralrt._tensors import check_input
from coralrt._tensors import tensor_infos
from coralrt.errors import CoralRTError
from coralrt.tflite._delegate import EdgeTpuDelegate, load_delegate
from coralrt.tflite._details import tensor_details
from coralrt.tflite._memory import fixed_changes, held_elsewhere, widened
from coralrt.tflite._signature import SignatureRunner

__all__ = ["Interpreter", "SignatureRunner", "OpResolverType", "load_delegate",
           "EdgeTpuDelegate", "tensor_details"]

log = logging.getLogger("coralrt.tflite")

# Keyword arguments of LiteRT's Interpreter that change nothing coralrt does.
_IGNORED = frozenset({"experimental_disable_delegate_clustering",
                      "experimental_default_delegate_latest_features",
                      "experimental_compress_quantization_zero_points",
                      "experimental_disable_delegate_node_fusion",
                      "experimental_force_delegate_node_profiling"})
_NULL = "Tensor data is null. Run allocate_tensors() first"
_NOT_READY = "Invoke called on model that is not ready."

# Interpreters by the number _native_handle() gave out (what pycoral's invoke_with_*
# functions take in place of tflite_runtime's native pointer).
_HANDLES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _interpreter_of(handle) -> "Interpreter":
    """The interpreter whose ``_native_handle()`` is ``handle``; ValueError otherwise."""
    found = _HANDLES.get(handle) if isinstance(handle, int) else None
    if found is None:
        raise ValueError(f"{handle!r} is not the _native_handle() of a live coralrt "
                         f"Interpreter")
    return found


@enum.unique
class OpResolverType(enum.Enum):
    """tflite_runtime's op resolver types; LiteRT's and tflite_runtime's own
    enums are accepted too (compared by name)."""
    AUTO = 0
    BUILTIN = 1
    BUILTIN_REF = 2
    BUILTIN_WITHOUT_DEFAULT_DELEGATES = 3


_KERNELS = {"AUTO": "optimized", "BUILTIN": "optimized", "BUILTIN_REF": "reference",
            "BUILTIN_WITHOUT_DEFAULT_DELEGATES": "builtin"}


class Interpreter:
    """tflite_runtime's ``Interpreter``: see the module docstring.

    ``experimental_op_resolver_type`` picks the CPU kernels (``BUILTIN_REF``:
    TFLite's reference kernels); ``experimental_preserve_all_tensors`` is
    accepted, but intermediate tensors still cannot be read.  Model errors are
    coralrt's (:class:`~coralrt.errors.ModelError`, a ``ValueError``).
    """

    def __init__(self, model_path=None, model_content=None, experimental_delegates=None,
                 num_threads=None, experimental_op_resolver_type=None,
                 experimental_preserve_all_tensors=False, **kwargs):
        unknown = sorted(set(kwargs) - _IGNORED)
        if unknown:
            raise TypeError(f"Interpreter() got an unexpected keyword argument {unknown[0]!r}")
        kernels = _KERNELS.get(getattr(experimental_op_resolver_type, "name", "AUTO"))
        if kernels is None:
            raise ValueError(f"Unrecognized passed in op resolver type: "
                             f"{experimental_op_resolver_type}")
        if num_threads is not None:
            if not isinstance(num_threads, int):
                raise ValueError("type of num_threads should be int")
            if num_threads < 1:
                raise ValueError("num_threads should >= 1")
        if model_path and model_content:
            raise ValueError("Can't both provide `model_path` and `model_content`")
        if not model_path and not model_content:
            raise ValueError("`model_path` or `model_content` must be specified.")
        self._delegates = list(experimental_delegates or [])
        for d in self._delegates:
            if not isinstance(d, EdgeTpuDelegate):
                raise ValueError(f"experimental_delegates: {d!r} is not a delegate from "
                                 f"coralrt.tflite.load_delegate; coralrt provides only the "
                                 f"Edge TPU delegate")
        if len(self._delegates) > 1:
            raise ValueError("experimental_delegates: coralrt takes one Edge TPU delegate")
        target, device = "cpu", None
        if self._delegates:
            # load_delegate() checked that a stick serves it, as libedgetpu does.
            target = config.compat_target()
            device = self._delegates[0].device if target in ("coral", "auto") else None
        if model_path and not os.path.isfile(model_path):
            # tflite_runtime's wording (LiteRT's starts the same), which programs
            # match on; coralrt's own is "model file not found".
            raise ValueError(f"Could not open '{os.fspath(model_path)}'.")
        model = model_path if model_path else bytes(model_content)
        self._session = InferenceSession(model, target=target, device=device,
                                         num_threads=num_threads, cpu_kernels=kernels)
        log.info("tflite Interpreter on target %r%s", self._session.target,
                 f" (device {device})" if device else "")
        self._model = self._session.source_model
        main = self._model.main
        if len(main.inputs) != len(self._session.get_inputs()) or \
                len(main.outputs) != len(self._session.get_outputs()):
            self._model = self._session.model     # should not happen: describe what runs
            main = self._model.main
        self._main = main
        self._in = {t: p for p, t in enumerate(main.inputs)}
        self._out = {t: p for p, t in enumerate(main.outputs)}
        self._infos = tensor_infos(main, main.inputs)
        self._shapes = {i: main.tensors[i].shape for i in (*main.inputs, *main.outputs)}
        # Shapes the file leaves out (custom operator outputs), as LiteRT knows them
        # once allocate_tensors() has prepared the operators.
        self._inferred = {i.index: i.shape for i in tensor_infos(main, main.outputs)
                          if i.shape != main.tensors[i.index].shape}
        self._buffers: dict[int, np.ndarray] | None = None
        self._signature_defs = self.get_signature_list()
        # What runs invoke(): the session, or one of the model with the input
        # dimensions a resize changed made dynamic (``_widened``: input -> dims).
        self._runner = self._session
        self._widened: dict[int, set[int]] = {}

    # -- description --------------------------------------------------------------

    @property
    def session(self) -> InferenceSession:
        """The coralrt session that runs the model (its ``target``, ``profile()`` ...)."""
        return self._runner

    def _index(self, tensor_index) -> int:
        i = operator.index(tensor_index)       # TypeError for str and float, as LiteRT
        n = len(self._main.tensors)
        if not 0 <= i < n:
            raise ValueError(f"Invalid tensor index {i} exceeds max tensor index {n}")
        return i

    def _details(self, i: int) -> dict:
        return tensor_details(self._main.tensors[i], i, self._shapes.get(i))

    def get_input_details(self) -> list[dict]:
        return [self._details(i) for i in self._main.inputs]

    def get_output_details(self) -> list[dict]:
        return [self._details(i) for i in self._main.outputs]

    def get_tensor_details(self, subgraph_index: int = 0) -> list[dict]:
        n = len(self._model.subgraphs)
        if not 0 <= subgraph_index < n:
            raise ValueError(f"subgraph_index is out of range: {subgraph_index} for the "
                             f"model, which has {n} subgraphs.")
        if subgraph_index == 0:
            return [self._details(i) for i in range(len(self._main.tensors))]
        return [tensor_details(t, i)
                for i, t in enumerate(self._model.subgraphs[subgraph_index].tensors)]

    def num_subgraphs(self) -> int:
        return len(self._model.subgraphs)

    def get_signature_list(self) -> dict:
        return self._session.get_signatures()

    def _get_full_signature_list(self) -> dict:
        return {s.key: {"inputs": dict(s.inputs), "outputs": dict(s.outputs)}
                for s in self._model.signatures}

    def get_signature_runner(self, signature_key=None) -> SignatureRunner:
        if signature_key is None:
            if len(self._signature_defs) != 1:
                raise ValueError(
                    f"SignatureDef signature_key is None and model has "
                    f"{len(self._signature_defs)} Signatures. None is only allowed when the "
                    f"model has 1 SignatureDef")
            signature_key = next(iter(self._signature_defs))
        return SignatureRunner(self, signature_key)

    # -- tensors ------------------------------------------------------------------

    def allocate_tensors(self) -> None:
        self._ensure_safe()
        old = self._buffers or {}
        for i, shape in self._inferred.items():
            if self._shapes[i] == self._main.tensors[i].shape:
                self._shapes[i] = shape
        if any(self._shapes[i.index] != i.shape for i in self._infos) and not any(
                t.is_variable for t in self._main.tensors):
            # Resized: the output shapes follow from the inputs; a run with zeros
            # finds them (stateless models only, since a run changes state).
            zeros = [np.zeros(self._shapes[i.index], i.dtype) for i in self._infos]
            try:
                results = self._run(zeros)
            except (CoralRTError, RuntimeError) as e:
                self._buffers = None    # not ready, as LiteRT after a failed allocation
                raise RuntimeError(f"allocate_tensors: the model cannot run with the input "
                                   f"shapes {[list(z.shape) for z in zeros]}: {e}") from e
            for i, value in zip(self._main.outputs, results.values()):
                self._shapes[i] = value.shape
        buffers = {}
        for i in (*self._main.inputs, *self._main.outputs):
            shape = self._shapes[i]
            kept = old.get(i)
            buffers[i] = kept if kept is not None and kept.shape == shape else np.zeros(
                shape, self._main.tensors[i].dtype)
        self._buffers = buffers

    def _buffer(self, i: int) -> np.ndarray:
        if i not in self._in and i not in self._out:
            t = self._main.tensors[i]
            raise ValueError(f"tensor {i} ({t.name!r}) is not an input or output of the model: "
                             f"coralrt keeps only those and cannot read or write intermediate "
                             f"tensors (experimental_preserve_all_tensors does not change "
                             f"that)")
        if self._buffers is None:
            raise ValueError(_NULL)
        return self._buffers[i]

    def set_tensor(self, tensor_index, value) -> None:
        """Copy ``value`` into input ``tensor_index`` (dtype and current shape as
        coralrt checks them: ``ValueError`` naming the input otherwise)."""
        i = self._index(tensor_index)
        if self._buffers is None and (i in self._in or i in self._out):
            raise ValueError("Cannot set tensor: Tensor is unallocated. Try calling "
                             "allocate_tensors() first")
        buf = self._buffer(i)
        pos = self._in.get(i)
        if pos is not None:
            info = self._infos[pos]
            value = check_input(dataclasses.replace(info, shape=buf.shape,
                                                    shape_signature=buf.shape), value)
        elif not (isinstance(value, np.ndarray) and value.dtype == buf.dtype
                  and value.shape == buf.shape):
            raise ValueError(f"output {self._main.tensors[i].name!r} takes a {buf.dtype.name} "
                             f"array of shape {list(buf.shape)}")
        buf[...] = value

    def get_tensor(self, tensor_index, subgraph_index: int = 0) -> np.ndarray:
        """A copy of input or output ``tensor_index``."""
        if subgraph_index != 0:
            raise ValueError("coralrt reads tensors of subgraph 0 only; run other subgraphs "
                             "through get_signature_runner()")
        return self._buffer(self._index(tensor_index)).copy()

    def tensor(self, tensor_index):
        """A function returning the live array of input or output ``tensor_index``:
        writing into an input's array sets it; an output's holds the last results."""
        return lambda: self._buffer(self._index(tensor_index))

    def resize_tensor_input(self, input_index, tensor_size, strict: bool = False) -> None:
        """New shape of an input, taking effect at the next ``allocate_tensors()``.
        With ``strict`` only its ``-1`` dimensions may change (RuntimeError
        otherwise); without, any dimension may (zero included), as in LiteRT."""
        self._ensure_safe()
        i = self._index(input_index)
        if i not in self._in:
            raise ValueError(f"tensor {i} ({self._main.tensors[i].name!r}) is not an input "
                             f"of the model; only inputs can be resized")
        size = np.array(tensor_size, np.int32)
        if size.ndim != 1:
            raise ValueError(f"a shape is a list of dimensions, got an array of "
                             f"{size.ndim} dimensions: {size.tolist()}")
        shape = tuple(int(d) for d in size)
        name = self._main.tensors[i].name
        if any(d < 0 for d in shape):
            raise RuntimeError(f"cannot resize input {i} ({name!r}) to {list(shape)}: a "
                               f"dimension is negative")
        sig = self._infos[self._in[i]].shape_signature
        fixed = fixed_changes(shape, sig)
        if strict and (len(shape) != len(sig) or fixed):
            detail = (f"rank {len(shape)} instead of {len(sig)}" if len(shape) != len(sig)
                      else f"dimension {fixed[0]} is fixed at {sig[fixed[0]]}")
            raise RuntimeError(f"cannot resize input {i} ({name!r}) to {list(shape)}: "
                               f"{detail}; strict=True changes only the -1 dimensions of "
                               f"its shape_signature {list(sig)}")
        if shape != self._shapes[i]:
            self._shapes[i] = shape
            self._buffers = None       # LiteRT: not ready until allocate_tensors()

    # -- running ------------------------------------------------------------------

    def _ensure_safe(self) -> None:
        """RuntimeError while an array from ``tensor()`` (or a view of it) is alive."""
        held = held_elsewhere(self._buffers) if self._buffers is not None else []
        if held:
            names = ", ".join(f"{i} ({self._main.tensors[i].name!r})" for i in held)
            raise RuntimeError(
                f"numpy arrays from tensor() are still referenced (tensor {names}), "
                f"directly or through a slice or view: allocate_tensors(), invoke() and "
                f"resize_tensor_input() refuse to run while a reference to internal data "
                f"is held, as in tflite_runtime; keep the function tensor() returns and "
                f"call it when you need the array, or copy the data with get_tensor()")

    def _run(self, arrays: list[np.ndarray]) -> dict:
        """Run ``arrays`` (in input order) on a session that takes their shapes."""
        grow: dict[int, set[int]] = {}
        for info, a in zip(self._infos, arrays):
            sig = info.shape_signature
            if len(a.shape) != len(sig):
                raise RuntimeError(f"input {info.index} ({info.name!r}) was resized to rank "
                                   f"{len(a.shape)}; coralrt keeps the rank of an input "
                                   f"({len(sig)}: {list(sig)})")
            dims = set(fixed_changes(a.shape, sig)) - self._widened.get(info.index, set())
            if dims:
                grow[info.index] = dims
        if grow:
            self._widen(grow)
        return self._runner.run(arrays)

    def _widen(self, grow: dict[int, set[int]]) -> None:
        """Run from now on a session of the model with dimensions ``grow`` made -1."""
        session = self._session
        if session.target != "cpu":
            raise RuntimeError(f"on target {session.target!r} the model runs as an Edge TPU "
                               f"program, whose input shapes are fixed: only the cpu target "
                               f"changes an input's fixed dimensions")
        for t, dims in grow.items():
            self._widened.setdefault(t, set()).update(dims)
        runner = InferenceSession(widened(session.source_model, self._widened), "cpu",
                                  session.options)
        if self._runner is not session:
            self._runner.close()
        self._runner = runner
        log.info("inputs resized in fixed dimensions %s: running a copy of the model with "
                 "those dimensions dynamic", self._widened)

    def invoke(self) -> None:
        """Run the model on the inputs set; outputs land in the output arrays."""
        self._ensure_safe()
        self._invoke()

    def _invoke(self) -> None:
        # Without the check for arrays from tensor(): pycoral's invoke helpers run the
        # native interpreter directly, which has none, and the buffers stay the same
        # (no resize here), so an array held meanwhile sees the new outputs.
        if self._buffers is None:
            raise RuntimeError(_NOT_READY)
        results = self._run([self._buffers[i] for i in self._main.inputs])
        changed = [i for i, value in zip(self._main.outputs, results.values())
                   if self._buffers[i].shape != value.shape
                   or self._buffers[i].dtype != value.dtype]
        if changed:
            # A held array would go on showing the old output: refuse, as invoke() does.
            self._ensure_safe()
        for i, value in zip(self._main.outputs, results.values()):
            buf = self._buffers[i]
            if i in changed:
                self._buffers[i] = np.array(value)
                self._shapes[i] = value.shape
            else:
                buf[...] = value

    def _native_handle(self) -> int:
        """A number naming this interpreter, for pycoral's ``invoke_with_membuffer``
        and friends (tflite_runtime gives the native interpreter's address)."""
        _HANDLES[id(self)] = self
        return id(self)

    def _invoke_with_bytes(self, data) -> None:
        """Input 0 from the first bytes of ``data`` (a bytes-like object), then invoke:
        RuntimeError when not allocated, or when ``data`` holds fewer bytes than input 0."""
        if not self._is_ready():
            raise RuntimeError(_NOT_READY)
        i = self._main.inputs[0]
        buf = self._buffers[i]
        nbytes, dtype, shape = buf.nbytes, buf.dtype, buf.shape
        del buf                 # a held reference would block invoke() (_ensure_safe)
        view = memoryview(data).cast("B")
        if view.nbytes < nbytes:
            raise RuntimeError(f"input size={view.nbytes}, expected={nbytes}.")
        self.set_tensor(i, np.frombuffer(view[:nbytes], dtype).reshape(shape))
        self._invoke()

    def _is_ready(self) -> bool:
        """Whether ``allocate_tensors()`` has prepared the interpreter to run."""
        return self._buffers is not None

    def close(self) -> None:
        """Release the session and the sticks it opened (not in tflite_runtime)."""
        if self._runner is not self._session:
            self._runner.close()
        self._session.close()

    def __repr__(self) -> str:
        return f"<coralrt.tflite.Interpreter target={self._session.target!r}>"
