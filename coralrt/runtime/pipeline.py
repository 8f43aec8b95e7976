"""Pipeline a program's Edge TPU segments across several sticks.

:func:`build_pipelined_program` builds the steps of a compiled model with
:func:`coralrt.runtime.executor.build_program`, Edge TPU segment ``i`` on
``devices[i % len(devices)]``, and cuts them into stages: each TPU step starts
a stage, and the CPU and plugin steps that follow it (up to the next TPU step)
belong to that stage; CPU steps before the first TPU step join the first
stage.  One worker thread runs each stage, and bounded queues
(``queue.Queue(maxsize=depth)``) connect them, as in pycoral's
``PipelinedModelRunner``: while stick 1 runs segment 1 of request ``k``,
stick 0 already runs segment 0 of request ``k + 1``.

    program = build_pipelined_program(compiled, devices=[d0, d1], backend=cpu)
    future = program.submit(inputs)        # concurrent.futures.Future -> outputs
    outputs = program.run(inputs)          # blocking; safe from many threads
    program.close()

Every request carries its own future, so results go back to the caller that
submitted them, and requests from different callers overlap in the pipeline.
A request whose stage fails gets the exception (a coralrt error; anything
else is wrapped in :class:`~coralrt.errors.InferenceError`) and the pipeline
keeps serving the following requests.  If a worker thread itself dies, the
pipeline is marked broken: pending and later requests fail with an
:class:`~coralrt.errors.InferenceError` that names the cause.

Whatever escapes a stage in the middle of a transfer, the device contract
(:mod:`coralrt.runtime.device`) keeps later answers right: the stick marks
itself out of step and the next request through it (from this pipeline, or
from another session on the same stick after the pipeline broke) resets it
first.  A caller interrupted while it waits (Ctrl-C in ``run``) abandons its
request, which still runs to the end in the workers.  ``run`` and ``submit``
touch no lock that an interrupt could leave taken (the first stage's queue is
an :class:`_Inbox`, and ``run`` waits on its request, not on a
``concurrent.futures.Future``), so an interrupt never hangs the workers.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import numpy as np

from coralrt.runtime.device import EdgeTpuDevice
from coralrt.runtime.executor import ExecutorProgram, Step, build_program, run_steps, step_rows
from coralrt.runtime.program import NoLock, Program
from coralrt.errors import ConfigError, CoralRTError, InferenceError, InputError

__all__ = ["PipelinedProgram", "Stage", "build_pipelined_program", "stages_of"]

log = logging.getLogger("coralrt.pipeline")

_STOP = object()          # the sentinel that shuts the workers down, stage by stage
_POLL = 0.1               # seconds between checks for a broken pipeline while blocked


@dataclass
class Stage:
    index: int
    steps: list[Step]
    device: EdgeTpuDevice | None = None  # the stick of this stage's TPU step (None: CPU only)
    requests: int = 0                # requests this stage completed
    busy_seconds: float = 0.0        # wall time spent running them

    @property
    def label(self) -> str:
        return f"stage {self.index} on {self.device.path if self.device is not None else 'cpu'}"


def stages_of(steps: Sequence[Step]) -> list[Stage]:
    """Cut ``steps`` into stages: a new stage at each TPU step after the first."""
    stages: list[Stage] = []
    current: list[Step] = []
    device = None
    seen_tpu = False
    for step in steps:
        if step.kind == "tpu" and seen_tpu:
            stages.append(Stage(len(stages), current, device))
            current = []
        if step.kind == "tpu":
            seen_tpu = True
            device = step.device
        current.append(step)
    if current:
        stages.append(Stage(len(stages), current, device))
    return stages


def _taken() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


@dataclass
class _Request:
    future: Future
    values: dict
    submitted: float = field(default_factory=time.perf_counter)
    # Released once the request is complete; ``run`` waits on it and reads
    # ``result``/``error`` rather than wait on the Future: a KeyboardInterrupt
    # can land in Condition.__enter__ (Python code) just after the Future's lock
    # was taken and leave it taken, and the worker completing the Future would hang.
    done: threading.Lock = field(default_factory=_taken)
    finished: bool = False
    result: list | None = None
    error: BaseException | None = None


class _Inbox:
    """The first stage's queue: bounded like the others, for callers that a signal
    may interrupt anywhere.  queue.Queue takes its mutex in Python code (a
    Condition), where a KeyboardInterrupt can leave it taken and hang the
    worker; here the items sit in a ``queue.SimpleQueue`` (C) and a full inbox
    is waited on with a plain lock that the worker releases whenever it takes
    an item (a wake-up, not a count: waiters look again, and ``timeout`` bounds
    a missed one)."""

    def __init__(self, maxsize: int):
        self.maxsize = maxsize
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._space = threading.Lock()

    def put(self, item, block: bool = True, timeout: float | None = None) -> None:
        if self._items.qsize() >= self.maxsize:
            if block:
                self._space.acquire(timeout=-1 if timeout is None else timeout)
            if self._items.qsize() >= self.maxsize:
                raise queue.Full
        self._items.put(item)

    def put_nowait(self, item) -> None:
        self.put(item, block=False)

    def get(self):
        item = self._items.get()
        try:
            self._space.release()
        except RuntimeError:        # nobody was waiting
            pass
        return item


class _State:
    """What the workers share (no reference back to the program, so that an
    unreferenced program can be collected and its workers stopped)."""

    def __init__(self):
        self.broken: BaseException | None = None
        self.closed = False
        self.submit_lock = threading.Lock()   # orders submits against close
        self.completed = 0
        self._count_lock = threading.Lock()

    def count(self) -> None:
        with self._count_lock:
            self.completed += 1


class PipelinedProgram(Program):
    """Stages of a program on worker threads with bounded queues between them.

    A :class:`~coralrt.runtime.program.Program` whose :meth:`submit` overlaps
    requests.  ``lock`` is a no-op: ``run`` is safe to call from several
    threads at once and must not be serialised by its callers.
    """

    def __init__(self, program: ExecutorProgram, *, depth: int = 2,
                 name: str = "coralrt-pipeline"):
        super().__init__()
        if depth < 1:
            raise ConfigError(f"pipeline depth must be >= 1, not {depth}")
        self.steps = program.steps
        self.inputs = list(program.inputs)
        self.outputs = list(program.outputs)
        self.depth = depth
        self.lock = NoLock()
        self.stages = stages_of(program.steps)
        self._state = _State()
        self._queues = [_Inbox(depth) if k == 0 else queue.Queue(maxsize=depth)
                        for k in range(len(self.stages))]
        self._threads = []
        for k, stage in enumerate(self.stages):
            out_q = self._queues[k + 1] if k + 1 < len(self.stages) else None
            t = threading.Thread(target=_worker, name=f"{name}-{k}", daemon=True,
                                 args=(stage, self._queues[k], out_q, self.outputs,
                                       program.runner, self._state))
            t.start()
            self._threads.append(t)
        self._finalizer = weakref.finalize(self, _stop, self._queues[0] if self._queues
                                           else None, self._state)
        log.debug("pipeline of %d stage(s), depth %d: %s", len(self.stages), depth,
                  ", ".join(s.label for s in self.stages))

    # -- requests ---------------------------------------------------------------------
    def submit(self, inputs: Sequence[np.ndarray]) -> Future:
        """Queue one inference; the future's result is the list of outputs.

        Blocks while the first stage's queue is full (back-pressure), and
        raises :class:`InferenceError` when the pipeline is closed or broken.
        """
        return self._submit(inputs).future

    def _submit(self, inputs: Sequence[np.ndarray]) -> _Request:
        if len(inputs) != len(self.inputs):
            raise InputError(f"the program takes {len(self.inputs)} input(s), got {len(inputs)}")
        request = _Request(Future(), dict(zip(self.inputs, inputs)))
        if not self.stages:      # a model without operators: outputs are inputs
            request.future.set_running_or_notify_cancel()
            _complete(request, [request.values[t] for t in self.outputs])
            return request
        state = self._state
        with state.submit_lock:       # nothing can follow close's stop sentinel
            while True:
                _check_usable(state)
                try:
                    self._queues[0].put(request, timeout=_POLL)
                    return request
                except queue.Full:
                    continue

    def run(self, inputs: Sequence[np.ndarray], timeout: float | None = None) -> list[np.ndarray]:
        """One inference, blocking; ``timeout`` seconds (None: no limit)."""
        request = self._submit(inputs)
        if not request.done.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise InferenceError(f"the pipelined inference did not finish within {timeout} s")
        if request.error is not None:
            raise request.error
        return request.result

    def map(self, batches, timeout: float | None = None):
        """Outputs for each inputs list of ``batches``, in order, with the pipeline full."""
        futures = [self.submit(x) for x in batches]
        return [f.result(timeout) for f in futures]

    # -- the Program protocol -----------------------------------------------------------
    def profile(self) -> list[dict]:
        """Per step of the last request each stage ran, with its stage and device."""
        rows = step_rows([s for stage in self.stages for s in stage.steps])
        where = [(stage.index, stage.device) for stage in self.stages for _ in stage.steps]
        for row, (index, device) in zip(rows, where):
            row["stage"] = index
            row["device"] = device.path if device is not None else None
        return rows

    def stats(self) -> dict:
        """Requests completed, and per stage its requests and busy seconds."""
        return {"completed": self._state.completed, "depth": self.depth,
                "stages": [{"stage": s.index,
                            "device": s.device.path if s.device is not None else None,
                            "steps": len(s.steps), "requests": s.requests,
                            "busy_seconds": s.busy_seconds} for s in self.stages]}

    @property
    def broken(self) -> BaseException | None:
        """Why the pipeline stopped working, or None while it works."""
        return self._state.broken

    # -- shutdown -----------------------------------------------------------------------
    def close(self, timeout: float | None = 10.0) -> None:
        """Finish the queued requests, stop the workers (the devices stay open)."""
        state = self._state
        with state.submit_lock:
            if state.closed:
                return
            state.closed = True
        if self._queues:
            _put(self._queues[0], _STOP, state)
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            log.warning("pipeline workers still running after close: %s", ", ".join(alive))
        self._finalizer.detach()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "broken" if self.broken else "closed" if self._state.closed else "running"
        return (f"<PipelinedProgram {len(self.stages)} stage(s) depth={self.depth} "
                f"{state}>")


def _check_usable(state: _State) -> None:
    if state.broken is not None:
        raise _broken_error(state)
    if state.closed:
        raise InferenceError("the pipeline is closed")


def _put(q: queue.Queue | _Inbox, item, state: _State) -> bool:
    """Put with back-pressure; False when the queue stays full after the pipeline broke."""
    while True:
        try:
            q.put(item, timeout=_POLL)
            return True
        except queue.Full:
            if state.broken is not None:
                return False


def _stop(first: _Inbox | None, state: _State) -> None:
    """Finalizer of an unreferenced program: stop its workers."""
    state.closed = True
    if first is not None:
        try:
            first.put_nowait(_STOP)
        except queue.Full:
            pass    # daemon threads: they end with the process


def _complete(request: _Request, result: list | None = None,
              error: BaseException | None = None) -> None:
    """Set the request's future (first completion wins) and release its waiter."""
    if request.finished:
        return
    request.finished = True
    request.result, request.error = result, error
    try:
        if error is None:
            request.future.set_result(result)
        else:
            request.future.set_exception(error)
    except InvalidStateError:
        pass                         # cancelled by its caller meanwhile
    finally:
        request.done.release()


