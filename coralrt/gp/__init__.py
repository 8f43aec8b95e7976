"""General-purpose array computing on Edge TPUs (the GPTPU model).

Float arrays in, float64 arrays out; every operation is cut into tiles, each
tile computed by a small generated int8 TFLite model on an Edge TPU (simulated
by default), and the results put together on the CPU::

    from coralrt import gp
    with gp.Context(target="sim", devices=2) as ctx:
        c = ctx.matmul(a, b)
        f = ctx.submit("tanh", x)
        ctx.sync()

Modules: :mod:`~coralrt.gp._context` (Context, sessions, tasks),
:mod:`~coralrt.gp._tensorize` (tiling and assembly),
:mod:`~coralrt.gp._scaling` (quantization and the error model),
:mod:`~coralrt.gp._tile_models` (the generated models),
:mod:`~coralrt.gp._scheduler` (tile jobs over several sticks),
:mod:`~coralrt.gp._checks` (operand checks).
"""

from coralrt.gp._context import OPERATIONS, Context
from coralrt.gp._tile_models import estimate_gemm_forms
from coralrt.gp._scheduler import Scheduler

__all__ = ["Context", "OPERATIONS", "Scheduler", "estimate_gemm_forms"]
