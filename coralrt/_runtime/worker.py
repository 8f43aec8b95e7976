"""A session's requests on worker threads: ``submit`` returns at once.

:class:`Requests` is what :class:`coralrt.InferenceSession` runs a request
through.  ``run`` without a timeout runs in the caller's thread, as it always
did; ``submit`` and ``run(..., timeout=...)`` go through a
:class:`RequestQueue`: a bounded queue (``max_pending`` requests) served in
order by worker threads started on the first request.  A program that runs
one request at a time gets one worker; a replicated program
(:mod:`coralrt._runtime.replicate`) one per stick, so that each free stick
takes the next request; a pipelined program (:mod:`coralrt._runtime.pipeline`)
one worker that only feeds its first stage (``chained``), so requests keep
overlapping in the stages.  A full queue blocks ``submit`` (back-pressure) or
raises :class:`~coralrt.errors.QueueFullError`.

A caller that stops waiting (``run(timeout=...)``) abandons its request.  Not
started yet, it is dropped; running, the worker is interrupted: a
:class:`RequestTimedOut` (:mod:`coralrt._runtime.interrupt`) is raised in the worker thread, in the middle of the
request, as Ctrl-C is raised in a caller's thread.  The device driver treats it
as it treats any exception that escapes a request mid-transfer
(docs/reliability.md, "Interrupt safety"): it marks the stick out of step, and
the stick's next run resets it before anything goes on the wire.  The
exception may only land inside :func:`interruptible` blocks, which the
programs put around their request alone (never around a queue or a lock that
the exception could leave taken); leaving the block drops an interrupt not
delivered yet.  Interpreters without ``PyThreadState_SetAsyncExc`` (not
CPython) let the abandoned request finish, and discard its result.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError

from coralrt.errors import (
    ConfigError, CoralRTError, InferenceError, InferenceTimeoutError, QueueFullError,
    SessionClosedError,
)
from coralrt._runtime.closing import closed_under
from coralrt._runtime.interrupt import RequestTimedOut, Window as _Window, interruptible
from coralrt._runtime.interrupt import local as _local
from coralrt._runtime.stages import STOP, Inbox

__all__ = ["Requests", "RequestQueue", "RequestTimedOut", "Job", "check_max_pending",
           "interruptible"]

log = logging.getLogger("coralrt.session")

POLL = 0.1          # seconds between checks for a closed or broken queue while blocked
def _taken() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


class Job:
    """One request: its future, its inputs, and how it ended.  ``done`` is released
    once it ended: a caller in ``run`` waits on that plain lock, not on the
    Future, whose internal lock an interrupt could leave taken."""

    __slots__ = ("future", "inputs", "done", "finished", "result", "error", "abandoned",
                 "interrupted", "__weakref__")

    def __init__(self, inputs: list) -> None:
        self.future: Future = Future()
        self.inputs = inputs
        self.done = _taken()
        self.finished = False
        self.result = None
        self.error: BaseException | None = None
        self.abandoned = False      # its caller stopped waiting (run's timeout)
        self.interrupted = False    # an interrupt was sent to its worker

    def finish(self, result=None, error: BaseException | None = None) -> None:
        """Complete the future (first completion wins) and release the waiter."""
        if self.finished:
            return
        self.finished = True
        self.result, self.error, self.inputs = result, error, None
        try:
            if error is None:
                self.future.set_result(result)
            else:
                self.future.set_exception(error)
        except InvalidStateError:
            pass                    # cancelled meanwhile
        finally:
            self.done.release()


def _timed_out() -> InferenceTimeoutError:
    return InferenceTimeoutError("the request was abandoned: its caller stopped waiting "
                                 "(run's timeout)")


class RequestQueue:
    """``max_pending`` requests queued for ``workers`` threads that call ``runner``.

    ``runner(inputs)`` returns the program's outputs (a list), or with
    ``chained`` a ``concurrent.futures.Future`` of them (a pipeline's
    ``submit``); ``convert`` turns them into what the job's future holds.
    Threads start on the first request.
    """

    def __init__(self, runner: Callable, *, workers: int = 1, max_pending: int = 4,
                 chained: bool = False, convert: Callable = list,
                 name: str = "coralrt-session"):
        check_max_pending(max_pending)
        self.max_pending = max_pending
        self._runner, self._workers, self._chained = runner, max(1, workers), chained
        self._convert, self._name = convert, name
        self._inbox = Inbox(max_pending)
        self._put_lock = threading.Lock()     # orders producers, and them against close
        self._threads: list[threading.Thread] = []
        self._windows: list[_Window] = []
        self.closed = False
        self._closing = False
        # The session is closing its program and sticks: what fails from now on
        # failed because of that (the session was closed from inside a request).
        self.released = False
        self.broken: BaseException | None = None

    # -- callers ----------------------------------------------------------------------
    def put(self, job: Job, *, block: bool = True, timeout: float | None = None) -> None:
        """Queue ``job``; QueueFullError when there is no room (at once without
        ``block``, else after ``timeout`` seconds; None waits as long as it takes)."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)

        def left(cap: float) -> float:
            return cap if deadline is None else max(0.0, min(cap, deadline - time.monotonic()))
        # The producer lock is held by another caller while it waits for room: wait
        # for it as long as this caller's own timeout allows (not one poll interval,
        # which refused callers with a long timeout behind a busy one).
        if not block:
            wait = POLL
        else:
            wait = -1 if deadline is None else left(float("inf"))
        if not self._put_lock.acquire(timeout=wait):
            raise self._full(block, timeout)
        try:
            self._check_usable()
            if not self._threads:
                self._start()
            while True:
                try:
                    self._inbox.put(job, block=block, timeout=left(POLL))
                    return
                except queue.Full:
                    if not block or (deadline is not None and time.monotonic() >= deadline):
                        raise self._full(block, timeout) from None
                    self._check_usable()
        finally:
            self._put_lock.release()

    def _full(self, block: bool, timeout) -> QueueFullError:
        how = "block=False" if not block else f"no room within {timeout} s"
        return QueueFullError(f"the session's request queue is full ({self.max_pending} "
                              f"pending, {how}); wait for earlier futures, or create the "
                              f"session with a larger max_pending", max_pending=self.max_pending)

    def _check_usable(self) -> None:
        if self.broken is not None:
            error = InferenceError(f"the session's worker stopped ({type(self.broken).__name__}"
                                   f": {self.broken}); create the session again")
            error.__cause__ = self.broken
            raise error
        if self.closed:
            raise SessionClosedError("the session is closed")

    def interrupt(self, job: Job) -> None:
        """``job``'s caller stopped waiting: drop it, or interrupt the worker running it."""
        job.abandoned = True
        for window in list(self._windows):
            if window.interrupt(job):
                log.warning("a request ran past its caller's timeout: interrupted; its "
                            "stick, if it was in the middle of a transfer, is reset before "
                            "its next request")

    # -- workers ----------------------------------------------------------------------
    def _start(self) -> None:
        for k in range(self._workers):
            t = threading.Thread(target=self._serve, name=f"{self._name}-{k}", daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self) -> None:
        window = _local.window = _Window()
        self._windows.append(window)
        job = None
        while True:
            try:
                job = self._inbox.get()
                if job is STOP:
                    return
                self._one(job, window)
                job = None
            except RequestTimedOut:     # landed in an interruptible() block, or just out
                window.close()
                window.job = None
                if job is not None and job is not STOP:
                    job.finish(error=_timed_out())
                job = None
            except BaseException as e:  # noqa: BLE001 - a dead worker: the queue is broken
                window.close()
                self.broken = e
                log.error("session worker stopped: %s: %s", type(e).__name__, e, exc_info=e)
                if isinstance(job, Job):
                    job.finish(error=InferenceError(f"the session's worker stopped: {e!r}"))
                self._drain()
                return

    def _one(self, job: Job, window: _Window) -> None:
        if not job.future.set_running_or_notify_cancel():
            job.finish()            # cancelled by its caller: release a waiter
            return
        if job.abandoned:
            job.finish(error=_timed_out())
            return
        if self.broken is not None:
            job.finish(error=InferenceError(f"the session's worker stopped: {self.broken!r}"))
            return
        if self._chained:
            try:
                inner = self._runner(job.inputs)   # blocks while the pipeline is full
            except Exception as e:  # noqa: BLE001 - a closed or broken pipeline
                job.finish(error=closed_under(e) if self.released else
                           e if isinstance(e, CoralRTError) else InferenceError(str(e)))
                return
            inner.add_done_callback(lambda f: self._chain(job, f))
            return
        window.job = job
        try:
            result, error = self._convert(self._runner(job.inputs)), None
        except CoralRTError as e:
            result, error = None, e
        except Exception as e:  # noqa: BLE001 - reaches the caller, wrapped
            result, error = None, InferenceError(f"{type(e).__name__}: {e}")
            error.__cause__ = e
        finally:
            window.job = None
        job.finish(result, error)

    def _chain(self, job: Job, inner: Future) -> None:
        error = inner.exception()
        if error is not None:
            job.finish(error=closed_under(error) if self.released else error)
        else:
            job.finish(self._convert(inner.result()))

    def _drain(self) -> None:
        """A dead worker fails what is queued, until the stop sentinel."""
        while True:
            item = self._inbox.get()
            if item is STOP:
                return
            item.finish(error=InferenceError(f"the session's worker stopped: {self.broken!r}"))

    # -- shutdown ---------------------------------------------------------------------
    def close(self, *, cancel: bool = False, timeout: float | None = None) -> None:
        """Finish (or, with ``cancel``, cancel) the queued requests and stop the
        workers, waiting up to ``timeout`` seconds for them (None: as long as it takes)."""
        self.closed = True          # a producer waiting for room sees it and gives up
        with self._put_lock:
            if self._closing:
                return
            self._closing = True
        if not self._threads:
            return
        if cancel:
            while True:
                try:
                    job = self._inbox.take_nowait()
                except queue.Empty:
                    break
                if job is not STOP:
                    job.future.cancel()     # a submit()'s future: cancelled
                    # a run(timeout=...) waiting for it: SessionClosedError
                    job.finish(error=SessionClosedError(
                        "the session was closed with cancel=True before this request "
                        "started; nothing was run"))
        for _ in self._threads:
            self._inbox.force(STOP)
        deadline = None if timeout is None else time.monotonic() + timeout
        me = threading.current_thread()
        for t in self._threads:
            if t is not me:     # closed from a future's callback in a worker
                t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive() and t is not me]
        if alive:
            log.warning("session workers still running after close: %s", ", ".join(alive))

    def stop(self) -> None:
        """What an unreferenced session does: stop the workers without waiting."""
        self.closed = True
        for _ in self._threads:
            self._inbox.force(STOP)


class Requests:
    """A session's per-request path over its ``program``: run, submit, close.

    ``names`` are the output names (results are ``{name: array}``);
    ``dynamic``: the model has dynamic input shapes, so a request resizes the
    program first when its shapes differ from the last ones (resize and run
    stay one atomic pair under the program's lock).  Holds no reference to the
    session, so that an unreferenced session can be collected and its workers
    stopped (``owner``'s finalizer).
    """

    def __init__(self, program, names: list[str], *, dynamic: bool, shapes: list,
                 max_pending: int = 4, owner=None):
        self.program = program
        self._names = names
        self._dynamic = dynamic
        self._shapes = list(shapes)
        self.max_pending = max_pending
        pipelined = getattr(program, "pipelined", False)
        self.queue = RequestQueue(
            program.submit if pipelined else self.run_here,
            workers=getattr(program, "concurrency", 1), max_pending=max_pending,
            chained=pipelined, convert=self._outputs)
        self._finalizer = weakref.finalize(owner, self.queue.stop) if owner is not None \
            else None

    def _outputs(self, results: list) -> dict:
        return dict(zip(self._names, results))

    def run_here(self, arrays: list) -> list:
        """One request in this thread (a caller's, or a worker's)."""
        program = self.program
        with program.lock:
            if self._dynamic:
                shapes = [a.shape for a in arrays]
                if shapes != self._shapes:
                    program.resize_inputs(shapes)
                    self._shapes = shapes
            with interruptible():
                try:
                    return program.run(arrays)
                except Exception as e:
                    if self.queue.released:    # closed from inside this very request
                        raise closed_under(e) from e
                    raise

    def run(self, arrays: list, timeout: float | None = None) -> dict:
        """Outputs of one request; with ``timeout``, InferenceTimeoutError past it."""
        if self.queue.closed:
            self.queue._check_usable()
        if timeout is None:
            return self._outputs(self.run_here(arrays))
        deadline = time.monotonic() + max(0.0, float(timeout))
        job = Job(arrays)
        try:
            self.queue.put(job, timeout=timeout)
        except QueueFullError:
            raise InferenceTimeoutError(f"no room in the session's request queue within "
                                        f"{timeout} s; nothing was run", timeout=timeout) from None
        if not job.done.acquire(timeout=max(0.0, deadline - time.monotonic())):
            self.queue.interrupt(job)
            raise InferenceTimeoutError(
                f"the inference did not finish within {timeout} s; its result is discarded, "
                f"and a stick interrupted in the middle of a transfer is reset before its "
                f"next request", timeout=timeout)
        if job.error is not None:
            raise job.error
        if job.result is None:      # its future was cancelled
            raise SessionClosedError("the session was closed before this request started; "
                                     "nothing was run")
        return job.result

    def submit(self, arrays: list, *, block: bool = True, timeout: float | None = None) -> Future:
        job = Job(arrays)
        self.queue.put(job, block=block, timeout=timeout)
        return job.future

    def release(self) -> None:
        """The session closes its program and sticks now: a request still running
        (one that closed its own session) fails with SessionClosedError."""
        self.queue.released = True

    def close(self, *, cancel: bool = False) -> None:
        self.queue.close(cancel=cancel)
        if self._finalizer is not None:
            self._finalizer.detach()


def check_max_pending(max_pending) -> None:
    """ConfigError unless ``max_pending`` is an integer >= 1."""
    if not isinstance(max_pending, int) or isinstance(max_pending, bool) or max_pending < 1:
        raise ConfigError(f"max_pending must be an integer >= 1, not {max_pending!r}")
