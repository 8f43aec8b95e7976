"""Reductions: MEAN, SUM, REDUCE_MAX, REDUCE_MIN, ARG_MAX, ARG_MIN."""

from __future__ import annotations

from coralrt._ops.checks import mean_depth_multiple_of_4, not_on_batch
from coralrt._ops.spec import OpSpec, OpSupport

_SIM = "coralrt._sim.kernels.reduce:"
_ARG = "coralrt._backends.numpy_index:arg_extreme"

SPECS = (
    OpSpec("MEAN", tpu=OpSupport(3, (not_on_batch(axis_input=1), mean_depth_multiple_of_4)),
           sim=_SIM + "mean_or_sum", numpy_float="coralrt._backends.numpy_kernels:mean"),
    OpSpec("SUM", tpu=OpSupport(3, (not_on_batch(axis_input=1),)), sim=_SIM + "mean_or_sum"),
    OpSpec("REDUCE_MAX", tpu=OpSupport(3, (not_on_batch(axis_input=1),)),
           sim=_SIM + "reduce_max_min"),
    OpSpec("REDUCE_MIN", tpu=OpSupport(3, (not_on_batch(axis_input=1),)),
           sim=_SIM + "reduce_max_min"),
    OpSpec("ARG_MAX", numpy_any=_ARG),
    OpSpec("ARG_MIN", numpy_any=_ARG),
)
