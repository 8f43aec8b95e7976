"""``InferenceSession``: load a model once, run it many times.

Everything that can be decided at load time is decided there (validation,
backend program, input and output tables), so :meth:`InferenceSession.run`
only checks the feed against precomputed expectations and calls the program.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

import numpy as np

from coralrt._backends import get_backend
from coralrt import _config as config, _targets as targets
from coralrt.errors import ConfigError, InputError
from coralrt._model import Model, load_model
from coralrt._model.entry import with_entry
from coralrt._model.types import SignatureDef
from coralrt.plugins._host import plugin_host
from coralrt._runtime.closing import Gate
from coralrt._runtime.feeds import order_feed, pick, unique_names
from coralrt._runtime.worker import Requests
from coralrt._targets import SessionOptions
from coralrt._targets.options import check_names, with_overrides
from coralrt._tensors import TensorInfo, check_input, tensor_infos

__all__ = ["InferenceSession", "SessionOptions", "TARGETS"]

log = logging.getLogger("coralrt.session")

#: The target names (a live view of :mod:`coralrt._targets`' registry, ``auto`` last).
TARGETS = config.TARGETS

_NO_FEED = object()   # run(x): coralrt's form; run(names, feed): onnxruntime's


class InferenceSession:
    """Run a TFLite model on a target.

    :param model: a path, the model's bytes, or a :class:`coralrt._model.Model`.
    :param target: ``"cpu"`` (whole model on the CPU backend), ``"sim"``
        (simulated Edge TPU), ``"coral"`` (a Coral USB Accelerator; this version
        runs models compiled by edgetpu_compiler there, and compiles plain ones
        just in time with edgetpu_compiler or a compile service), ``"auto"``,
        or a target registered with :func:`coralrt._targets.register`.
    :param options: a :class:`~coralrt.SessionOptions` (None: the defaults);
        see it for what each option means.
    :param overrides: options by name (``num_threads=2``, ``device="usb:1"``
        ...), replacing those of ``options``; any other name is a TypeError.

    :attr:`options` holds the options the session runs with (``driver``
    resolved on ``coral``, None elsewhere); a signature's own session is
    created with them.

    ``compile_info`` is None on the CPU target; otherwise a dict with at least
    ``cache_hit``, ``compile_seconds`` and ``key``.

    Raises :class:`~coralrt.errors.ModelError` for invalid models,
    :class:`~coralrt.errors.UnsupportedOperatorError` for operators nothing
    provides.  ``run`` is safe to call from several threads; calls are
    serialized per session, except with ``device=[...]`` (several sticks),
    where concurrent callers overlap on the sticks (see docs/multi-stick.md).
    :meth:`submit` queues the request for the session's worker thread(s) and
    returns at once; :meth:`close` (or leaving a ``with`` block) stops them.
    A run interrupted in the
    middle of a transfer (Ctrl-C included) never makes a later run wrong: the
    stick is reset before the next one (see :meth:`reset` and docs/usb.md).
    """

    def __init__(self, model, target: str = "cpu", options: SessionOptions | None = None,
                 **overrides):
        check_names(overrides)    # a misspelt keyword fails first, as it always did
        if target not in TARGETS:
            raise ConfigError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
        options = with_overrides(options, overrides)
        driver = targets.resolve_driver(options.driver, target)
        self._backend = get_backend(options.backend)
        self._host = plugin_host(tuple(options.plugins or ()))
        loading = targets.Loading(dataclasses.replace(options, driver=driver),
                                  self._backend, self._host)
        targets.chosen_rewrites(loading)     # a misspelt name fails on every target
        parsed = None
        if target == targets.AUTO:
            target, parsed = targets.choose_auto(model, loading)
        self.target = target
        device = options.device
        # What a signature's own session (another subgraph) is created with.
        self.options = dataclasses.replace(
            options, driver=driver if targets.registry.reaches_stick(target) else None)
        self._pipelined = isinstance(device, (list, tuple))
        self._signature_sessions: dict[str, InferenceSession] = {}
        self._gate = Gate()           # requests in progress, which close waits for
        self._close_lock = threading.Lock()
        prepared = targets.prepare(target, model, loading, parsed)
        self.model, self._program = prepared.model, prepared.program
        self.compile_info = prepared.compile_info
        # The model as given (tensor indices of signatures and coralrt.tflite).
        self._described = prepared.source_model if prepared.compile_info else self.model
        self._compiled_from = prepared.source
        # A device list pipelines the Edge TPU segments over the sticks.
        self.devices = prepared.devices
        self.device = self.devices[0] if self.devices else None
        given = device if isinstance(device, (list, tuple)) else [device]
        self._owned = [d for d in self.devices if not any(d is g for g in given)]
        sg = self.model.main
        self._inputs = [TensorInfo.from_tensor(sg.tensors[i], i) for i in sg.inputs]
        self._outputs = tensor_infos(sg, sg.outputs)   # custom op shapes filled in
        self._input_names = [t.name for t in self._inputs]
        self._output_names = unique_names([t.name for t in self._outputs])
        self._input_pos = {n: i for i, n in enumerate(self._input_names)}
        self._requests = Requests(self._program, self._output_names, owner=self,
                                  dynamic=any(-1 in t.shape_signature for t in self._inputs),
                                  shapes=[t.shape for t in self._inputs],
                                  max_pending=options.max_pending)
        log.debug("session ready on %s: %d inputs, %d outputs, backend %s", target,
                  len(self._inputs), len(self._outputs), self._backend.name)

    def stats(self) -> dict:
        """Counters of a session over several sticks: requests per stick and the
        sticks set aside (``strategy="replicate"``), or completed requests and
        each stage's busy seconds (``"pipeline"``); ``{}`` on one stick or the CPU."""
        stats = getattr(self._program, "stats", None)
        return stats() if callable(stats) else {}

    def profile(self) -> list[dict]:
        """Per step of the last ``run``: kind ("tpu"/"cpu"/"plugin"), label, host
        seconds and, for Edge TPU steps, the device seconds (the latency model's
        estimate on the simulated stick).  ``operators``: how many of the model's
        operators the step runs (for an Edge TPU segment compiled by the session,
        those of the source model it covers).

        On ``sim`` and ``coral``, when no operator reached the Edge TPU, every
        row also has a ``note`` saying so and why (the commonest reason).
        """
        rows = self._program.profile()
        covered = _segment_sizes(self.compile_info)
        if covered:
            # An Edge TPU step is one compiled operator; count the model's operators
            # it runs (TPU steps come in segment order).
            tpu = iter(range(len(covered)))
            rows = [{**r, "operators": covered.get(next(tpu), r["operators"])}
                    if r["kind"] == "tpu" else r for r in rows]
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

    def run(self, inputs, feed=_NO_FEED, run_options=None, *,
            outputs: Sequence[str] | None = None, signature: str | None = None,
            timeout: float | None = None):
        """Run once.  Two forms, told apart by the number of positional arguments:

        * ``run(inputs, outputs=None)`` (coralrt's): returns ``{output name:
          array}``.  ``inputs`` is a dict by input name, a list in input order,
          or one array for a one-input model.  ``outputs`` restricts the result
          to these output names, in that order.
        * ``run(output_names, feed)`` (onnxruntime's, whenever a second
          positional argument is given): ``output_names`` is ``None`` (every
          output) or a list of output names, ``feed`` what ``inputs`` is
          above; returns a **list** of arrays in that order, as onnxruntime
          does.  ``run_options`` is accepted for onnxruntime's signature and
          must be ``None``; ``outputs=`` cannot be combined with this form.

        ``signature="key"`` runs that signature of the model (see
        :meth:`get_signatures`): inputs and output names are then the
        signature's names, not the tensors'.

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

        ``timeout`` (seconds, None: no limit) bounds the wait, queueing behind
        submitted requests included: past it, the result is discarded, the
        request is interrupted (a stick left in the middle of a transfer is
        reset before its next request, docs/reliability.md) and
        :class:`~coralrt.errors.InferenceTimeoutError` is raised; the session
        stays usable.  After :meth:`close`, raises
        :class:`~coralrt.errors.SessionClosedError`.
        """
        if feed is _NO_FEED:
            if inputs is None:
                raise InputError("inputs must be a dict by name, a list in input order or a "
                                 "numpy array, got None (onnxruntime's form takes the feed "
                                 "second: run(None, feed))")
            return self._run(inputs, outputs, signature, timeout)
        if outputs is not None:
            raise InputError("run(output_names, feed) (onnxruntime's form) names the outputs "
                             "in its first argument; do not also pass outputs=")
        if run_options is not None:
            raise InputError("run_options (onnxruntime's RunOptions) is not supported; "
                             "pass None")
        if inputs is not None and (isinstance(inputs, (str, bytes))
                                   or not isinstance(inputs, Sequence)
                                   or not all(isinstance(n, str) for n in inputs)):
            raise InputError(f"run(output_names, feed): output_names must be None or a list "
                             f"of output names, got {type(inputs).__name__}")
        result = self._run(feed, None if inputs is None else list(inputs), signature, timeout)
        return list(result.values())

    def _run(self, inputs, outputs, signature, timeout=None) -> dict[str, np.ndarray]:
        gate = self._gate
        with gate.held():           # close waits for this request before closing sticks
            gate.check()
            if signature is not None:
                return self._run_signature(signature, inputs, outputs, timeout)
            arrays = [self._check(info, value)
                      for info, value in zip(self._inputs, self._order(inputs))]
            results = self._requests.run(arrays, timeout)
        return results if outputs is None else pick(results, outputs, self._output_names)

    # -- signatures -------------------------------------------------------------

    @property
    def source_model(self) -> Model:
        """The model as given (its plain model when a compiled one was replaced
        by it), before any compilation: the tensor indices of its signatures
        and of :mod:`coralrt.tflite` are this model's.  On ``cpu`` and for a
        model compiled by edgetpu_compiler on ``coral`` it is :attr:`model`."""
        if self._described is None:   # a compile-cache hit parsed nothing: parse it now
            self._described = load_model(self._compiled_from)
        return self._described

    def get_signatures(self) -> dict[str, dict[str, list[str]]]:
        """The model's signatures: ``{key: {"inputs": [names], "outputs": [names]}}``
        in file order (LiteRT's ``get_signature_list()``); ``{}`` when it has none."""
        return {s.key: {"inputs": list(s.inputs), "outputs": list(s.outputs)}
                for s in self.source_model.signatures}

    def signature_session(self, key: str) -> tuple[InferenceSession, SignatureDef]:
        """The session that runs signature ``key`` and the signature with tensor
        indices in that session's main subgraph.  A signature of subgraph 0 is
        this session; another subgraph gets its own session, created on first
        use with this session's target, settings and stick(s)."""
        self._gate.check()
        sigs = {s.key: s for s in self.source_model.signatures}
        sig = sigs.get(key)
        if sig is None:
            have = f"its signatures are {list(sigs)}" if sigs else "it has no signatures"
            raise InputError(f"unknown signature {key!r}; {have}")
        if sig.subgraph_index == 0:
            return self, sig
        session = self._signature_sessions.get(key)
        if session is None:
            device = (self.devices if self._pipelined else self.device) if self.devices \
                else None
            session = InferenceSession(with_entry(self.source_model, sig.subgraph_index),
                                       self.target, self.options, device=device)
            self._signature_sessions[key] = session
        return session, dataclasses.replace(sig, subgraph_index=0)

    def _run_signature(self, key: str, inputs, outputs, timeout=None) -> dict[str, np.ndarray]:
        session, sig = self.signature_session(key)
        main = session.source_model.main
        in_pos = {t: p for p, t in enumerate(main.inputs)}
        out_pos = {t: p for p, t in enumerate(main.outputs)}
        bad = [n for n, t in sig.inputs.items() if t not in in_pos] + \
            [n for n, t in sig.outputs.items() if t not in out_pos]
        if bad:
            raise InputError(f"signature {key!r}: {bad} are not inputs or outputs of its "
                             f"subgraph; coralrt runs a signature through them only")
        names = list(sig.inputs)
        tensor_names = [t.name for t in session.get_inputs()]
        feed = {tensor_names[in_pos[sig.inputs[n]]]: v
                for n, v in zip(names, _signature_values(key, names, inputs))}
        result = list(session.run(feed, timeout=timeout).values())
        got = {n: result[out_pos[t]] for n, t in sig.outputs.items()}
        return got if outputs is None else pick(got, outputs, list(sig.outputs))

    def submit(self, inputs, *, block: bool = True, timeout: float | None = None) -> Future:
        """Like :meth:`run`, without waiting: a ``concurrent.futures.Future`` of
        ``{output name: array}``, returned at once.

        The inputs are checked here (InputError at once); the request joins a
        queue of ``max_pending`` that the session's worker thread (one per
        stick with ``strategy="replicate"``; a pipeline's stages otherwise)
        serves in order, so the caller prepares the next frame while this one
        runs.  A full queue blocks the caller up to ``timeout`` seconds
        (None: as long as it takes); ``block=False``, or the timeout expiring,
        raises :class:`~coralrt.errors.QueueFullError`.  Each future holds
        arrays of its own, never buffers a later request reuses.  Keep the
        arrays passed in unchanged until the future is done.
        """
        gate = self._gate
        with gate.held():
            gate.check()
            arrays = [self._check(info, value)
                      for info, value in zip(self._inputs, self._order(inputs))]
            return self._requests.submit(arrays, block=block, timeout=timeout)

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
        gate = self._gate
        with gate.held(), self._program.lock:   # not in the middle of this session's run
            gate.check()
            for device in self.devices:
                device.reset()
            self._program.after_reset()

    def close(self, cancel: bool = False) -> None:
        """Finish the submitted requests (``cancel=True``: cancel those not started;
        their futures are cancelled, and a ``run(..., timeout=...)`` waiting for
        one raises :class:`~coralrt.errors.SessionClosedError`), wait for the
        requests running in callers' threads, stop the worker threads and a
        pipeline, and close the sticks this session opened.  A request is
        never cut short by a close: it returns its outputs, or, if it had not
        started, raises SessionClosedError.  Idempotent; ``run``, ``submit``
        and ``reset`` then raise :class:`~coralrt.errors.SessionClosedError`."""
        self._gate.close()                  # from here on, new requests are refused
        with self._close_lock:              # a second caller waits for the first close
            self._requests.close(cancel=cancel)
            self._gate.wait()               # requests running in callers' threads
            for session in list(self._signature_sessions.values()):
                session.close(cancel)
            self._requests.release()
            self._program.close()
            for device in self._owned:
                device.close()
            self._owned = []

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _order(self, inputs) -> list:
        return order_feed(inputs, self._input_names, self._input_pos)

    def _check(self, info: TensorInfo, value) -> np.ndarray:
        return check_input(info, value)

    def __repr__(self) -> str:
        return (f"<InferenceSession target={self.target!r} backend={self.backend!r} "
                f"inputs={self._input_names} outputs={self._output_names}>")


