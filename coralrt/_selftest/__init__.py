"""``coralrt selftest``: checks a Coral USB Accelerator end to end.

:func:`run_selftest` runs the sequence (:mod:`coralrt._selftest.runner`) and
returns a :class:`Report` of :class:`Check` results (ok / fail / skipped,
with the reason and measurements).  The test models are pinned by SHA-256
(:mod:`coralrt._selftest.models`) and run by :mod:`coralrt._selftest.programs`;
libedgetpu, the yardstick, is only ever
loaded in child processes (:mod:`coralrt._selftest.libedgetpu`).  See
docs/hardware-validation.md.
"""

from __future__ import annotations

from coralrt._selftest.checks import CHIP_REASON, Check
from coralrt._selftest.report import REPORT_KEYS, Report
from coralrt._selftest.runner import NO_STICK, run_selftest

__all__ = ["run_selftest", "Report", "Check", "CHIP_REASON", "NO_STICK", "REPORT_KEYS"]
