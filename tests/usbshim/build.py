"""Compiling the libusb shim: every ``*.c`` file of this folder, linked into one
``libusb-1.0.so.0``, cached by a hash of the sources (README.md: "Use")."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIBRARY = "libusb-1.0.so.0"


class ShimBuildError(RuntimeError):
    """The shim could not be compiled (no compiler, or the compiler failed)."""


def find_compiler() -> str | None:
    """The C compiler to use: ``$CC``, else ``cc``, ``gcc`` or ``clang`` on PATH."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name:
            path = shutil.which(name)
            if path:
                return path
    return None


def sources() -> list[Path]:
    """The shim's C files, compiled together into the one library."""
    return sorted(HERE.glob("*.c"))


def _source_hash(compiler: str) -> str:
    """The hash of the compiler's path and of every C file and header of the shim."""
    h = hashlib.sha256(compiler.encode())
    for path in sources() + sorted(HERE.glob("*.h")):
        h.update(path.name.encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def build_shim(dest_dir: str | os.PathLike | None = None) -> Path:
    """Compile the shim into ``dest_dir/libusb-1.0.so.0`` and return that path.

    Without ``dest_dir``: into a folder of the system's temporary directory named
    after the sources' hash, reused while the sources do not change (so a test
    session compiles once).  Raises :class:`ShimBuildError` naming what is missing
    when no C compiler is found, and with the compiler's messages when it fails.
    """
    cc = find_compiler()
    if cc is None:
        raise ShimBuildError(
            "cannot build the libusb shim: no C compiler found on PATH (looked for $CC, "
            "cc, gcc and clang); install one (Debian: apt-get install gcc)")
    digest = _source_hash(cc)
    if dest_dir is None:
        dest_dir = Path(tempfile.gettempdir()) / f"coralrt-usbshim-{os.getuid()}-{digest[:16]}"
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    out, stamp = dest / LIBRARY, dest / "sources.sha256"
    if out.is_file() and stamp.is_file() and stamp.read_text().strip() == digest:
        return out
    partial = dest / f".{LIBRARY}.{os.getpid()}.tmp"
    cmd = [cc, "-std=gnu11", "-shared", "-fPIC", "-O1", "-pthread", "-Wall",
           "-fvisibility=hidden", f"-Wl,-soname,{LIBRARY}", "-o", str(partial),
           *(str(path) for path in sources())]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ShimBuildError(f"cannot build the libusb shim: {' '.join(cmd)}: {e}") from e
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise ShimBuildError(f"cannot build the libusb shim: {' '.join(cmd)} exited with "
                             f"{done.returncode}:\n{done.stderr.strip()}")
    os.replace(partial, out)            # atomic: parallel test sessions may build too
    stamp.write_text(digest + "\n")
    return out
