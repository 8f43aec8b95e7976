"""Edge TPU operator-support rules, as data.

Every operator the Edge TPU can run has an :class:`OpSupport` entry: its
highest supported version, the fused activations it accepts and a tuple of
small named checks.  The entries are the ``tpu`` fields of the operator specs
(:mod:`coralrt._ops`); the checks, the :class:`OpView` they take and the
statuses their reasons start with live in :mod:`coralrt._ops.checks`
(re-exported here).  This module holds the registry that applies them.

Sources: the Edge TPU operation table and model requirements published by
Coral (coral.ai/docs/edgetpu/models-intro), and what edgetpu_compiler did on
the compiled model pairs in the test data (for example, dilated depthwise
convolutions map, a bilinear resize of a 1x1 input with align_corners does
not).  See docs/partitioning.md.

Plugins add rules with ``RuleRegistry.add_op`` / ``add_check``; nothing here
is an if-chain over operator names.
"""

from __future__ import annotations

from dataclasses import replace

from coralrt._model.types import ACTIVATIONS
from coralrt._ops import OpSupport, operator_table
from coralrt._ops.checks import (
    MAPPED, SECOND_SUBGRAPH, UNSPECIFIED_LIMITATION, UNSUPPORTED_OP, UNSUPPORTED_TYPE,
    UNSUPPORTED_VERSION, Check, OpView,
)
from coralrt._ops.spec import DEFAULT_ACTIVATIONS  # noqa: F401 - its old home

__all__ = [
    "UNSUPPORTED_OP", "UNSUPPORTED_TYPE", "UNSUPPORTED_VERSION", "UNSPECIFIED_LIMITATION",
    "SECOND_SUBGRAPH", "MAPPED", "OpView", "OpSupport", "RuleRegistry", "default_rules",
]

# Bump when a rule changes what maps, so cached compilations are redone
# (3: compat mode's rules, compile/compat_rules.py; 4: layer width limits),
# and when validation refuses more models: a cache hit skips validation, so a
# compilation cached before a new refusal would outlive it (5: output types
# against what the kernel writes, zero points in range, int32 accumulators;
# 6: CONV_2D with a different dilation in x and y maps).
RULES_VERSION = 6


# OpSupport (coralrt._ops.spec) and DEFAULT_ACTIVATIONS are re-exported: plugins
# build their rules with ``coralrt._compile.rules.OpSupport``.


class RuleRegistry:
    """Operator name -> :class:`OpSupport`; :meth:`check` applies them."""

    def __init__(self) -> None:
        self._ops: dict[str, OpSupport] = {}

    def add_op(self, name: str, support: OpSupport) -> None:
        self._ops[name] = support

    def add_check(self, name: str, check: Check) -> None:
        self._ops[name].checks = (*self._ops[name].checks, check)

    def copy(self) -> RuleRegistry:
        """An independent registry: adding to it leaves this one unchanged."""
        new = RuleRegistry()
        new._ops = {name: replace(s) for name, s in self._ops.items()}
        return new

    def __contains__(self, name: str) -> bool:
        return name in self._ops

    def support(self, name: str) -> OpSupport | None:
        """The rule of operator ``name`` (None: the Edge TPU has no such operator)."""
        return self._ops.get(name)

    def names(self) -> list[str]:
        return sorted(self._ops)

    def check(self, view: OpView) -> str | None:
        """None when the Edge TPU can run the operator, else the reason."""
        support = self._ops.get(view.name)
        if support is None:
            kind = "custom operator" if view.op.opcode.is_custom else "operator"
            detail = _refusals().get(view.name)
            more = f"; {detail(view)}" if detail is not None else ""
            return f"{UNSUPPORTED_OP}: the Edge TPU has no {view.name} {kind}{more}"
        if view.op.version > support.max_version:
            return (f"{UNSUPPORTED_VERSION}: {view.name} version {view.op.version} (the Edge "
                    f"TPU supports up to {support.max_version})")
        for check in support.generic:
            reason = check(view)
            if reason:
                return reason
        for k in range(len(view.op.inputs)):
            t = view.input(k)
            # Segments carry dense constants only (formats/segment.py); LiteRT
            # densifies sparse ones on the CPU.
            if t is not None and t.extra.get("sparsity"):
                return (f"{UNSPECIFIED_LIMITATION}: input {k} is a sparse tensor; "
                        f"Edge TPU segments take dense constants only")
            # A segment keeps its state tensors to itself; one the model also
            # returns must stay where the CPU backend can hand it out.
            if t is not None and t.is_variable and view.op.inputs[k] in view.sg.outputs:
                return (f"{UNSPECIFIED_LIMITATION}: input {k} is state the model also "
                        f"returns as an output; an Edge TPU segment keeps its state inside")
        act = view.options.get("fused_activation_function")
        if act is not None and ACTIVATIONS.get(act, str(act)) not in support.activations:
            return (f"{UNSPECIFIED_LIMITATION}: fused activation "
                    f"{ACTIVATIONS.get(act, act)} is not supported on {view.name}")
        for check in support.checks:
            reason = check(view)
            if reason:
                return reason
        return None


def _refusals() -> dict:
    """Operator name -> its spec's ``tpu_refusal`` (why it stays on the CPU)."""
    return operator_table("tpu_refusal")


def default_rules() -> RuleRegistry:
    """The Edge TPU's operator table: the ``tpu`` rule of every operator spec
    (fresh registry, safe to extend)."""
    r = RuleRegistry()
    for name, support in operator_table("tpu").items():
        r.add_op(name, replace(support))
    return r
