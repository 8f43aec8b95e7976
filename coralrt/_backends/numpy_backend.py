"""The NumPy CPU backend: whole ``.tflite`` models on coralrt's own NumPy kernels.

For machines where no LiteRT wheel exists (32-bit Raspberry Pi OS, Pi Zero,
riscv64): everything runs on the host CPU, in NumPy, in the calling thread.

* 8-bit operators run on the simulated Edge TPU's integer kernels
  (:mod:`coralrt._sim.kernels`, driven by :class:`coralrt._sim.runner.SegmentRunner`),
  which reproduce TFLite's reference kernels (``BUILTIN_REF``) bit for bit.
* The other kernels are named by the operator specs (:mod:`coralrt._ops`):
  ``numpy_any`` (any type, picked first: indexing and shape operators,
  BATCH_MATMUL, the SSD post-processing operator), ``numpy_float`` (picked
  when any input or output is float32 or float16), ``numpy_wide_int`` (ADD,
  SUB, MUL of plain int32 or int64 tensors) and ``numpy_8bit`` (8-bit GELU,
  int8 ABS and 8-bit LEAKY_RELU, which the Edge TPU does not have: tables of
  256 codes in :mod:`coralrt._sim.kernels.host_only`).  Their libraries are
  :mod:`coralrt._backends.numpy_kernels`, ``numpy_index``, ``numpy_matmul`` and
  ``numpy_detect``.  Float outputs match ``BUILTIN_REF`` within the tolerances
  stated there (most are bit-exact), integer outputs exactly.

``kernels="reference"`` and ``"optimized"`` run the same kernels.
``num_threads`` is accepted and ignored: the integer kernels take their thread
count from ``CORALRT_SIM_THREADS`` (default 1).  Only subgraph 0 runs; models
whose subgraph 0 calls others (control flow) are refused, as is any operator
without a kernel (:class:`~coralrt.errors.UnsupportedOperatorError` at load), and
a model input or output of a type NumPy has no dtype for (STRING, INT4:
:class:`~coralrt.errors.ModelError` at load).
The Edge TPU's on-chip memory limit does not apply: the model is described to
the runner without a memory plan.  Input shapes are static.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from time import perf_counter as _clock
from typing import Any

import numpy as np

from ..errors import (
    CoralRTError, InferenceError, InputError, ModelError, UnsupportedOperatorError,
)
from coralrt._formats.opnames import EDGETPU_OP as _EDGETPU_OP
from coralrt._formats.segment import (
    Segment, SegmentOp, SegmentTensor, quantization_arrays, segment_ops,
)
from coralrt._model import load_model
from coralrt._model.shapes import inferred_shapes
from coralrt._model.types import CUSTOM, TENSOR_TYPES, TYPE_NAMES, numpy_dtype, packed_size
from coralrt._ops import kernel_table, operators_with
from coralrt._sim.kernels import kernel_for
from coralrt._sim.runner import SegmentRunner
from coralrt._version import version as coralrt_version
from coralrt._backends.base import CpuBackend, CpuProgram
from coralrt._backends.numpy_index import is_plain_wide_int
from coralrt._backends.numpy_kernels import is_float

__all__ = ["NumpyBackend", "NumpyProgram"]

log = logging.getLogger("coralrt.backends")

def _by_type(float_kernel, eight_bit):
    """``float_kernel`` on float tensors, ``eight_bit`` otherwise."""
    return lambda ctx: (float_kernel if is_float(ctx.inputs[0]) else eight_bit)(ctx)


@lru_cache(maxsize=1)
def _tables() -> tuple[dict, dict, dict]:
    """The dispatch tables, from the operator specs' NumPy kernels (coralrt._ops),
    built on the first load: float32/float16 tensors (picked over the simulated
    Edge TPU's 8-bit kernels); int32/int64 tensors without quantization; any
    type, picked first: the ``numpy_any`` kernels, and the 8-bit kernels of
    operators the simulated Edge TPU does not have, by type."""
    float_kernels = kernel_table("numpy_float")
    other = {**kernel_table("numpy_any"),
             **{name: _by_type(float_kernels[name], eight_bit)
                for name, eight_bit in kernel_table("numpy_8bit").items()}}
    return float_kernels, kernel_table("numpy_wide_int"), other


# -- the model as the runner sees it -------------------------------------------------------


def describe(model) -> Segment:
    """Subgraph 0 of ``model`` as a :class:`Segment` for the runner, with no memory plan.

    Unlike :func:`coralrt._formats.segment.build_segment` nothing is laid out on
    chip, so activations of any size are accepted; constants are views of the
    model's buffers.  Output shapes a file leaves to the kernel (the SSD
    post-process) are filled in.
    """
    sg = model.main
    ins, outs = list(sg.inputs), list(sg.outputs)
    shapes = inferred_shapes(sg)
    reshape_shapes = _only_reshape_shapes(sg)
    tensors = []
    for i, t in enumerate(sg.tensors):
        shape = tuple(int(d) for d in shapes.get(i, t.shape))
        kind = ("input" if i in ins else "output" if i in outs
                else "parameter" if t.is_constant else "activation")
        scales, zps, qdim = quantization_arrays(t, f"tensor {t.name!r}")
        # A state tensor (LSTM) the model also returns is still state.
        st = SegmentTensor(i, t.name, shape, t.type, kind, scales, zps, qdim, 0,
                           packed_size(t.type, shape) or 0,
                           kind in ("activation", "output") and t.is_variable)
        if t.is_constant and t.extra.get("sparsity"):
            if i not in reshape_shapes:
                raise ModelError(f"tensor {i} ({t.name!r}) is a sparse constant; the numpy "
                                 f"backend takes dense constants only (a sparse shape "
                                 f"operand of RESHAPE excepted)")
            # RESHAPE's kernel takes its shape from the output tensor; load checked
            # that a sparse shape operand reads the same stored or dense.
            st.data = np.frombuffer(t.buffer.data, numpy_dtype(t.type).newbyteorder("<"),
                                    count=int(np.prod(shape, dtype=np.int64))).reshape(shape)
        elif t.is_constant:
            data = t.data
            if data is None:                      # sub-byte types stay packed
                data = np.asarray(t.buffer.data, np.uint8)
            elif data.size != int(np.prod(shape, dtype=np.int64)):
                raise ModelError(f"tensor {i} ({t.name!r}): constant holds {data.size} "
                                 f"values, its shape {shape} needs more or fewer")
            st.data = data
        tensors.append(st)
    _retype_outputs(sg, tensors)
    ops = segment_ops(sg)
    return Segment(tensors, ops, tuple(ins), tuple(outs), np.zeros(0, np.uint8), None,
                   sg.name, "coralrt-numpy", coralrt_version())


def _only_reshape_shapes(sg) -> set[int]:
    """Tensors read only as RESHAPE's shape operand (input 1), and not returned."""
    uses: dict[int, set[bool]] = {}
    for op in sg.operators:
        for pos, k in enumerate(op.inputs):
            if k >= 0:
                uses.setdefault(k, set()).add(op.name == "RESHAPE" and pos == 1)
    return {k for k, kinds in uses.items() if kinds == {True} and k not in sg.outputs}


