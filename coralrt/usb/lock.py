"""An exclusive lock per stick, shared by every process of the user.

The lock is a :class:`filelock.FileLock` on a file named after the stick's
port path in the user's runtime directory (:func:`coralrt.config.runtime_dir`:
``CORALRT_RUNTIME_DIR``, else ``platformdirs.user_runtime_dir``, else the
temporary directory).  It is taken without waiting: a second
process that opens the same stick gets :class:`~coralrt.errors.DeviceBusyError`
naming the process that holds it (its pid is written next to the lock), and
the holder keeps working undisturbed.  The operating system drops the lock
when the holder exits, even if it crashes.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import filelock

from coralrt import config
from coralrt.errors import DeviceBusyError
from coralrt.fileio import atomic_write

__all__ = ["DeviceLock", "lock_dir"]

log = logging.getLogger("coralrt.usb")


def lock_dir() -> Path:
    """Where the lock files live, created: :func:`coralrt.config.runtime_dir`
    (``CORALRT_RUNTIME_DIR`` overrides it), else :func:`coralrt.config.temp_runtime_dir`
    when that cannot be created."""
    path = config.runtime_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        path = config.temp_runtime_dir()
        path.mkdir(parents=True, exist_ok=True)
    return path


def _key(port: str) -> str:
    return "usb-" + (re.sub(r"[^A-Za-z0-9.-]+", "_", port.rsplit("/", 1)[-1]) or "unknown")


class DeviceLock:
    """``acquire()`` or raise DeviceBusyError at once; ``release()``; context manager."""

    def __init__(self, port: str, *, path_name: str | None = None):
        directory, key = lock_dir(), _key(port)
        self.port = port
        self.device = path_name or port
        self.lock_path = directory / f"{key}.lock"
        self.pid_path = directory / f"{key}.pid"
        self._lock = filelock.FileLock(str(self.lock_path), timeout=0, thread_local=False)

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def holder(self) -> int | None:
        try:
            return int(self.pid_path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def acquire(self) -> None:
        try:
            self._lock.acquire(timeout=0)
        except filelock.Timeout:
            pid = self.holder()
            who = f"process {pid}" if pid else "another process"
            raise DeviceBusyError(
                f"{self.device}: the stick is in use by {who} (lock {self.lock_path}); "
                f"close it there first, or use another stick", path=self.device,
                holder_pid=pid) from None
        atomic_write(self.pid_path, f"{os.getpid()}\n")
        log.debug("%s: lock %s taken by pid %d", self.device, self.lock_path, os.getpid())

    def release(self) -> None:
        if not self._lock.is_locked:
            return
        try:
            if self.holder() == os.getpid():
                self.pid_path.unlink()
        except OSError:
            pass
        self._lock.release(force=True)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
