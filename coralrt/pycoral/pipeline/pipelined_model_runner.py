"""A model cut into segments, run as a pipeline: one thread and Interpreter per segment.

Semantics follow pycoral 2.0 (libcoral's PipelinedModelRunner): tensors
travel between segments by name; segment ``i`` may read the pipeline's
inputs and any output of an earlier segment; every output of a segment but
the last must be read by a later one.  The input and output queues are
unbounded unless sized; between segments at most one request waits.
``push({})`` ends the pipeline: the requests already pushed still come out
of ``pop()``, which then returns None.  Unlike libcoral, ``push({})``
returns at once instead of waiting for the segment threads, so it cannot
hang on a full output queue that nobody pops.
"""

from __future__ import annotations

import collections
import logging
import threading

import numpy as np

__all__ = ["PipelinedModelRunner"]

log = logging.getLogger("coralrt.pycoral")

_INTERNAL_QUEUE_SIZE = 1
_NOT_READY = "Invoke called on model that is not ready."


class _WaitQueue:
    """FIFO with a changeable size limit whose blocking waits can be stopped."""

    def __init__(self, max_size: int | None = None):
        self._items: collections.deque = collections.deque()
        self._max = max_size
        self._stopped = False
        self._cond = threading.Condition()

    def set_max_size(self, size: int | None) -> None:
        with self._cond:
            self._max = size
            self._cond.notify_all()

    def push(self, item) -> None:
        """Append ``item``, first waiting while the queue is full."""
        with self._cond:
            while self._max is not None and len(self._items) >= self._max:
                self._cond.wait()
            self._items.append(item)
            self._cond.notify_all()

    def wait(self):
        """(True, the oldest item), waiting for one; (False, None) once stopped and empty."""
        with self._cond:
            while not self._items and not self._stopped:
                self._cond.wait()
            if not self._items:
                return False, None
            item = self._items.popleft()
            self._cond.notify_all()
            return True, item

    def stop_waiters(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)


def _names(details) -> list[str]:
    return [d["name"] for d in details]


def _status(e: BaseException) -> str:
    """An interpreter's error as libcoral words a segment's status: the message alone
    (``Invoke called on model that is not ready.``); other exceptions keep their type."""
    if isinstance(e, (RuntimeError, ValueError)) and str(e):
        return str(e)
    return f"{type(e).__name__}: {e}"


def _queue_size(size) -> int | None:
    size = int(size)
    if size < 0:
        raise ValueError(f"queue size must be >= 0, got {size}")
    return size