def _retype_outputs(sg, tensors) -> None:
    """LiteRT's ADD and SUB (the specs that set ``output_takes_input_type``) give
    their output the type of their inputs when the interpreter prepares them,
    whatever the file says; do the same for the tensors between operators
    (converters have written such intermediates as FLOAT32)."""
    retyped = operators_with("output_takes_input_type")
    for op in sg.operators:
        if op.name not in retyped or len(op.inputs) != 2 or min(op.inputs) < 0:
            continue
        a, b = (tensors[k] for k in op.inputs)
        for k in op.outputs:
            if a.dtype == b.dtype != tensors[k].dtype and tensors[k].kind == "activation":
                tensors[k].dtype = a.dtype
                tensors[k].nbytes = packed_size(a.dtype, tensors[k].shape) or 0


# -- which kernel runs an operator ---------------------------------------------------------

_TYPE_LIST = ("FLOAT32", "FLOAT16", "INT8", "UINT8", "INT16", "INT32", "INT64", "BOOL")
_TYPES = frozenset(TENSOR_TYPES[n] for n in _TYPE_LIST)


def pick_kernel(op: SegmentOp, tensors: list, where: str | None = None):
    """The kernel factory for ``op`` (``tensors``: its inputs and outputs), or raise
    UnsupportedOperatorError (naming ``where``)."""
    name = op.name

    def refuse(detail: str):
        raise UnsupportedOperatorError(name, where=where, detail=detail)

    if name in operators_with("calls_subgraphs"):
        refuse("the numpy backend runs subgraph 0 only, without control flow")
    # Types LiteRT's kernels take for some operators and refuse for others
    # (CONCATENATION refuses UINT16): declined rather than run where LiteRT
    # would refuse the model.
    odd = sorted({TYPE_NAMES.get(t.dtype, str(t.dtype)) for t in tensors
                  if t is not None and t.dtype not in _TYPES})
    if odd:
        refuse(f"the numpy backend runs {', '.join(_TYPE_LIST)} tensors, not "
               f"{', '.join(odd)}")
    if op.opcode == CUSTOM and name == _EDGETPU_OP:
        refuse("the model is compiled for the Edge TPU; the numpy backend runs the "
               "uncompiled model")
    float_kernels, wide_int_kernels, other_kernels = _tables()
    if name in other_kernels:
        return other_kernels[name]
    if any(is_float(t) for t in tensors):
        factory = float_kernels.get(name)
        if factory is None:
            refuse(f"the numpy backend has no float kernel for it (float kernels: "
                   f"{', '.join(sorted(float_kernels))})")
        return factory
    if name in wide_int_kernels and all(is_plain_wide_int(t) for t in tensors):
        return wide_int_kernels[name]
    factory = None if op.opcode == CUSTOM else kernel_for(name)
    if factory is None:
        refuse("the numpy backend has no kernel for it")
    return factory


