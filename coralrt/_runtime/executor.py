"""Turn a compiled model into steps and run them.

A compiled model (from the just-in-time compiler) holds ``coralrt-segment``
operators for the Edge TPU and ordinary operators for the CPU.  Each segment
becomes a TPU step on a device; each maximal run of consecutive CPU operators
is cut out as a standalone model and becomes a CPU step in the CPU backend.
:class:`ExecutorProgram` implements the :class:`~coralrt._runtime.program.Program`
protocol, so a session drives it as it drives a CPU backend program.
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from coralrt._formats.opnames import BY_OP
from coralrt._runtime.device import EdgeTpuDevice
from coralrt.errors import ConfigError, InferenceError, ModelError, PluginError
from coralrt._model.compiled import operator_origin
from coralrt._model.custom_options import decode_flexbuffer_map
from coralrt._model.extract import extract
from coralrt._model.fixups import with_explicit_biases
from coralrt._model.types import Model
from coralrt._runtime.info import OpInfo, StepInfo
from coralrt._runtime.program import Program
from coralrt._tensors import tensor_infos

__all__ = ["Step", "StepInfo", "ExecutorProgram", "build_program", "run_steps"]



@dataclass
class Step:
    kind: str                 # "tpu" | "cpu" | "plugin"
    label: str
    ops: list[int]            # operator indices in the compiled model
    inputs: list[int]         # tensor indices in the compiled model's main subgraph
    outputs: list[int]
    run: Callable[[list], list]
    device: EdgeTpuDevice | None = None
    host_seconds: float = 0.0
    device_seconds: float = 0.0
    info: StepInfo | None = field(default=None, repr=False)  # set by build_program

    def describe(self, index: int) -> StepInfo:
        return StepInfo(index, self.kind, self.label, tuple(self.ops),
                        self.device.path if self.device is not None else None, self.run)


def run_steps(steps: list[Step], values: dict, hook: Callable | None = None) -> None:
    """Run ``steps`` in order on ``values`` (tensor index -> array), adding their
    outputs and recording host and device time on each step.  ``hook(info,
    inputs)``, when given, runs each step from its :class:`StepInfo`."""
    clock = time.perf_counter
    for step in steps:
        start = clock()
        args = [values[t] if t >= 0 else None for t in step.inputs]
        results = step.run(args) if hook is None else hook(step.info, args)
        step.host_seconds = clock() - start
        if step.device is not None:
            step.device_seconds = step.device.last_stats.device_seconds
        values.update(zip(step.outputs, results))


def step_rows(steps: Sequence[Step]) -> list[dict]:
    """The profile rows of ``steps`` (their last run), in order."""
    return [{"step": i, "kind": s.kind, "label": s.label, "operators": len(s.ops),
             "host_seconds": s.host_seconds,
             "device_seconds": s.device_seconds if s.kind == "tpu" else None}
            for i, s in enumerate(steps)]


class ExecutorProgram(Program):
    """The steps of a compiled model, run in order on the caller's thread.

    ``runner`` is the plugin host's step hook when plugins wrap steps (None:
    steps run directly, which saves the hook call on the per-inference path).
    """

    def __init__(self, steps: list[Step], inputs: list[int], outputs: list[int],
                 runner: Callable | None = None):
        super().__init__()
        self.steps = steps
        self.inputs = inputs
        self.outputs = outputs
        self.runner = runner
        for i, step in enumerate(steps):
            step.info = step.describe(i)

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        values = dict(zip(self.inputs, inputs))
        run_steps(self.steps, values, self.runner)
        return [values[t] for t in self.outputs]

    def profile(self) -> list[dict]:
        """Per step of the last run: kind, label, host and estimated device seconds."""
        return step_rows(self.steps)


def build_program(compiled: Model, *, device: EdgeTpuDevice | None, backend,
                  num_threads: int | None = None, cpu_kernels: str = "optimized",
                  host=None, override_builtins: bool = False,
                  devices: Sequence[EdgeTpuDevice] | None = None) -> ExecutorProgram:
    """Steps for ``compiled``: its operators that carry a device program (one of
    the program formats of :data:`coralrt._formats.opnames.FORMATS`, found by the
    operator's name and loaded with :meth:`EdgeTpuDevice.load_as`) on
    ``device``, operators with a plugin kernel as plugin steps (builtins only
    with ``override_builtins``), everything else in the CPU backend.

    ``devices`` (instead of ``device``): Edge TPU segment ``i`` runs on
    ``devices[i % len(devices)]``, as :mod:`coralrt._runtime.pipeline` uses it.
    """
    if devices is not None:
        if device is not None:
            raise ConfigError("pass either device or devices to build_program, not both")
        pool = list(devices)
        if not pool:
            raise ConfigError("devices is empty: give at least one Edge TPU device")
    else:
        pool = [device] if device is not None else []
    sg = compiled.main
    steps: list[Step] = []
    pending: list[int] = []
    plugin_kernels = host.ops.kernels if host is not None else {}
    # Operator k of the compiled model is operator origin[k] of the user's model.
    origin = operator_origin(compiled)

    def flush() -> None:
        if not pending:
            return
        piece = extract(compiled, pending)
        outputs = list(piece.outputs)
        # State (variable) tensors the model returns: no operator produces them, the
        # piece's interpreter updates them in place, so the piece must return them too.
        for t in sg.outputs:
            if sg.tensors[t].is_variable and t in piece.tensor_map and t not in outputs:
                piece.model.main.outputs.append(piece.tensor_map[t])
                outputs.append(t)
        runnable = with_explicit_biases(piece.model) or piece.model
        try:
            program = backend.load(runnable.to_bytes(), num_threads=num_threads,
                                   kernels=cpu_kernels)
        except ModelError as e:
            raise _renumbered(e, pending, origin) from None
        names = sorted({sg.operators[i].name for i in pending})
        steps.append(Step("cpu", f"cpu: {len(pending)} op(s) ({', '.join(names[:4])}"
                                 f"{', ...' if len(names) > 4 else ''})",
                          list(pending), piece.inputs, outputs, program.run))
        pending.clear()

    for i, op in enumerate(sg.operators):
        kernel = plugin_kernels.get(op.name)
        if kernel is not None and (op.opcode.is_custom or override_builtins):
            flush()
            steps.append(_plugin_step(sg, i, kernel))
            continue
        fmt = BY_OP.get(op.name)
        if fmt is None:
            pending.append(i)
            continue
        if not pool:
            raise ConfigError("this program has Edge TPU segments but no device to run them")
        flush()
        n_tpu = sum(1 for s in steps if s.kind == "tpu")
        device = pool[n_tpu % len(pool)]
        # The format's output fix-ups: the host dtypes of the outputs, for the
        # device's output decoding; the model's output shapes, for formats whose
        # outputs come back without the batch dimension the model declares.
        dtypes = [sg.tensors[t].dtype for t in op.outputs] if fmt.outputs_need_dtypes else None
        shapes = [sg.tensors[t].shape for t in op.outputs] if fmt.outputs_need_shapes else None
        # A view of the operator's options: no copy of the parameters.
        handle = device.load_as(op.custom_options, fmt.id, output_dtypes=dtypes)
        steps.append(Step("tpu", f"tpu: segment {n_tpu} on {device.label}", [i],
                          list(op.inputs), list(op.outputs),
                          _tpu_runner(device, handle, shapes), device))
    flush()
    # A model may output a constant (LiteRT returns its data); no operator
    # computes it, so a last step hands out a copy.
    consts = [(t, sg.tensors[t].data) for t in dict.fromkeys(sg.outputs)
              if sg.tensors[t].is_constant and sg.tensors[t].data is not None]
    if consts:
        steps.append(Step("cpu", "cpu: constant output(s)", [], [], [t for t, _ in consts],
                          lambda _args: [np.array(a) for _, a in consts]))
    runner = host.run_step if host is not None and host.wraps_steps else None
    return ExecutorProgram(steps, list(sg.inputs), list(sg.outputs), runner)


_OPERATOR = re.compile(r"^((?:subgraph 0, )?operator )(\d+)\b")


def _renumbered(e: ModelError, pending: list[int], origin: list | None) -> ModelError:
    """``e``, raised by the CPU backend for a piece of the compiled model made of
    the operators ``pending``, with its operator named by its index in the
    user's model (``origin``; without one, in the compiled model) instead of
    its index in the piece."""
    m = _OPERATOR.match(e.where or "")
    if m is None or int(m.group(2)) >= len(pending):
        return e
    k = pending[int(m.group(2))]
    index = origin[k] if origin is not None and origin[k] is not None else k
    where = f"{m.group(1)}{index}{e.where[m.end():]}"
    out = copy.copy(e)
    out.where = where
    out.args = (f"{where}: {e.message}",)
    return out


def _plugin_step(sg, i: int, kernel) -> Step:
    op = sg.operators[i]
    custom = bytes(op.custom_options) if op.custom_options is not None else b""
    present = [t for t in op.inputs if t >= 0]
    given = dict(zip(present, tensor_infos(sg, present)))
    info = OpInfo(
        name=op.name, options=dict(op.options), custom_options=custom,
        flex_options=decode_flexbuffer_map(custom) if custom else None,
        inputs=[given.get(t) for t in op.inputs],   # None for an omitted input (-1)
        outputs=tensor_infos(sg, op.outputs), index=i)
    fn = kernel.fn
    what = f"operator {i} ({'custom ' if op.opcode.is_custom else ''}{op.name})"

    def run(inputs):
        try:
            outputs = fn(inputs, info)
        except Exception as e:  # whatever a plugin raises: name the operator and plugin
            raise InferenceError(f"{what}: the CPU kernel of plugin {kernel.plugin} raised "
                                 f"{type(e).__name__}: {e}") from e
        if not isinstance(outputs, (list, tuple)) or len(outputs) != len(info.outputs):
            raise PluginError(f"the {op.name} kernel of plugin {kernel.plugin} returned "
                              f"{type(outputs).__name__}, not a list of "
                              f"{len(info.outputs)} array(s)")
        checked = []
        for out, want in zip(outputs, info.outputs):
            arr = np.asarray(out)
            if arr.shape != want.shape or arr.dtype != want.dtype:
                raise PluginError(f"the {op.name} kernel of plugin {kernel.plugin} returned "
                                  f"{arr.dtype}{list(arr.shape)} for output {want.name!r}, "
                                  f"which is {want.dtype}{list(want.shape)}")
            checked.append(arr)
        return checked

    return Step("plugin", f"plugin: {op.name} ({kernel.plugin})", [i], list(op.inputs),
                list(op.outputs), run)


def _tpu_runner(device: EdgeTpuDevice, handle, shapes=None):
    if shapes is None:
        def run(inputs):
            return device.run(handle, inputs)
    else:
        def run(inputs):
            return [np.reshape(out, shape) for out, shape in
                    zip(device.run(handle, inputs), shapes)]
    return run
