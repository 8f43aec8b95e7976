"""Writing a file so that readers see the old content or the new, never a mix.

:func:`atomic_write` is the one way coralrt replaces a file on disk (compile
cache entries, the model digest index, the installed firmware, a stick
lock's pid file, ``coralrt compile`` output; :func:`atomic_write_with` the
archives of ``coralrt cache export``).

How it works, and what it guarantees:

1. A new temporary file is created in the target's own directory (so the
   final rename never crosses file systems) under an unpredictable name,
   ``.<target name>.<16 random hex digits>.tmp``, with
   ``O_CREAT | O_EXCL`` (plus ``O_NOFOLLOW`` where the platform has it):
   the call fails rather than open anything that already exists at that
   name, including a symlink planted there (an exclusive create never
   follows a symlink).  These are the flags :func:`tempfile.mkstemp` uses;
   the file is created here with ``os.open`` directly so that its
   permission bits are ``mode`` reduced by the process umask, exactly as
   ``open()`` would give.
2. Every byte is written (short writes are continued), then the file is
   flushed to stable storage with :func:`os.fsync` and closed.
3. :func:`os.replace` renames it onto the target, atomically on POSIX and on
   Windows.  A symlink *at* the target path is itself replaced by the new
   regular file; the file the symlink pointed to is not written through
   and stays untouched.
4. The directory is fsynced afterwards so that the rename itself survives a
   crash.  This is best effort: platforms that cannot open or fsync a
   directory (Windows) skip it silently; the new content is in place either
   way.

If anything fails before the rename (including ``KeyboardInterrupt``), the
temporary file is removed and the exception is re-raised unchanged; the
target is then untouched.  The target's directory must already exist.
Concurrent writers of one target each use their own temporary file, so the
target ends up holding one writer's complete content.
"""

from __future__ import annotations

import os
import secrets

__all__ = ["atomic_write", "atomic_write_with", "is_temporary"]

# O_CREAT|O_EXCL fails on anything already at the name, a symlink included
# (POSIX); O_NOFOLLOW is tempfile.mkstemp's belt and braces on top of that.
_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
          | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
          | getattr(os, "O_NOINHERIT", 0))
_ATTEMPTS = 100
_NAME_PART = 100  # keeps the temporary name within NAME_MAX for long target names


def _create_temp(directory: str, name: str, mode: int) -> tuple[int, str]:
    for _ in range(_ATTEMPTS):
        tmp = os.path.join(directory, f".{name[:_NAME_PART]}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(tmp, _FLAGS, mode), tmp
        except FileExistsError:
            continue  # 64 random bits taken already: draw again
    raise FileExistsError(f"no free temporary file name next to {os.path.join(directory, name)}")


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, data: bytes | bytearray | memoryview | str, *,
                 mode: int = 0o666, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``data`` atomically and durably (see the module docstring).

    ``data`` is bytes, or ``str`` encoded with ``encoding`` (no newline
    translation); an encoding error is raised before any file is created.
    ``mode`` is the new file's permission bits before the umask is applied:
    the default ``0o666`` gives what ``Path.write_bytes`` gives, ``0o600`` a
    file only its owner can read.  Raises OSError (the temporary file
    removed, the target untouched) if the file cannot be written.
    """
    if isinstance(data, str):
        data = data.encode(encoding)
    view = memoryview(data).cast("B")

    def fill(fd: int) -> None:
        nonlocal view
        try:
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    _replace(path, fill, mode)


def atomic_write_with(path: str | os.PathLike, write, *, mode: int = 0o666) -> None:
    """Replace ``path`` atomically and durably with what ``write(f)`` writes to the
    binary file object ``f`` (content too large to hold in memory at once, such
    as an archive written entry by entry); otherwise as :func:`atomic_write`."""
    def fill(fd: int) -> None:
        with os.fdopen(fd, "wb") as f:   # closes fd, also when write() raises
            write(f)
            f.flush()
            os.fsync(f.fileno())

    _replace(path, fill, mode)


def _replace(path, fill, mode: int) -> None:
    """A temporary file next to ``path``, ``fill(fd)`` (which writes, fsyncs and
    closes it), the rename, the folder's fsync; the temporary removed on failure."""
    target = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(target))
    fd, tmp = _create_temp(directory, name, mode)
    try:
        fill(fd)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def is_temporary(name: str) -> bool:
    """Whether a file name looks like one of :func:`atomic_write`'s temporary files
    (left behind only by a crash, e.g. a power loss, between create and rename)."""
    return name.startswith(".") and name.endswith(".tmp")