def _dispatch(ctx):
    return pick_kernel(ctx.op, [*ctx.inputs, *ctx.outputs])(ctx)


# -- the program -------------------------------------------------------------------------


def _check_io_types(seg: Segment) -> None:
    """Refuse model inputs and outputs of a type NumPy has no dtype for (STRING,
    the packed sub-byte types): the backend takes and returns NumPy arrays."""
    for kind, indices in (("input", seg.inputs), ("output", seg.outputs)):
        for i in indices:
            t = seg.tensors[i]
            if numpy_dtype(t.dtype) is None:
                name = TYPE_NAMES.get(t.dtype, t.dtype)
                raise ModelError(f"{kind} tensor {t.name!r} is {name}, a type the numpy "
                                 f"backend has no array for; run the model on the litert "
                                 f"backend", where=f"tensor {i}")


def _details(t, index: int, signature) -> dict[str, Any]:
    scales = np.asarray(t.scales, np.float32)
    zps = np.asarray(t.zero_points, np.int32)
    shape = np.array(t.shape, np.int32)
    sig = np.array(signature if signature is not None else t.shape, np.int32)
    simple = (float(scales[0]), int(zps[0])) if scales.size == 1 else (0.0, 0)
    return {"name": t.name, "index": index, "shape": shape, "shape_signature": sig,
            "dtype": numpy_dtype(t.dtype).type, "quantization": simple,
            "quantization_parameters": {"scales": scales, "zero_points": zps,
                                        "quantized_dimension": int(t.quantized_dimension),
                                        "block_size": 0},
            "sparsity_parameters": {}}


