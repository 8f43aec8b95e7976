"""``InferenceSession``: load a model once, run it many times.

Everything that can be decided at load time is decided there (validation,
backend program, input and output tables), so :meth:`InferenceSession.run`
only checks the feed against precomputed expectations and calls the program.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

import numpy as np

from coralrt.backends import get_backend
from coralrt import targets
from coralrt.errors import ConfigError, InputError
from coralrt.plugins.host import plugin_host
from coralrt.runtime.program import completed
from coralrt.tensors import TensorInfo, tensor_infos

__all__ = ["InferenceSession", "TARGETS"]

log = logging.getLogger("coralrt.session")

TARGETS = ("cpu", "sim", "coral", "auto")


class InferenceSession:
    """Run a TFLite model on a target.

    :param model: a path, the model's bytes, or a :class:`coralrt.model.Model`.
    :param target: ``"cpu"`` (whole model on the CPU backend), ``"sim"``
        (simulated Edge TPU), ``"coral"`` (a Coral USB Accelerator; this version
        runs edgetpu_compiler-compiled models there) or ``"auto"``.
    :param num_threads: CPU backend threads; ``None`` lets the backend choose.
    :param backend: CPU backend name (``"litert"``, ``"tflite_runtime"``);
        ``None`` picks the first installed.
    :param cpu_kernels: ``"optimized"`` (default) or ``"reference"`` (TFLite's
        reference kernels, ``BUILTIN_REF``).
    :param partition_mode: ``"multi"`` (default) or ``"compat"``, for the
        just-in-time compiler (``sim`` and ``coral`` targets).
    :param cache: a :class:`coralrt.compile.cache.CompileCache`; ``None`` uses
        the default one (``CORALRT_CACHE_DIR``, ``CORALRT_CACHE=0``).
    :param device: the stick(s) for the Edge TPU steps: an open
        :class:`coralrt.runtime.device.EdgeTpuDevice`, a path ("usb:0", ":1",
        a port path) or a list of those to pipeline the segments over several
        sticks; ``None``: a simulated stick for ``sim``, the first stick found
        for ``coral``.
    :param plugins: plugin objects to register for this session, in addition
        to coralrt's built-ins and the installed ``coralrt`` entry points.
    :param override_builtins: let plugin CPU kernels registered for builtin
        operators replace the CPU backend's kernels for those operators.
    :param pipeline_depth: requests queued between pipeline stages when
        ``device`` is a list of sticks.

    ``compile_info`` is None on the CPU target; otherwise a dict with at least
    ``cache_hit``, ``compile_seconds`` and ``key``.

    Raises :class:`~coralrt.errors.ModelError` for invalid models,
    :class:`~coralrt.errors.UnsupportedOperatorError` for operators nothing
    provides.  ``run`` is safe to call from several threads; calls are
    serialized per session, except with ``device=[...]`` (several sticks),
    where the Edge TPU segments are pipelined over the sticks and concurrent
    callers overlap (see docs/multi-stick.md).  A run interrupted in the
    middle of a transfer (Ctrl-C included) never makes a later run wrong: the
    stick is reset before the next one (see :meth:`reset` and docs/usb.md).
    """

    def __init__(self, model, target: str = "cpu", *, num_threads: int | None = None,
                 backend: str | None = None, cpu_kernels: str = "optimized",
                 partition_mode: str = "multi", cache=None, device=None, plugins=None,
                 override_builtins: bool = False, pipeline_depth: int = 2):
        if target not in TARGETS:
            raise ConfigError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
        self._backend = get_backend(backend)
        self._host = plugin_host(tuple(plugins or ()))
        self._override = override_builtins
        options = targets.Options(
            backend=self._backend, host=self._host, num_threads=num_threads,
            cpu_kernels=cpu_kernels, partition_mode=partition_mode, cache=cache,
            device=device, override_builtins=override_builtins, pipeline_depth=pipeline_depth)
        parsed = None
        if target == "auto":
            target, parsed = targets.choose_auto(model, options)
        self.target = target
        prepared = targets.prepare(target, model, options, parsed)
        self.model, self._program = prepared.model, prepared.program
        self.compile_info = prepared.compile_info
        # A device list pipelines the Edge TPU segments over the sticks.
        self.devices = prepared.devices
        self.device = self.devices[0] if self.devices else None
        given = device if isinstance(device, (list, tuple)) else [device]
        self._owned = [d for d in self.devices if not any(d is g for g in given)]
        sg = self.model.main
        self._inputs = [TensorInfo.from_tensor(sg.tensors[i], i) for i in sg.inputs]
        self._outputs = tensor_infos(sg, sg.outputs)   # custom op shapes filled in
        self._input_names = [t.name for t in self._inputs]
        self._output_names = _unique([t.name for t in self._outputs])
        self._input_pos = {n: i for i, n in enumerate(self._input_names)}
        self._output_pos = {n: i for i, n in enumerate(self._output_names)}
        self._dynamic = any(-1 in t.shape_signature for t in self._inputs)
        self._shapes = [t.shape for t in self._inputs]
        log.debug("session ready on %s: %d inputs, %d outputs, backend %s", target,
                  len(self._inputs), len(self._outputs), self._backend.name)

    def profile(self) -> list[dict]:
        """Per step of the last ``run``: kind ("tpu"/"cpu"/"plugin"), label, host
        seconds and, for Edge TPU steps, the device seconds (the latency model's
        estimate on the simulated stick).

        On ``sim`` and ``coral``, when no operator reached the Edge TPU, every
        row also has a ``note`` saying so and why (the commonest reason).
        """
        rows = self._program.profile()
        if self.target != "cpu" and self.compile_info is not None \
                and not any(r["kind"] == "tpu" for r in rows):
            note = ("no Edge TPU segment: the whole model runs on the CPU ("
                    + targets.no_segment_reason(self.compile_info) + ")")
            rows = [{**r, "note": note} for r in rows]
        return rows

    # -- description ----------------------------------------------------------

    @property
    def backend(self) -> str:
        """Name of the CPU backend in use."""
        return self._backend.name

    def get_inputs(self) -> list[TensorInfo]:
        return list(self._inputs)

    def get_outputs(self) -> list[TensorInfo]:
        return list(self._outputs)

    # -- running ----------------------------------------------------------------

    def run(self, inputs, *, outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run once and return ``{output name: array}``.

        ``inputs`` is a dict by input name, a list in input order, or one
        array for a one-input model.  ``outputs`` restricts the result to
        these output names, in that order.

        Each array must have the input's dtype and shape (a dynamic dimension,
        -1 in the signature, takes any size); nothing is cast silently.  One
        exception: an array of the input's type in the other byte order (for
        example ``">f4"``, read from a big-endian file, for a float32 input)
        is converted with a byte-swapping copy and gives the same outputs as
        the native-order array; native-order arrays are passed on uncopied.
        Python numbers and lists of them take the input's dtype when every
        value fits.  A wrong dtype or shape, a value that does not fit, and
        ``None`` (alone or inside a list) raise
        :class:`~coralrt.errors.InputError` naming the input.
        """
        arrays = [self._check(info, value) for info, value in zip(self._inputs, self._order(inputs))]
        program = self._program
        with program.lock:
            if self._dynamic:
                shapes = [a.shape for a in arrays]
                if shapes != self._shapes:
                    program.resize_inputs(shapes)
                    self._shapes = shapes
            results = program.run(arrays)
        if outputs is None:
            return dict(zip(self._output_names, results))
        if isinstance(outputs, str):
            outputs = [outputs]
        picked = {}
        for name in outputs:
            pos = self._output_pos.get(name)
            if pos is None:
                raise InputError(f"unknown output {name!r}; the model's outputs are "
                                 f"{self._output_names}")
            picked[name] = results[pos]
        return picked

    def submit(self, inputs):
        """Like :meth:`run`, without waiting: a ``concurrent.futures.Future`` of
        ``{output name: array}``.  Pipelined sessions (``device=[...]``) overlap
        submitted requests; other sessions run the request before returning."""
        arrays = [self._check(info, value) for info, value in zip(self._inputs, self._order(inputs))]
        names = self._output_names
        if self._dynamic:    # resizing and running must stay one atomic pair
            return completed(lambda: self.run(arrays))
        inner = self._program.submit(arrays)
        outer: Future = Future()
        outer.set_running_or_notify_cancel()

        def done(f):
            error = f.exception()
            if error is not None:
                outer.set_exception(error)
            else:
                outer.set_result(dict(zip(names, f.result())))
        inner.add_done_callback(done)
        return outer

    def reset(self) -> None:
        """Bring every stick of this session back in step with the host: reset it
        and bring it up again on the same port (what closing and opening it do).

        ``run`` does this by itself for a stick that an exception (Ctrl-C, a
        timeout raised in the calling thread ...) left in the middle of a
        transfer; ``reset`` does it on request, and also recovers a stick that
        a transfer error left failed.  The session stays usable: programs stay
        loaded and their parameters are uploaded again on the next run.  On
        the ``cpu`` target there is nothing to reset.  Raises
        :class:`~coralrt.errors.DeviceError` when a stick cannot be brought
        back (unplugged, closed); a stick left out of step tries again on the
        next ``run``.
        """
        with self._program.lock:        # not in the middle of this session's run
            for device in self.devices:
                device.reset()

    def close(self) -> None:
        """Stop a pipeline and close the sticks this session opened (idempotent)."""
        self._program.close()
        for device in self._owned:
            device.close()
        self._owned = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


    def _order(self, inputs) -> list:
        n = len(self._inputs)
        if isinstance(inputs, Mapping):
            unknown = [k for k in inputs if k not in self._input_pos]
            missing = [k for k in self._input_names if k not in inputs]
            if unknown or missing:
                parts = []
                if missing:
                    parts.append(f"missing {missing}")
                if unknown:
                    parts.append(f"unknown {unknown}")
                raise InputError(f"inputs do not match the model: {', '.join(parts)}; the "
                                 f"model's inputs are {self._input_names}")
            return [inputs[k] for k in self._input_names]
        if isinstance(inputs, np.ndarray):
            if n != 1:
                raise InputError(f"the model has {n} inputs {self._input_names}; pass a dict "
                                 f"by name or a list in that order, not one array")
            return [inputs]
        if isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)):
            if len(inputs) != n:
                raise InputError(f"the model has {n} input(s) {self._input_names}, got "
                                 f"{len(inputs)} value(s)")
            return list(inputs)
        raise InputError(f"inputs must be a dict by name, a list in input order or a numpy "
                         f"array, got {type(inputs).__name__}")

    def _check(self, info: TensorInfo, value) -> np.ndarray:
        if not isinstance(value, np.ndarray):
            value = _coerce(info, value)
        if value.dtype != info.dtype:
            if not value.dtype.isnative and value.dtype.newbyteorder("=") == info.dtype:
                # Same type, other byte order (a big-endian file): byte-swap
                # into a copy.  Off the common path, which stays one comparison.
                value = value.astype(info.dtype)
            else:
                hint = ""
                if info.is_quantized and value.dtype.kind == "f":
                    hint = (f"; this input is quantized (scale {info.quantization[0]:g}, zero "
                            f"point {info.quantization[1]}): convert with "
                            f"session.get_inputs()[i].quantize(x)")
                raise InputError(f"input {info.name!r} expects dtype {info.dtype.name}, got "
                                 f"{value.dtype.name}{hint}")
        if value.shape != info.shape:
            sig = info.shape_signature
            if not (len(value.shape) == len(sig)
                    and all(g == -1 or d == g for d, g in zip(value.shape, sig))):
                raise InputError(f"input {info.name!r} expects shape {list(info.shape)}"
                                 f"{'' if sig == info.shape else f' (signature {list(sig)})'}"
                                 f", got {list(value.shape)}")
        return value

    def __repr__(self) -> str:
        return (f"<InferenceSession target={self.target!r} backend={self.backend!r} "
                f"inputs={self._input_names} outputs={self._output_names}>")


def _coerce(info: TensorInfo, value) -> np.ndarray:
    # Python scalars and lists carry no dtype of their own: take the input's,
    # but only when no value changes on the way.
    if value is None:
        raise InputError(f"input {info.name!r} is None; pass a {info.dtype.name} array of "
                         f"shape {list(info.shape)}")
    try:
        arr = np.asarray(value)
        # astype would turn a None inside a list into NaN for a float input.
        holds_none = arr.dtype.kind == "O" and any(v is None for v in arr.flat)
        cast = None if holds_none else arr.astype(info.dtype)
    except (TypeError, ValueError) as e:
        raise InputError(f"input {info.name!r}: cannot make a {info.dtype.name} array from "
                         f"{type(value).__name__} ({e})") from None
    if holds_none:
        raise InputError(f"input {info.name!r}: cannot make a {info.dtype.name} array from "
                         f"{type(value).__name__} holding None")
    if arr.dtype.kind in "iufb" and not np.array_equal(cast, arr):
        raise InputError(f"input {info.name!r}: values do not fit dtype {info.dtype.name}")
    return cast


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for n in names:
        k = seen.get(n, 0)
        seen[n] = k + 1
        out.append(n if k == 0 else f"{n}:{k}")
    return out
