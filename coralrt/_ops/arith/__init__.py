"""The numeric helpers kernels share, below the operator specs so that a family
file of :mod:`coralrt._ops` can write a kernel with them.

- :mod:`~coralrt._ops.arith.fixedpoint`: TFLite's and gemmlowp's fixed-point
  integer arithmetic (``QuantizeMultiplier``, ``MultiplyByQuantizedMultiplier``,
  rounding shifts, lookup-table helpers), vectorised;
- :mod:`~coralrt._ops.arith.int16_fixedpoint`: gemmlowp's int16 logistic and tanh;
- :mod:`~coralrt._ops.arith.requant`: the fast exact requantizer of the
  convolution-like kernels (its proofs in :mod:`~coralrt._ops.arith.requant_plan`);
- :mod:`~coralrt._ops.arith.scratch`: per-thread working arrays reused across runs;
- :mod:`~coralrt._ops.arith.parallel`: row bands on a thread pool, and the BLAS
  thread limit;
- :mod:`~coralrt._ops.arith.common`: ``refuse``, ``codes``, TFLite's padding and
  output sizes.

(The quantized range of a fused activation is :func:`coralrt._ops.fused.activation_range`.)

Layering: below the specs (``tests/test_layers.py``): these modules
import nothing of coralrt but :mod:`coralrt.errors`.  A kernel factory receives
a ``coralrt._sim.kernels.OpContext`` (a higher layer); a helper here that takes one
names it in a string annotation and does not import it.
"""
