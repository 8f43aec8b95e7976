"""The requests a session has in progress, and the close that waits for them.

A session's ``run`` usually executes in its caller's thread, not on a worker
the session could join; :class:`Gate` is how ``close`` waits for those
requests before it closes the program and the sticks under them.  Every
request holds its own thread's re-entrant lock while it runs (a C lock taken
in a ``with`` statement: an interrupt such as Ctrl-C never leaves it taken
or counted twice).  ``close`` marks the gate closed, so requests arriving
later raise :class:`~coralrt.errors.SessionClosedError`, then takes each
thread's lock in turn, which waits for the request that thread has in
progress.  A thread that closes the session from inside one of its own
requests (a plugin kernel, a callback) does not wait for itself::

    with gate.held():             # this thread's lock, taken in C
        gate.check()              # SessionClosedError once the gate is closed
        outputs = program.run(inputs)
    ...
    gate.close()                  # no new request gets in
    gate.wait()                   # those in progress have finished
"""

from __future__ import annotations

import threading
import weakref

from coralrt.errors import SessionClosedError

__all__ = ["Gate", "closed_error", "closed_under"]


def closed_error() -> SessionClosedError:
    return SessionClosedError("the session is closed: create a new InferenceSession to run "
                              "this model again")


def closed_under(error: BaseException) -> SessionClosedError:
    """What a request that ``error`` ended receives when its session's program and
    sticks were closed under it (the session was closed from inside the request)."""
    closed = SessionClosedError(f"the session was closed while this request ran "
                                f"({type(error).__name__}: {error}); its outputs are lost")
    closed.__cause__ = error
    return closed


class Gate:
    """Requests in progress, by thread; closed once, then refuses new ones."""

    def __init__(self) -> None:
        self.closed = False
        self._local = threading.local()
        # Each thread's lock, held only by that thread's own references: it goes away
        # with the thread.
        self._locks: weakref.WeakSet = weakref.WeakSet()
        self._register = threading.Lock()

    def held(self):
        """This thread's lock, to hold (``with``) around one request."""
        lock = getattr(self._local, "lock", None)
        if lock is None:
            lock = threading.RLock()
            with self._register:
                self._locks.add(lock)
            self._local.lock = lock
        return lock

    def check(self) -> None:
        """SessionClosedError once the gate is closed."""
        if self.closed:
            raise closed_error()

    def close(self) -> None:
        """Refuse new requests (idempotent); :meth:`wait` waits for the others."""
        self.closed = True

    def wait(self) -> None:
        """Return once no other thread has a request in progress (call after close)."""
        with self._register:
            locks = list(self._locks)
        for lock in locks:      # this thread's own lock is re-entrant: no wait on itself
            with lock:
                pass