class _Segments:
    """The running pipeline: queues, threads and errors.

    Kept apart from :class:`PipelinedModelRunner` so that the threads do not
    keep the runner alive: a runner that is dropped without ``push({})`` is
    collected and its finalizer stops the threads.
    """

    def __init__(self, interpreters, needed_after):
        n = len(interpreters)
        self.interpreters = interpreters
        self.needed_after = needed_after
        self.queues = [_WaitQueue(None if i in (0, n) else _INTERNAL_QUEUE_SIZE)
                       for i in range(n + 1)]
        self.errors: list[str | None] = [None] * n
        self.lock = threading.Lock()
        self.on = True
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True,
                                         name=f"coralrt-pipeline-segment-{i}")
                        for i in range(n)]
        for t in self.threads:
            t.start()

    def run(self, index: int) -> None:
        """Segment ``index``'s thread: requests from queue ``index`` to queue ``index + 1``.

        Ends when its input queue is stopped and drained, and then stops its
        output queue, so the end travels down the pipeline behind the last
        request.  After an error it passes one empty map on (the failure
        marker) and drops whatever else reaches it.
        """
        try:
            self._serve(index)
        finally:
            self.queues[index + 1].stop_waiters()

    def _serve(self, index: int) -> None:
        interp = self.interpreters[index]
        in_q, out_q = self.queues[index], self.queues[index + 1]
        inputs = interp.get_input_details()
        outputs = interp.get_output_details()
        is_last = index == len(self.interpreters) - 1
        failed = False
        while True:
            ok, tensors = in_q.wait()
            if not ok:
                return
            if failed:          # drained and dropped, so no earlier segment blocks
                continue
            try:
                if not tensors:
                    raise RuntimeError("Empty input tensor map.")
                if not getattr(interp, "_is_ready", lambda: True)():
                    raise RuntimeError(_NOT_READY)      # libcoral's words, before any input
                for d in inputs:
                    interp.set_tensor(d["index"], tensors[d["name"]].reshape(d["shape"]))
                interp.invoke()
                produced = {d["name"]: np.array(interp.get_tensor(d["index"]))
                            for d in outputs}
            except Exception as e:  # noqa: BLE001 - reported by push()/pop()
                log.error("pipeline segment %d failed: %s", index, e)
                with self.lock:
                    self.errors[index] = _status(e)
                out_q.push({})      # later segments fail too, so pop() wakes up
                failed = True
                continue
            if is_last:
                out_q.push(produced)
            else:
                keep = self.needed_after[index]
                carried = {k: v for k, v in tensors.items() if k in keep}
                carried.update((k, v) for k, v in produced.items() if k in keep)
                out_q.push(carried)

    def status(self) -> str | None:
        with self.lock:
            for index, error in enumerate(self.errors):
                if error is not None:
                    return f"Segment {index} runner error: {error}"
        return None

    def is_on(self) -> bool:
        with self.lock:
            return self.on

    def shutdown(self) -> None:
        """End the pipeline: the queued requests still go through, then the threads end.

        Returns at once (RuntimeError if the pipeline was already ended).
        """
        with self.lock:
            if not self.on:
                raise RuntimeError("Pipeline was turned off before.")
            self.on = False
        self.queues[0].stop_waiters()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the threads to end; whether they all did."""
        for thread in self.threads:
            thread.join(timeout)
        return not any(t.is_alive() for t in self.threads)

    def fail(self, status: str):
        try:
            self.shutdown()
        except RuntimeError:
            pass
        raise RuntimeError(status)


class PipelinedModelRunner:
    """Runs ``interpreters`` (one per segment, tensors allocated) as a pipeline.

    ``push({name: array})`` queues a request (the first segment's inputs, by
    tensor name); ``pop()`` returns the last segment's outputs
    (``{name: array}``) for the oldest request, waiting for it.
    """

    def __init__(self, interpreters):
        self._segments = None
        if not interpreters:
            raise ValueError("At least one interpreter expected")
        interpreters = list(interpreters)
        available = set(_names(interpreters[0].get_input_details()))
        for index, interp in enumerate(interpreters):
            if not set(_names(interp.get_input_details())) <= available:
                raise ValueError(f"Interpreter {index} can not get its input tensors")
            available.update(_names(interp.get_output_details()))
        # The tensors some later segment reads: only those travel on.
        inputs = [set(_names(i.get_input_details())) for i in interpreters]
        needed_after = [set().union(*inputs[i + 1:]) for i in range(len(interpreters))]
        for index, interp in enumerate(interpreters[:-1]):
            unread = [n for n in _names(interp.get_output_details())
                      if n not in needed_after[index]]
            if unread:
                raise ValueError(f"output tensor(s) {unread} of interpreter {index} are read "
                                 f"by no later segment")
        self._interpreters = interpreters
        self._input_details = {d["name"]: d for d in interpreters[0].get_input_details()}
        self._output_names = _names(interpreters[-1].get_output_details())
        self._segments = _Segments(interpreters, needed_after)

    def set_input_queue_size(self, size: int) -> None:
        """Bound the requests waiting for the first segment; ``push()`` blocks at the bound."""
        self._segments.queues[0].set_max_size(_queue_size(size))

    def set_output_queue_size(self, size: int) -> None:
        """Bound the results waiting for ``pop()``; the last segment waits at the bound."""
        self._segments.queues[-1].set_max_size(_queue_size(size))

    def push(self, input_tensors: dict) -> None:
        """Queue one request: ``{input name: array}`` with every input of the first segment.

        Arrays must have the input's dtype and number of elements; they are
        copied.  ``push({})`` ends the pipeline (pushing again then raises
        RuntimeError).  Raises ValueError for bad inputs, RuntimeError when a
        segment has failed.
        """
        if input_tensors and len(input_tensors) != len(self._input_details):
            raise ValueError(f"Expected input of length {len(self._input_details)}, "
                             f"but got {len(input_tensors)}")
        request = {}
        for name, tensor in (input_tensors or {}).items():
            details = self._input_details.get(name)
            if details is None:
                raise ValueError(f"{name!r} is not an input of the first segment "
                                 f"(its inputs: {sorted(self._input_details)})")
            if not isinstance(tensor, np.ndarray) or tensor.dtype != details["dtype"]:
                raise ValueError("Input should be a list of numpy array of type "
                                 f"{np.dtype(details['dtype'])}")
            size = int(np.prod(details["shape"]))
            if tensor.size != size:
                raise ValueError(f"input {name!r} has {tensor.size} elements, expected "
                                 f"{size} (shape {tuple(details['shape'])})")
            request[name] = np.array(tensor, copy=True)
        segments = self._segments
        status = segments.status()
        if status is not None:
            segments.fail(status)
        if not request:
            segments.shutdown()
            return
        if not segments.is_on():
            raise RuntimeError("Pipeline was turned off before.")
        segments.queues[0].push(request)

    def pop(self) -> dict | None:
        """The outputs of the oldest request, ``{name: array}``, waiting for them.

        None once the pipeline has been ended with ``push({})`` and every
        result has been popped.  RuntimeError in place of the first request a
        segment failed on (the requests before it are returned normally).
        """
        segments = self._segments
        ok, result = segments.queues[-1].wait()
        if not ok:
            return None
        if not result:          # a failed segment's marker: results before it came out
            segments.fail(segments.status() or "a pipeline segment failed")
        return {name: result[name] for name in self._output_names}

    def interpreters(self) -> list:
        """The interpreters this runner was made with, one per segment."""
        return self._interpreters

    def __del__(self):
        # Ended like push({}): queued requests finish and the threads end by themselves.
        segments = getattr(self, "_segments", None)
        if segments is not None and segments.is_on():
            try:
                segments.shutdown()
            except RuntimeError:
                pass
