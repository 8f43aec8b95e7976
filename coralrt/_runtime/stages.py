"""The stages of a pipelined program and the worker threads that run them.

:func:`stages_of` cuts a program's steps into :class:`Stage` objects; one
:func:`worker` thread per stage takes :class:`Request` objects from its queue,
runs the stage's steps on the request's values and hands the request to the
next stage's queue, or completes it after the last stage.  The first stage's
queue is an :class:`Inbox` so that callers a signal may interrupt touch no
Python-level lock.  :class:`PipelineState` is what the workers share; once a
worker dies it holds the cause, and what reaches a broken stage fails with
:func:`broken_error`.  :class:`coralrt._runtime.pipeline.PipelinedProgram`
starts the workers and feeds them.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from coralrt._runtime.device import EdgeTpuDevice
from coralrt._runtime.executor import Step, run_steps
from coralrt.errors import CoralRTError, InferenceError

__all__ = ["POLL", "STOP", "Inbox", "PipelineState", "Request", "Stage", "broken_error",
           "check_usable", "complete", "drain", "fail", "put_item", "run_stage", "stages_of",
           "worker"]

log = logging.getLogger("coralrt.pipeline")

STOP = object()          # the sentinel that shuts the workers down, stage by stage
POLL = 0.1               # seconds between checks for a broken pipeline while blocked


@dataclass
class Stage:
    index: int
    steps: list[Step]
    device: EdgeTpuDevice | None = None  # the stick of this stage's TPU step (None: CPU only)
    requests: int = 0                # requests this stage completed
    busy_seconds: float = 0.0        # wall time spent running them

    @property
    def label(self) -> str:
        return f"stage {self.index} on {self.device.label if self.device is not None else 'cpu'}"


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
class Request:
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


class Inbox:
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

    def force(self, item) -> None:
        """Put ``item`` whatever the size (a stop sentinel must never be refused)."""
        self._items.put(item)

    def take_nowait(self):
        """The first item, or ``queue.Empty`` (what a closing owner cancels)."""
        item = self._items.get_nowait()
        try:
            self._space.release()
        except RuntimeError:
            pass
        return item

    def get(self):
        item = self._items.get()
        try:
            self._space.release()
        except RuntimeError:        # nobody was waiting
            pass
        return item


class PipelineState:
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


def check_usable(state: PipelineState) -> None:
    if state.broken is not None:
        raise broken_error(state)
    if state.closed:
        raise InferenceError("the pipeline is closed")


def put_item(q: queue.Queue | Inbox, item, state: PipelineState) -> bool:
    """Put with back-pressure; False when the queue stays full after the pipeline broke."""
    while True:
        try:
            q.put(item, timeout=POLL)
            return True
        except queue.Full:
            if state.broken is not None:
                return False


def complete(request: Request, result: list | None = None,
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


def fail(request: Request, error: BaseException) -> None:
    complete(request, error=error)


def run_stage(stage: Stage, values: dict, runner) -> None:
    run_steps(stage.steps, values, runner)


def worker(stage: Stage, in_q: queue.Queue | Inbox, out_q: queue.Queue | None,
           outputs: list[int], runner, state: PipelineState) -> None:
    """One stage's thread: run each request through the stage until the stop sentinel."""
    request = None
    try:
        while True:
            request = in_q.get()
            if request is STOP:
                if out_q is not None:
                    put_item(out_q, STOP, state)
                return
            if stage.index == 0 and not request.future.set_running_or_notify_cancel():
                continue                      # cancelled before it started
            if state.broken is not None:
                fail(request, broken_error(state))
                continue
            start = time.perf_counter()
            try:
                run_stage(stage, request.values, runner)
            except CoralRTError as e:
                fail(request, e)
                continue
            except Exception as e:  # noqa: BLE001 - reaches the caller, wrapped
                error = InferenceError(f"pipeline {stage.label} failed: {type(e).__name__}: {e}")
                error.__cause__ = e
                fail(request, error)
                continue
            finally:
                stage.busy_seconds += time.perf_counter() - start
                stage.requests += 1
            if out_q is None:
                values, request.values = request.values, None
                complete(request, [values[t] for t in outputs])
                state.count()
            elif not put_item(out_q, request, state):
                fail(request, broken_error(state))
            request = None              # the next stage's now
    except BaseException as e:  # noqa: BLE001 - a dead worker breaks the pipeline
        state.broken = e
        log.error("pipeline %s stopped: %s: %s", stage.label, type(e).__name__, e,
                  exc_info=e)
        if isinstance(request, Request):
            fail(request, broken_error(state))
        drain(in_q, out_q, state)


def broken_error(state: PipelineState) -> InferenceError:
    error = InferenceError(f"the pipeline is broken ({type(state.broken).__name__}: "
                           f"{state.broken}); build the session again")
    error.__cause__ = state.broken
    return error


def drain(in_q: queue.Queue | Inbox, out_q: queue.Queue | None, state: PipelineState) -> None:
    """A broken stage fails what reaches it, until the stop sentinel."""
    while True:
        item = in_q.get()
        if item is STOP:
            if out_q is not None:
                put_item(out_q, STOP, state)
            return
        fail(item, broken_error(state))
