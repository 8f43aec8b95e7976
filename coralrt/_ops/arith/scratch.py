"""Working arrays the simulated Edge TPU reuses from one inference to the next.

Kernels need large temporaries (a convolution's float accumulators, its
im2col columns, a requantization block) and write large outputs.  Rather
than allocating them on every run, they come from an :class:`Arena`: one
growing buffer per name and per thread, so concurrent inferences (several
requests in flight, the simulator's own pool threads) never share one.

An arena hands out views of its buffers; they stay valid until the same
thread asks the same arena for the same name again.  So a temporary may only
be used inside the kernel call that took it, and an array handed to a
caller must never be one of them: :meth:`Arena.owns` tells, and the segment
runner copies such outputs (coralrt/_sim/runner.py).
"""

from __future__ import annotations

import math
import threading

import numpy as np

__all__ = ["Arena", "TEMPORARIES"]


class Arena:
    """Per-thread, per-name buffers that grow to the largest size asked for."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _buffers(self) -> dict:
        d = getattr(self._local, "buffers", None)
        if d is None:
            d = self._local.buffers = {}
        return d

    def array(self, name, shape, dtype) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        buffers = self._buffers()
        held = buffers.get(name)
        if held is None or held[1] < nbytes:
            # Aligned to 64 bytes for the SIMD loops; the few spare bytes are free.
            raw = np.empty(nbytes + 64, np.uint8)
            start = (-raw.__array_interface__["data"][0]) % 64
            held = buffers[name] = (raw[start:], nbytes)
        return held[0][:nbytes].view(dtype).reshape(shape)

    def owns(self, a) -> bool:
        """True if ``a`` is (a view of) one of this thread's buffers."""
        buffers = self._buffers()
        if not buffers or not isinstance(a, np.ndarray):
            return False
        bases = {id(held[0].base) for held in buffers.values()}
        while isinstance(a, np.ndarray):
            if id(a) in bases:
                return True
            a = a.base
        return False

    def release(self) -> None:
        """Drop this thread's buffers (the memory goes back when no view is left)."""
        self._buffers().clear()


#: Temporaries shared by every kernel: a kernel runs to completion before the
#: next one starts on the same thread, so one buffer per name suffices.
TEMPORARIES = Arena()
