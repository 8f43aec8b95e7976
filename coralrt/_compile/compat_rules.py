"""Compat-mode rules: what edgetpu_compiler does beyond the published operator table.

:func:`compat_rules` extends a :class:`~coralrt._compile.rules.RuleRegistry`
with behaviour observed on plain/compiled model pairs (``docs/partitioning.md``
lists each rule with the pairs that support it).  Only compat mode applies
them: multi mode compiles for coralrt's simulated Edge TPU, whose kernels and
precision differ from the real compiler's choices, so these observations are
not rules of its own.

The rules are the operator specs' ``compat`` (an operator the table lacks)
and ``compat_checks`` (checks added to the table's rule) fields
(:mod:`coralrt._ops`): TILE (``coralrt/_ops/shape.py``; the image-pooling
branch of DeepLab with a MobileNet EdgeTPU backbone tiles a 1x1 feature map
to 33x33 on the Edge TPU) and the resize extent limit
(``coralrt/_ops/resize.py``).
"""

from __future__ import annotations

from dataclasses import replace

from coralrt._compile.rules import OpSupport, RuleRegistry
from coralrt._ops import operator_table
from coralrt._ops.resize import RESIZE_OUTPUT_EXTENT_LIMIT, resize_output_extent

__all__ = ["RESIZE_OUTPUT_EXTENT_LIMIT", "COMPAT_OPS", "COMPAT_CHECKS", "compat_rules",
           "resize_output_extent"]

#: Operators edgetpu_compiler maps that the published table does not list.
COMPAT_OPS: dict[str, OpSupport] = operator_table("compat")
#: Checks compat mode adds to operators the table already has.
COMPAT_CHECKS: dict[str, tuple] = operator_table("compat_checks")


def compat_rules(base: RuleRegistry) -> RuleRegistry:
    """A copy of ``base`` with the compat-mode operators and checks.

    An operator of :data:`COMPAT_OPS` that ``base`` already has (from a
    plugin) keeps that rule; the checks are added to whatever rule ``base``
    has for their operator.
    """
    rules = base.copy()
    for name, support in COMPAT_OPS.items():
        if name not in rules:
            rules.add_op(name, replace(support))
    for name, checks in COMPAT_CHECKS.items():
        if name in rules:
            for check in checks:
                rules.add_check(name, check)
    return rules
