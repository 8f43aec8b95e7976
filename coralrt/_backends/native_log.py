"""Keep the TFLite core's INFO chatter off the process's stderr.

The TFLite C++ core writes some messages straight to file descriptor 2, for
example ``INFO: Created TensorFlow Lite XNNPACK delegate for CPU.`` when the
first interpreter is prepared; no environment variable of LiteRT or
tflite-runtime silences it.  :func:`native_info_to_log` points descriptor 2
at a temporary file while the native code runs, then sends the ``INFO:``
lines to coralrt's log at DEBUG and writes every other line (warnings,
errors, anything another thread printed meanwhile) back to the real stderr,
in order.  One lock serialises the swaps, so concurrent loads cannot leave
descriptor 2 pointing at a temporary file.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["native_info_to_log"]

log = logging.getLogger("coralrt.backends")

_FD = 2
_lock = threading.Lock()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


@contextmanager
def native_info_to_log() -> Iterator[None]:
    with _lock:
        try:
            saved = os.dup(_FD)
        except OSError:  # no descriptor 2 (a daemon): nothing to filter
            yield
            return
        capture = tempfile.TemporaryFile()
        _flush()
        os.dup2(capture.fileno(), _FD)
        try:
            yield
        finally:
            _flush()
            os.dup2(saved, _FD)
            os.close(saved)
            capture.seek(0)
            text = capture.read()
            capture.close()
            for line in text.splitlines(keepends=True):
                if line.startswith(b"INFO: "):
                    log.debug("native: %s", line.decode(errors="replace").rstrip())
                else:
                    os.write(_FD, line)
