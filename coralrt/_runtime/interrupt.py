"""Interrupting a worker thread in the middle of a request it no longer needs to finish.

A caller that stops waiting (``run(timeout=...)``) has :class:`RequestTimedOut`
raised in the worker running its request, as Ctrl-C is raised in a caller's
thread; the device driver then treats it as any exception that escapes a
request mid-transfer (docs/reliability.md, "Interrupt safety").  It may only
land inside :func:`interruptible` blocks, which programs put around the
request alone (never around a queue or a lock it could leave taken); leaving
the block drops an interrupt not delivered yet.  The queue and its workers
are :mod:`coralrt._runtime.worker`.
"""

from __future__ import annotations

import ctypes
import threading
from contextlib import contextmanager

__all__ = ["RequestTimedOut", "Window", "interruptible", "local"]

_SET_ASYNC = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)


class RequestTimedOut(BaseException):
    """Raised in a worker thread inside the request its caller stopped waiting for.

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that nothing on the way
    (a plugin step wraps every ``Exception``) turns it into an ordinary error
    of the request: it reaches the device driver like an interrupt, and the
    driver marks the stick out of step.  It never leaves the worker.
    """


def _async_raise(ident: int, exc) -> bool:
    """Raise ``exc`` (a class; None: drop a pending one) in thread ``ident``."""
    if _SET_ASYNC is None:
        return False
    return _SET_ASYNC(ctypes.c_ulong(ident), ctypes.py_object(exc) if exc else None) == 1


local = threading.local()   # .window: the worker thread's Window


class Window:
    """The part of a worker's request during which it may be interrupted."""

    def __init__(self) -> None:
        self.ident = threading.get_ident()
        self.lock = threading.Lock()
        self.job = None                    # the worker's request (a Job)
        self.open_job = None               # set inside interruptible()

    def open(self) -> None:
        with self.lock:
            self.open_job = self.job

    def close(self) -> None:
        with self.lock:
            self.open_job = None
            _async_raise(self.ident, None)  # an interrupt that came too late is dropped

    def interrupt(self, job) -> bool:
        with self.lock:
            if self.open_job is not job or job.interrupted:
                return False
            job.interrupted = True
            return _async_raise(self.ident, RequestTimedOut)


@contextmanager
def interruptible():
    """Where a worker's request may be interrupted (a no-op outside workers).

    Programs put it around the request itself, inside whatever lock or queue
    they take: an interrupt landing there must not leave one taken."""
    window = getattr(local, "window", None)
    if window is None:
        yield
        return
    window.open()
    try:
        yield
    finally:
        window.close()
