"""Control flow: the operators that run other subgraphs of the model (WHILE,
IF, CALL, CALL_ONCE and StableHLO's WHILE, CASE and COMPOSITE).  coralrt has no
kernel or rule for them; the NumPy backend, which runs subgraph 0 only,
refuses them by this flag."""

from __future__ import annotations

from coralrt._ops.spec import OpSpec

SPECS = tuple(OpSpec(name, calls_subgraphs=True) for name in (
    "WHILE", "IF", "CALL", "CALL_ONCE", "STABLEHLO_WHILE", "STABLEHLO_CASE",
    "STABLEHLO_COMPOSITE"))