class NumpyProgram(CpuProgram):
    """A model loaded into the NumPy backend: one :class:`SegmentRunner`."""

    def __init__(self, runner: SegmentRunner, model, label: str = "cpu: whole model (numpy)"):
        super().__init__(label)
        self._runner = runner
        seg, sg = runner.segment, model.main
        self.operators = len(seg.ops)
        self.input_details = [_details(seg.tensors[i], i, sg.tensors[i].shape_signature)
                              for i in seg.inputs]
        self.output_details = [_details(seg.tensors[i], i, sg.tensors[i].shape_signature)
                               for i in seg.outputs]
        self._expect = [(tuple(int(d) for d in det["shape"]), np.dtype(det["dtype"]))
                        for det in self.input_details]

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if len(inputs) != len(self._expect):
            raise InputError(f"the model has {len(self._expect)} input(s), got "
                             f"{len(inputs)} array(s)")
        arrays = []
        for det, (shape, dtype), value in zip(self.input_details, self._expect, inputs):
            a = np.asarray(value)
            if a.dtype != dtype or a.shape != shape:
                raise InputError(f"input {det['name']!r} must be {dtype} of shape {shape}, "
                                 f"got {a.dtype} of shape {a.shape}")
            arrays.append(a)
        start = _clock()
        with self.lock:
            try:
                results = self._runner.run(arrays)
            except CoralRTError:
                raise
            except Exception as e:   # noqa: BLE001 - a kernel's failure fails this run, typed
                raise InferenceError(f"the numpy backend failed while running the model: "
                                     f"{type(e).__name__}: {e}") from e
            outputs = [np.array(r, copy=True) for r in results]
            self.last_seconds = _clock() - start
        return outputs

    def resize_inputs(self, shapes: list[tuple[int, ...]]) -> None:
        shapes = [tuple(int(d) for d in s) for s in shapes]
        if shapes == [shape for shape, _ in self._expect]:
            return
        raise InputError(f"the numpy backend runs models with static input shapes "
                         f"{[s for s, _ in self._expect]}; it cannot resize to {shapes}")

    def reset(self) -> None:
        """Reset the state variables (LSTM) to their initial values."""
        with self.lock:
            self._runner.reset()

    def __repr__(self) -> str:
        return (f"<NumpyProgram inputs={len(self.input_details)} "
                f"outputs={len(self.output_details)}>")


class NumpyBackend(CpuBackend):
    """coralrt's NumPy kernels as a CPU backend (no native interpreter needed)."""

    name = "numpy"

    def __init__(self) -> None:
        self.version = f"{coralrt_version()} (numpy {np.__version__})"

    def load(
        self,
        model_bytes: bytes,
        *,
        num_threads: int | None = None,
        kernels: str = "optimized",
    ) -> CpuProgram:
        model_bytes = self.checked_load_arguments(model_bytes, num_threads, kernels)
        model = load_model(model_bytes)
        segment = describe(model)
        _check_io_types(segment)
        for i, op in enumerate(segment.ops):
            pick_kernel(op, [segment.tensors[k] for k in (*op.inputs, *op.outputs) if k >= 0],
                        where=f"operator {i}")
        try:
            runner = SegmentRunner(segment, extra={op.name: _dispatch for op in segment.ops})
        except CoralRTError:
            raise
        except (ValueError, ArithmeticError, IndexError, TypeError, KeyError,
                AttributeError) as e:
            # A kernel's set-up met operands that do not fit together (a model
            # LiteRT would refuse in Prepare): a typed error, not a crash.
            raise ModelError(f"the numpy backend cannot prepare the model: "
                             f"{type(e).__name__}: {e}") from e
        program = NumpyProgram(runner, model)
        log.debug("numpy backend loaded %d-byte model: %d operators, %d inputs, %d outputs "
                  "(kernels=%s and num_threads=%s make no difference)", len(model_bytes),
                  len(segment.ops), len(program.input_details), len(program.output_details),
                  kernels, num_threads)
        return program
