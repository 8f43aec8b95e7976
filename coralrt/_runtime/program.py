"""The one ``Program`` protocol a session drives.

A program is a model prepared for one target: a model loaded whole into a
CPU backend (:class:`coralrt._backends.base.CpuProgram`), the steps of a
compiled model (:class:`coralrt._runtime.executor.ExecutorProgram`), those
steps pipelined over several sticks
(:class:`coralrt._runtime.pipeline.PipelinedProgram`) or replicated on each
of several sticks (:class:`coralrt._runtime.replicate.ReplicatedProgram`).  The session calls
only what is declared here, so it never needs to know which one it holds::

    with program.lock:                 # what must happen atomically per request
        program.resize_inputs(shapes)  # only models with dynamic input shapes
        outputs = program.run(inputs)
    future = program.submit(inputs)    # concurrent.futures.Future of the outputs
    program.concurrency, program.pipelined  # how a session's workers drive it
    rows = program.profile()           # per step of the last run
    program.close()                    # idempotent

``inputs`` are in model input order with the dtypes and shapes the session
has already checked; outputs come back in model output order.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import numpy as np

from coralrt.errors import InputError

__all__ = ["Program", "NoLock", "STATIC_SHAPES", "completed"]

STATIC_SHAPES = ("Edge TPU programs have static input shapes; this model's inputs cannot "
                 "be resized")


class NoLock:
    """A lock that never blocks: for programs whose callers must not be serialised."""

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return True

    def release(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def completed(fn) -> Future:
    """A future already holding ``fn()``'s result, or the exception it raised."""
    future: Future = Future()
    future.set_running_or_notify_cancel()
    try:
        future.set_result(fn())
    except Exception as e:  # noqa: BLE001 - delivered through the future
        future.set_exception(e)
    return future


class Program:
    """Base class of every program a session can run.

    ``lock`` is re-entrant: the session holds it around ``resize_inputs``
    followed by ``run`` so the pair is atomic.  A program whose ``run`` is
    safe to call concurrently (a pipeline) replaces it with :class:`NoLock`.
    """

    #: Requests the program can run at once from different threads (a
    #: replicated program: one per stick); a session starts that many workers.
    concurrency = 1
    #: ``submit`` overlaps requests by itself (a pipeline): a session only feeds it.
    pipelined = False

    def __init__(self) -> None:
        self.lock: Any = threading.RLock()

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """One inference: the outputs, in model output order."""
        raise NotImplementedError

    def resize_inputs(self, shapes: list[tuple[int, ...]]) -> None:
        """New input shapes (only ``-1`` dimensions of a signature may change)."""
        raise InputError(STATIC_SHAPES)

    def profile(self) -> list[dict]:
        """One dict per step of the last run: ``step``, ``kind`` ("cpu", "tpu",
        "plugin"), ``label``, ``operators``, ``host_seconds`` and
        ``device_seconds`` (None except for Edge TPU steps)."""
        raise NotImplementedError

    def submit(self, inputs: list[np.ndarray]) -> Future:
        """A future of :meth:`run`'s result.  This default runs the request
        before returning; a pipelined program overlaps requests instead."""
        def locked_run():
            with self.lock:
                return self.run(inputs)
        return completed(locked_run)

    def after_reset(self) -> None:
        """The session reset the program's sticks (a replicated program takes the
        sticks it had set aside as failed back into service)."""

    def close(self) -> None:
        """Release what the program holds (worker threads); idempotent."""
