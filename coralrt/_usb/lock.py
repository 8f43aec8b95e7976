"""An exclusive lock per stick, shared by every process of the user.

The lock is a :class:`filelock.FileLock` on a file named after the stick's
port path in the user's runtime directory (:func:`coralrt._config.runtime_dir`:
``CORALRT_RUNTIME_DIR``, else ``platformdirs.user_runtime_dir``, else the
temporary directory).  It is taken without waiting: a second
process that opens the same stick gets :class:`~coralrt.errors.DeviceBusyError`
naming the process that holds it (its pid is written next to the lock), and
the holder keeps working undisturbed.  The operating system drops the lock
when the holder exits, even if it crashes.

The directory must be the user's alone: whoever can write to it can fake a
holder (every open then fails with their pid) or swap the lock files.  So
:func:`lock_dir` creates it, and the parents it has to create, with mode 0700,
and refuses (:class:`~coralrt.errors.DevicePermissionError`) a directory that
is a symbolic link (checked with ``lstat``, never followed), is not owned by
the user, or is writable by group or others, and one whose parent another
user could replace it in (not owned by the user or root, or writable by
others without the sticky bit).  A directory named by ``CORALRT_RUNTIME_DIR``
is held to the same rule.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

import filelock

from coralrt import _config as config
from coralrt.errors import DeviceBusyError, DeviceError, DevicePermissionError
from coralrt._fileio import atomic_write

__all__ = ["DeviceLock", "lock_dir"]

log = logging.getLogger("coralrt.usb")


def lock_dir() -> Path:
    """Where the lock files live, created with mode 0700 and checked:
    :func:`coralrt._config.runtime_dir` (``CORALRT_RUNTIME_DIR`` overrides it), else
    :func:`coralrt._config.temp_runtime_dir` when that cannot be created.

    Raises DevicePermissionError when the directory is not safe (see the module
    docstring), naming it, its owner and mode, and what to do.
    """
    path = config.runtime_dir()
    named = bool(os.environ.get(config.RUNTIME_DIR, "").strip())
    try:
        _make_private(path)
    except OSError as e:    # read-only, a file in the way, no permission ...
        fallback = config.temp_runtime_dir()
        log.debug("lock directory %s cannot be created (%s); using %s", path, e, fallback)
        path, named = fallback, False
        try:
            _make_private(path)
        except OSError as e2:
            raise DeviceError(f"cannot create the lock directory {path} ({e2.strerror or e2}); "
                              f"set {config.RUNTIME_DIR} to a directory you own",
                              errno=e2.errno) from e2
    _check_private(path, named=named)
    return path


def _make_private(path: Path) -> None:
    """Create ``path`` and its missing parents with mode 0700 (the umask can only take
    bits away).  What exists already, a symbolic link included, is left as it is."""
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o700)
        except FileExistsError:     # made by someone else meanwhile: checked below
            pass


def _owner(uid: int) -> str:
    try:
        import pwd
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


_GROUP_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _check_private(path: Path, *, named: bool = False) -> None:
    """Raise DevicePermissionError unless ``path`` is a directory, not a symbolic link,
    owned by this user, not writable by group or others, in a parent no other user
    can replace it in (``named``: ``path`` comes from ``CORALRT_RUNTIME_DIR``)."""
    if not hasattr(os, "getuid"):   # no POSIX owners (Windows): per-user folders
        return
    uid = os.getuid()
    try:
        st = os.lstat(path)
    except OSError as e:
        raise DeviceError(f"cannot use the lock directory {path} ({e.strerror or e}); set "
                          f"{config.RUNTIME_DIR} to a directory you own", errno=e.errno) from e
    mode = stat.S_IMODE(st.st_mode)
    where = f"the lock directory {path} (owner {_owner(st.st_uid)}, mode {mode:04o})"
    anywhere = (f"{'point' if named else 'set'} {config.RUNTIME_DIR} "
                f"{'at' if named else 'to'} a directory you own that only you can write to "
                f"(mkdir -m 700 DIR)")
    if stat.S_ISLNK(st.st_mode):
        problem = f"is a symbolic link (to {os.readlink(path)}), which coralrt does not follow"
        fix = f"remove the link (rm {path}) or {anywhere}"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
        fix = f"remove it or {anywhere}"
    elif st.st_uid != uid:
        problem = f"belongs to another user, not to you ({_owner(uid)})"
        fix = f"remove it (as its owner or root: rm -r {path}) or {anywhere}"
    elif mode & _GROUP_OTHER_WRITE:
        problem = "is writable by other users"
        fix = f"make it yours alone (chmod 700 {path}), remove it, or {anywhere}"
    else:
        parent = path.parent
        pst = os.stat(parent)       # the directory that really holds it
        pmode = stat.S_IMODE(pst.st_mode)
        if pst.st_uid not in (uid, 0) or (pmode & _GROUP_OTHER_WRITE
                                          and not pmode & stat.S_ISVTX):
            problem = (f"is inside {parent} (owner {_owner(pst.st_uid)}, mode {pmode:04o}), "
                       f"where another user can replace it")
            fix = anywhere
        else:
            return
    raise DevicePermissionError(
        f"{where} {problem}: another user could fake or break the per-stick locks there, "
        f"so coralrt will not use it; {fix}", path=str(path))


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
