"""Run a coralrt segment with the simulated Edge TPU's integer kernels.

``SegmentRunner(segment)`` prepares every operator's kernel once (the
parameter upload); ``run(inputs)`` walks the operators in order.  It is the
compute core of the simulated device and of the kernel tests.
"""

from __future__ import annotations

import numpy as np

from coralrt._formats.segment import Segment
from coralrt.errors import UnsupportedOperatorError
from coralrt._model.types import numpy_dtype
from coralrt._ops.arith.parallel import blas_single_threaded
from coralrt._ops.arith.scratch import TEMPORARIES
from coralrt._sim.kernels import OpContext, kernel_for

__all__ = ["SegmentRunner"]


class SegmentRunner:
    def __init__(self, segment: Segment, extra: dict | None = None):
        """``extra``: kernel factories by operator name that plugins provide."""
        self.segment = segment
        t = segment.tensors
        self._steps = []
        for i, op in enumerate(segment.ops):
            factory = (extra or {}).get(op.name) or kernel_for(op.name)
            if factory is None:
                raise UnsupportedOperatorError(
                    op.name, where=f"segment operator {i}",
                    detail="the simulated Edge TPU has no kernel for it")
            ctx = OpContext(op, [t[k] if k >= 0 else None for k in op.inputs],
                            [t[k] for k in op.outputs], [t[k] for k in op.intermediates])
            self._steps.append((factory(ctx), op.inputs, op.outputs))
        self._constants = {x.id: x.data for x in t if x.kind == "parameter"}
        # State that persists across runs (LSTM).  TFLite resets variable
        # tensors to their zero point (8-bit) or to 0.
        self._state = {x.id: np.full(x.shape, _reset_value(x), numpy_dtype(x.dtype))
                       for x in t if x.variable}
        self._reset_values = {x.id: _reset_value(x) for x in t if x.variable}
        self._inputs = list(segment.inputs)
        self._outputs = list(segment.outputs)

    def reset(self) -> None:
        for k, v in self._state.items():
            v[...] = self._reset_values[k]

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        values = dict(self._constants)
        values.update(self._state)
        values.update(zip(self._inputs, inputs))
        with blas_single_threaded():
            for run, ins, outs in self._steps:
                results = run([values[k] if k >= 0 else None for k in ins])
                # A kernel's temporaries are reused by the next kernel and the next
                # run: a result living in one would change under its reader.  The
                # kernels allocate their outputs; this keeps a slip from becoming
                # a wrong answer.
                values.update((k, v.copy() if TEMPORARIES.owns(v) else v)
                              for k, v in zip(outs, results))
        return [values[k] for k in self._outputs]


def _reset_value(t) -> int:
    if numpy_dtype(t.dtype) in (np.dtype(np.int8), np.dtype(np.uint8)) and len(t.zero_points):
        return int(t.zero_points[0])
    return 0
