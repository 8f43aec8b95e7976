"""``coralrt selftest``: checks a Coral USB Accelerator end to end.

:func:`run_selftest` runs the sequence (:mod:`coralrt.selftest.runner`) and
returns a :class:`Report` of :class:`Check` results (ok / fail / skipped,
with the reason and measurements).  The test models are pinned by SHA-256
(:mod:`coralrt.selftest.models`) and run by :mod:`coralrt.selftest.programs`;
libedgetpu, the yardstick, is only ever
loaded in child processes (:mod:`coralrt.selftest.libedgetpu`).  See
docs/hardware-validation.md.
"""

from __future__ import annotations

from coralrt.selftest.checks import CHIP_REASON, Check
from coralrt.selftest.report import REPORT_KEYS, Report
from coralrt.selftest.runner import NO_STICK, run_selftest

__all__ = ["run_selftest", "Report", "Check", "CHIP_REASON", "NO_STICK", "REPORT_KEYS"]
