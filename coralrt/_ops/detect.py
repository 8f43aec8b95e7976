"""Detection post-processing: the SSD custom operator TFLite_Detection_PostProcess
(NumPy backend only)."""

from __future__ import annotations

from coralrt._ops.spec import OpSpec

SPECS = (
    OpSpec("TFLite_Detection_PostProcess", custom=True,
           numpy_any="coralrt._backends.numpy_detect:detection_postprocess"),
)
