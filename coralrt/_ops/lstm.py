"""Recurrent operators: UNIDIRECTIONAL_SEQUENCE_LSTM (the Edge TPU's and the
simulator's); LSTM and the bidirectional ones are validated only
(coralrt/_ops/litert.py)."""

from __future__ import annotations

import math

from coralrt._ops.checks import constant_operands, innermost_three, lstm_types, static_shapes
from coralrt._ops.spec import OpSpec, OpSupport


def _lstm_macs(options, inputs, outputs):
    w = inputs[1][0] if len(inputs) > 1 and inputs[1] is not None else None
    if w is None or len(w) != 2 or not outputs:
        return None
    return math.prod(outputs[0][:-1]) * 4 * w[0] * (w[1] + w[0])


SPECS = (
    OpSpec("UNIDIRECTIONAL_SEQUENCE_LSTM",
           tpu=OpSupport(4, (constant_operands(*range(1, 12)),),
                         activations=frozenset({"NONE", "RELU", "RELU6", "TANH", "SIGN_BIT"}),
                         generic=(static_shapes, innermost_three, lstm_types)),
           macs=_lstm_macs, sim="coralrt._sim.kernels.lstm:unidirectional_sequence_lstm"),
)