def _signature_values(key: str, names: list[str], inputs) -> list:
    """The values of signature ``key``'s inputs ``names``, in that order, from
    a dict by those names, a list in that order, or one array for one input."""
    if isinstance(inputs, Mapping):
        unknown = [k for k in inputs if k not in names]
        missing = [k for k in names if k not in inputs]
        if unknown or missing:
            raise InputError(f"inputs do not match signature {key!r}: missing {missing}, "
                             f"unknown {unknown}; its inputs are {names}")
        return [inputs[k] for k in names]
    if isinstance(inputs, np.ndarray) and len(names) == 1:
        return [inputs]
    if isinstance(inputs, Sequence) and not isinstance(inputs, (str, bytes)) \
            and len(inputs) == len(names):
        return list(inputs)
    raise InputError(f"signature {key!r} takes {names}: pass a dict by those names "
                     f"or a list in that order")


def _segment_sizes(compile_info) -> dict[int, int]:
    """Operators of the source model per Edge TPU segment, from the compile's placement
    (``[unit, segment, reason]`` per operator); empty when there is none."""
    out: dict[int, int] = {}
    for entry in (compile_info or {}).get("placement") or ():
        if entry and entry[0] == "tpu" and entry[1] is not None:
            out[int(entry[1])] = out.get(int(entry[1]), 0) + 1
    return out
