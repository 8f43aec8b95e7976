"""Run a model with LiteRT alone (no coralrt) in a child process: a native crash
shows as the child's exit status, not as the test process dying."""

from __future__ import annotations

import subprocess
import sys

_CHILD = r"""
import sys, numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType
kind = OpResolverType.BUILTIN_REF if sys.argv[2] == "reference" else OpResolverType.AUTO
it = Interpreter(model_path=sys.argv[1], experimental_op_resolver_type=kind, num_threads=1)
it.allocate_tensors()
for d in it.get_input_details():
    it.set_tensor(d["index"], np.ones(d["shape"], d["dtype"]))
it.invoke()
print("OK")
"""


def litert_outcome(path, kernels: str) -> str:
    """``"OK"``, or ``"died N: <end of stderr>"`` (an exception counts as dying too)."""
    r = subprocess.run([sys.executable, "-c", _CHILD, str(path), kernels],
                       capture_output=True, text=True, timeout=120)
    return "OK" if r.returncode == 0 else f"died {r.returncode}: {r.stderr[-300:]}"