def _fail(request: _Request, error: BaseException) -> None:
    _complete(request, error=error)


def _run_stage(stage: Stage, values: dict, runner) -> None:
    run_steps(stage.steps, values, runner)


def _worker(stage: Stage, in_q: queue.Queue | _Inbox, out_q: queue.Queue | None,
            outputs: list[int],
            runner, state: _State) -> None:
    request = None
    try:
        while True:
            request = in_q.get()
            if request is _STOP:
                if out_q is not None:
                    _put(out_q, _STOP, state)
                return
            if stage.index == 0 and not request.future.set_running_or_notify_cancel():
                continue                      # cancelled before it started
            if state.broken is not None:
                _fail(request, _broken_error(state))
                continue
            start = time.perf_counter()
            try:
                _run_stage(stage, request.values, runner)
            except CoralRTError as e:
                _fail(request, e)
                continue
            except Exception as e:  # noqa: BLE001 - reaches the caller, wrapped
                error = InferenceError(f"pipeline {stage.label} failed: {type(e).__name__}: {e}")
                error.__cause__ = e
                _fail(request, error)
                continue
            finally:
                stage.busy_seconds += time.perf_counter() - start
                stage.requests += 1
            if out_q is None:
                values, request.values = request.values, None
                _complete(request, [values[t] for t in outputs])
                state.count()
            elif not _put(out_q, request, state):
                _fail(request, _broken_error(state))
            request = None              # the next stage's now
    except BaseException as e:  # noqa: BLE001 - a dead worker breaks the pipeline
        state.broken = e
        log.error("pipeline %s stopped: %s: %s", stage.label, type(e).__name__, e,
                  exc_info=e)
        if isinstance(request, _Request):
            _fail(request, _broken_error(state))
        _drain(in_q, out_q, state)


