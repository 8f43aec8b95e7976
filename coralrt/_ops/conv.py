"""Convolutions and matrix products: CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV,
FULLY_CONNECTED, BATCH_MATMUL."""

from __future__ import annotations

import math

from coralrt._model import quant_checks, xnnpack_checks
from coralrt._ops.checks import (
    batch_matmul_refusal, constant_operands, fc_default_weights, same_dilation,
)
from coralrt._ops.spec import OpSpec, OpSupport
from coralrt._ops.width import layer_width

_SIM = "coralrt._sim.kernels.conv:"


def _weights(inputs: list, rank: int):
    """Input 1's shape when it is given and has ``rank`` dimensions, else None."""
    w = inputs[1][0] if len(inputs) > 1 and inputs[1] is not None else None
    return w if w is not None and len(w) == rank else None


def _conv_macs(options, inputs, outputs):
    w = _weights(inputs, 4)
    return None if w is None else sum(math.prod(s) for s in outputs) * w[1] * w[2] * w[3]


def _depthwise_macs(options, inputs, outputs):
    w = _weights(inputs, 4)
    return None if w is None else sum(math.prod(s) for s in outputs) * w[1] * w[2]


def _transpose_conv_macs(options, inputs, outputs):
    w = _weights(inputs, 4)
    if w is None or inputs[2] is None:
        return None
    return math.prod(inputs[2][0]) * w[0] * w[1] * w[2]


def _fc_macs(options, inputs, outputs):
    w = _weights(inputs, 2)
    return None if w is None else sum(math.prod(s) for s in outputs) * w[1]


SPECS = (
    # CONV_2D maps with a different dilation in x and y: Coral's operator table
    # asks for the same, but edgetpu_compiler 16.0 maps such convolutions
    # (docs/partitioning.md).  DEPTHWISE_CONV_2D keeps the table's rule: no
    # compiled model has shown the compiler mapping it otherwise.
    OpSpec("CONV_2D", tpu=OpSupport(5, (constant_operands(1, 2), layer_width)),
           macs=_conv_macs, latency_class="conv", sim=_SIM + "conv_2d",
           quant_check=quant_checks.convolution_quantization),
    OpSpec("DEPTHWISE_CONV_2D", tpu=OpSupport(6, (constant_operands(1, 2), same_dilation)),
           macs=_depthwise_macs, latency_class="depthwise", sim=_SIM + "depthwise_conv_2d",
           quant_check=quant_checks.convolution_quantization),
    OpSpec("TRANSPOSE_CONV", tpu=OpSupport(3, (constant_operands(0, 1, 3),)),
           macs=_transpose_conv_macs, latency_class="conv", sim=_SIM + "transpose_conv",
           quant_check=quant_checks.convolution_multiplier),
    OpSpec("FULLY_CONNECTED",
           tpu=OpSupport(9, (constant_operands(1, 2), fc_default_weights, layer_width)),
           macs=_fc_macs, latency_class="conv", sim=_SIM + "fully_connected",
           numpy_float="coralrt._backends.numpy_kernels:fully_connected",
           quant_check=quant_checks.convolution_multiplier),
    OpSpec("BATCH_MATMUL", tpu_refusal=batch_matmul_refusal,
           numpy_any="coralrt._backends.numpy_matmul:batch_matmul",
           quant_check=xnnpack_checks.batch_matmul),
)
