"""Spreading work over several Edge TPUs: one worker thread per device, jobs
first come first served, and jobs that share an input kept on one device.

A job is ``fn(device_index) -> result``; :meth:`Scheduler.submit` returns a
:class:`concurrent.futures.Future`.  A job submitted with an ``affinity`` key
runs on the device that key was first given to (the least loaded one at the
time), so tiles that read the same operand (the same B of A @ B, compiled into
one model) do not make every stick load it; other jobs go to whichever device
is free first.  This is the placement rule the GPTPU runtime describes
(``../shared/reference/gptpu.md``).  Workers wait on their device with the
interpreter lock released (the USB driver and the simulated stick both do), so
several sticks overlap.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future

__all__ = ["Scheduler"]


class Scheduler:
    """``n_devices`` workers; see the module docstring."""

    def __init__(self, n_devices: int, *, name: str = "coralrt-gp"):
        if not isinstance(n_devices, int) or n_devices < 1:
            raise ValueError(f"n_devices must be a positive int, not {n_devices!r}")
        self.n_devices = n_devices
        self._cv = threading.Condition()
        self._shared: deque = deque()
        self._own: list[deque] = [deque() for _ in range(n_devices)]
        self._affinity: dict = {}
        self._load = [0] * n_devices          # queued + running jobs per device
        self._pending = 0
        self._closed = False
        #: per device: jobs run and seconds spent in them
        self.jobs = [0] * n_devices
        self.busy = [0.0] * n_devices
        self._threads = [threading.Thread(target=self._work, args=(d,), daemon=True,
                                          name=f"{name}-{d}") for d in range(n_devices)]
        for t in self._threads:
            t.start()

    def submit(self, fn, *, affinity=None) -> Future:
        """Queue ``fn(device_index)``; ``affinity``: a hashable key whose jobs all run on
        one device (None: any free device)."""
        future: Future = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            if affinity is None:
                self._shared.append((fn, future))
            else:
                d = self._affinity.get(affinity)
                if d is None:
                    d = min(range(self.n_devices), key=lambda k: (self._load[k], k))
                    self._affinity[affinity] = d
                self._own[d].append((fn, future))
                self._load[d] += 1
            self._pending += 1
            self._cv.notify_all()
        return future

    def sync(self, timeout: float | None = None) -> None:
        """Wait until every job submitted so far has finished (their futures hold the
        results and errors); TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._pending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{self._pending} job(s) still running")
                self._cv.wait(left)

    def close(self) -> None:
        """Finish the queued jobs, then stop the workers."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join()

    def _next(self, d: int):
        with self._cv:
            while True:
                if self._own[d]:
                    return self._own[d].popleft(), True
                if self._shared:
                    self._load[d] += 1
                    return self._shared.popleft(), False
                if self._closed:
                    return None, False
                self._cv.wait()

    def _work(self, d: int) -> None:
        while True:
            job, _ = self._next(d)
            if job is None:
                return
            fn, future = job
            start = time.perf_counter()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(d))
                except BaseException as e:  # noqa: BLE001 - handed to the caller
                    future.set_exception(e)
            with self._cv:
                self.jobs[d] += 1
                self.busy[d] += time.perf_counter() - start
                self._load[d] -= 1
                self._pending -= 1
                self._cv.notify_all()