def _broken_error(state: _State) -> InferenceError:
    error = InferenceError(f"the pipeline is broken ({type(state.broken).__name__}: "
                           f"{state.broken}); build the session again")
    error.__cause__ = state.broken
    return error


def _drain(in_q: queue.Queue | _Inbox, out_q: queue.Queue | None, state: _State) -> None:
    """A broken stage fails what reaches it, until the stop sentinel."""
    while True:
        item = in_q.get()
        if item is _STOP:
            if out_q is not None:
                _put(out_q, _STOP, state)
            return
        _fail(item, _broken_error(state))


def build_pipelined_program(compiled, *, devices: Sequence, backend, num_threads: int | None = None,
                            cpu_kernels: str = "optimized", host=None,
                            override_builtins: bool = False, depth: int = 2) -> PipelinedProgram:
    """A :class:`PipelinedProgram` for ``compiled``: Edge TPU segment ``i`` on
    ``devices[i % len(devices)]``, one stage per segment, ``depth`` requests
    queued between stages."""
    devices = list(devices)
    if not devices:
        raise ConfigError("a pipelined program needs at least one Edge TPU device")
    paths = [d.path for d in devices]
    if len(set(map(id, devices))) != len(devices):
        raise ConfigError(f"the same device appears twice in {paths}")
    program = build_program(compiled, device=None, devices=devices, backend=backend,
                            num_threads=num_threads, cpu_kernels=cpu_kernels, host=host,
                            override_builtins=override_builtins)
    n_tpu = sum(1 for s in program.steps if s.kind == "tpu")
    if n_tpu < len(devices):
        log.info("%d Edge TPU segment(s) for %d device(s): %s stay(s) idle", n_tpu,
                 len(devices), ", ".join(str(p) for p in paths[n_tpu:]))
    return PipelinedProgram(program, depth=depth)
