"""Binary elementwise operators: ADD, SUB, MUL, DIV, FLOOR_DIV, MAXIMUM, MINIMUM,
SQUARED_DIFFERENCE, PRELU, POW, and the comparisons (EQUAL, NOT_EQUAL, LESS,
LESS_EQUAL, GREATER, GREATER_EQUAL: validation only)."""

from __future__ import annotations

from coralrt._model import quant_checks
from coralrt._ops.checks import int8_only, prelu_alpha
from coralrt._ops.spec import OpSpec, OpSupport

_SIM = "coralrt._sim.kernels.elementwise:"
_FLOAT = "coralrt._backends.numpy_kernels:"
_INT = "coralrt._backends.numpy_index:"

SPECS = (
    OpSpec("ADD", tpu=OpSupport(4), sim=_SIM + "add_sub", numpy_float=_FLOAT + "add",
           numpy_wide_int=_INT + "add_int", output_takes_input_type=True, gelu_path=True,
           quant_check=quant_checks.add, padded_rank_aborts=("INT32",)),
    OpSpec("SUB", tpu=OpSupport(4), sim=_SIM + "add_sub", numpy_float=_FLOAT + "sub",
           numpy_wide_int=_INT + "sub_int", output_takes_input_type=True, gelu_path=True,
           quant_check=quant_checks.sub, padded_rank_aborts=("FLOAT32", "INT32")),
    OpSpec("MUL", tpu=OpSupport(4), sim=_SIM + "mul", numpy_float=_FLOAT + "mul",
           numpy_wide_int=_INT + "mul_int", gelu_path=True, padded_rank_aborts=()),
    OpSpec("MAXIMUM", tpu=OpSupport(4), sim=_SIM + "maximum_minimum"),
    OpSpec("MINIMUM", tpu=OpSupport(4), sim=_SIM + "maximum_minimum"),
    # TFLite implements SQUARED_DIFFERENCE (and RSQRT) for int8 only.
    OpSpec("SQUARED_DIFFERENCE", tpu=OpSupport(2, (int8_only,)),
           sim=_SIM + "squared_difference", quant_check=quant_checks.squared_difference),
    OpSpec("PRELU", tpu=OpSupport(2, (prelu_alpha,)), sim=_SIM + "prelu"),
    OpSpec("DIV", numpy_float=_FLOAT + "div", padded_rank_aborts=("FLOAT32", "INT32")),
    OpSpec("FLOOR_DIV", numpy_any=_INT + "floor_div"),
    # No kernel: in the tanh form of GELU (x + 0.044715 x^3) converters may write.
    OpSpec("POW", gelu_path=True),
    *(OpSpec(name, quant_check=quant_checks.comparison) for name in (
        "EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL")),
)
