"""TFLite's fused activations (``fused_activation_function``), written once.

:data:`FUSED_BOUNDS` maps an ``ActivationFunctionType`` code to the real-valued
clamp it applies (None: unbounded on that side).  Every kernel that honours a
fused activation reads it through :func:`fused_bounds`: the simulated Edge
TPU's quantized range (:func:`activation_range` below, TFLite's
``CalculateActivationRangeQuantized``), the NumPy backend's float clamp and
its int32/int64 clamp (``CalculateActivationRange``).

An unknown code (TANH, SIGN_BIT or anything else on an operator whose kernel
only clamps) is refused with a :class:`~coralrt.errors.ModelError`, as
TFLite's kernels refuse it in Prepare ("Unsupported fused activation"):
answering with the unclamped range would be a silent wrong answer.
"""

from __future__ import annotations

import numpy as np

from coralrt.errors import ModelError
from coralrt._ops.arith.fixedpoint import quantize_bound

__all__ = ["FUSED_BOUNDS", "fused_bounds", "activation_range"]

#: code -> (low, high) real bounds; None: no bound on that side.
FUSED_BOUNDS: dict[int, tuple[float | None, float | None]] = {
    0: (None, None),     # NONE
    1: (0.0, None),      # RELU
    2: (-1.0, 1.0),      # RELU_N1_TO_1
    3: (0.0, 6.0),       # RELU6
}


def fused_bounds(code: int, *, op_name: str,
                 message: str = "fused activation function {code} is not supported",
                 ) -> tuple[float | None, float | None]:
    """The bounds of fused activation ``code``; a ModelError naming ``op_name``
    (``message``, formatted with ``code``) when it has none."""
    bounds = FUSED_BOUNDS.get(code)
    if bounds is None:
        raise ModelError(message.format(code=code), where=f"{op_name} operator")
    return bounds


def activation_range(ctx: "OpContext", activation: int, scale: float, zero_point: int,
                     dtype: np.dtype) -> tuple[int, int]:
    """TFLite's CalculateActivationRangeQuantized for a quantized output: the
    bounds of :data:`FUSED_BOUNDS` in ``dtype``'s codes.  The one such function
    of the simulated Edge TPU (convolutions, pooling and the elementwise
    kernels); an unknown code is refused (ModelError), as TFLite refuses it,
    never answered with the unclamped range.  ``ctx`` is the kernel factory's
    ``coralrt._sim.kernels.OpContext`` (a layer above; not imported)."""
    lo_f, hi_f = fused_bounds(activation, op_name=ctx.op.name)
    info = np.iinfo(dtype)

    def quantize(f: float) -> int:              # zero_point + round(f / scale), in float
        return quantize_bound(f, scale, zero_point)

    lo = int(info.min) if lo_f is None else max(int(info.min), quantize(lo_f))
    hi = int(info.max) if hi_f is None else min(int(info.max), quantize(hi_f))
    return lo, hi
