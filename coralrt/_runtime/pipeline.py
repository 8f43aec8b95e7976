"""Pipeline a program's Edge TPU segments across several sticks.

:func:`build_pipelined_program` builds the steps of a compiled model with
:func:`coralrt._runtime.executor.build_program`, Edge TPU segment ``i`` on
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
(:mod:`coralrt._runtime.device`) keeps later answers right: the stick marks
itself out of step and the next request through it (from this pipeline, or
from another session on the same stick after the pipeline broke) resets it
first.  A caller interrupted while it waits (Ctrl-C in ``run``) abandons its
request, which still runs to the end in the workers.  ``run`` and ``submit``
touch no lock that an interrupt could leave taken (the first stage's queue is
an :class:`~coralrt._runtime.stages.Inbox`, and ``run`` waits on its request,
not on a ``concurrent.futures.Future``), so an interrupt never hangs the
workers.  The stages, their queues and their worker threads are
:mod:`coralrt._runtime.stages`; this module builds and drives them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future

import numpy as np

from coralrt._runtime.executor import ExecutorProgram, build_program, step_rows
from coralrt._runtime.program import NoLock, Program
from coralrt._runtime.stages import (POLL, STOP, Inbox, PipelineState, Request, Stage,
                                    check_usable, complete, put_item, stages_of, worker)
from coralrt.errors import ConfigError, InferenceError, InputError

__all__ = ["PipelinedProgram", "Stage", "build_pipelined_program", "stages_of"]

log = logging.getLogger("coralrt.pipeline")


class PipelinedProgram(Program):
    """Stages of a program on worker threads with bounded queues between them.

    A :class:`~coralrt._runtime.program.Program` whose :meth:`submit` overlaps
    requests.  ``lock`` is a no-op: ``run`` is safe to call from several
    threads at once and must not be serialised by its callers.
    """

    pipelined = True

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
        self._state = PipelineState()
        self._queues = [Inbox(depth) if k == 0 else queue.Queue(maxsize=depth)
                        for k in range(len(self.stages))]
        self._threads = []
        for k, stage in enumerate(self.stages):
            out_q = self._queues[k + 1] if k + 1 < len(self.stages) else None
            t = threading.Thread(target=worker, name=f"{name}-{k}", daemon=True,
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

    def _submit(self, inputs: Sequence[np.ndarray]) -> Request:
        if len(inputs) != len(self.inputs):
            raise InputError(f"the program takes {len(self.inputs)} input(s), got {len(inputs)}")
        request = Request(Future(), dict(zip(self.inputs, inputs)))
        if not self.stages:      # a model without operators: outputs are inputs
            request.future.set_running_or_notify_cancel()
            complete(request, [request.values[t] for t in self.outputs])
            return request
        state = self._state
        with state.submit_lock:       # nothing can follow close's stop sentinel
            while True:
                check_usable(state)
                try:
                    self._queues[0].put(request, timeout=POLL)
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
            put_item(self._queues[0], STOP, state)
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


def _stop(first: Inbox | None, state: PipelineState) -> None:
    """Finalizer of an unreferenced program: stop its workers."""
    state.closed = True
    if first is not None:
        try:
            first.put_nowait(STOP)
        except queue.Full:
            pass    # daemon threads: they end with the process


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
