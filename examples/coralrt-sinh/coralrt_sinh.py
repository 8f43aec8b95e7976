"""An example coralrt plugin: gives the CPU a kernel for the custom operator Sinh.

Install it (``pip install examples/coralrt-sinh``) and any model using the
custom op ``Sinh`` runs with ``InferenceSession`` without further code.
"""

import numpy as np

import coralrt


def sinh(inputs, op):
    """inputs: one float32 array; op: the operator's options and tensor infos."""
    (x,) = inputs
    return [np.sinh(x).astype(op.outputs[0].dtype)]


@coralrt.hookimpl
def coralrt_register_ops(registry):
    registry.add_kernel("Sinh", sinh)
