"""Pooling: AVERAGE_POOL_2D, MAX_POOL_2D."""

from __future__ import annotations

import math

from coralrt._ops.spec import NO_ACTIVATION, OpSpec, OpSupport


def _pool_macs(options, inputs, outputs):
    return (sum(math.prod(s) for s in outputs) * options.get("filter_width", 1)
            * options.get("filter_height", 1))


SPECS = (
    OpSpec("AVERAGE_POOL_2D", tpu=OpSupport(3, activations=NO_ACTIVATION), macs=_pool_macs,
           sim="coralrt._sim.kernels.pool:average_pool_2d"),
    OpSpec("MAX_POOL_2D", tpu=OpSupport(3, activations=NO_ACTIVATION), macs=_pool_macs,
           sim="coralrt._sim.kernels.pool:max_pool_2d"),
)
