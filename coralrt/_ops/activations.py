"""Unary operators: the RELU family, LOGISTIC, TANH, HARD_SWISH, GELU, ABS, NEG,
LEAKY_RELU, SQRT, RSQRT, SOFTMAX, L2_NORMALIZATION, and the type changes
QUANTIZE, DEQUANTIZE, CAST; LOG and LOG_SOFTMAX (validation only)."""

from __future__ import annotations

from coralrt._model import quant_checks, xnnpack_checks
from coralrt._ops.checks import (
    gelu_refusal, innermost_three, int8_only, requantize_only, softmax_vector, static_shapes,
)
from coralrt._ops.spec import OpSpec, OpSupport

_SIM = "coralrt._sim.kernels.activations:"
_HOST = "coralrt._sim.kernels.host_only:"
_FLOAT = "coralrt._backends.numpy_kernels:"


SPECS = (
    OpSpec("RELU", tpu=OpSupport(3), sim=_SIM + "relu", numpy_float=_FLOAT + "relu"),
    OpSpec("RELU6", tpu=OpSupport(3), sim=_SIM + "relu", numpy_float=_FLOAT + "relu6"),
    OpSpec("RELU_N1_TO_1", tpu=OpSupport(3), sim=_SIM + "relu",
           numpy_float=_FLOAT + "relu_n1_to_1"),
    OpSpec("RELU_0_TO_1", sim=_SIM + "relu"),
    OpSpec("LOGISTIC", tpu=OpSupport(3), sim=_SIM + "logistic",
           numpy_float=_FLOAT + "logistic"),
    OpSpec("TANH", tpu=OpSupport(3), sim=_SIM + "tanh", numpy_float=_FLOAT + "tanh"),
    OpSpec("HARD_SWISH", tpu=OpSupport(3), sim=_SIM + "hard_swish"),
    OpSpec("L2_NORMALIZATION", tpu=OpSupport(3), sim=_SIM + "l2_normalization"),
    OpSpec("RSQRT", tpu=OpSupport(3, (int8_only,)), sim=_SIM + "rsqrt"),
    OpSpec("SOFTMAX", tpu=OpSupport(3, (softmax_vector,)), sim=_SIM + "softmax",
           numpy_float=_FLOAT + "softmax", quant_check=quant_checks.softmax),
    OpSpec("QUANTIZE", tpu=OpSupport(3, (requantize_only,),
                                     generic=(static_shapes, innermost_three)),
           sim=_SIM + "quantize", numpy_float=_FLOAT + "quantize",
           quant_check=xnnpack_checks.quantize),
    OpSpec("DEQUANTIZE", numpy_float=_FLOAT + "dequantize", numpy_any=_FLOAT + "dequantize"),
    OpSpec("GELU", tpu_refusal=gelu_refusal, numpy_float=_FLOAT + "gelu",
           numpy_8bit=_HOST + "gelu_8bit"),
    OpSpec("ABS", numpy_float=_FLOAT + "abs_", numpy_8bit=_HOST + "abs_int8"),
    OpSpec("LEAKY_RELU", numpy_float=_FLOAT + "leaky_relu",
           numpy_8bit=_HOST + "leaky_relu_8bit"),
    OpSpec("NEG", numpy_float=_FLOAT + "neg"),
    OpSpec("SQRT", numpy_float=_FLOAT + "sqrt",
           quant_check=quant_checks.int16_needs_quantization),
    OpSpec("CAST", numpy_any="coralrt._backends.numpy_index:cast"),
    OpSpec("LOG", quant_check=quant_checks.int16_needs_quantization),
    OpSpec("LOG_SOFTMAX", quant_check=quant_checks.log_softmax),
)
