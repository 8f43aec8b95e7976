"""Logging helpers shared by the command line and the pycoral layer."""

from __future__ import annotations

import logging
import sys

__all__ = ["StderrHandler"]


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (tests and
    programs that swap ``sys.stderr`` see the records)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass
