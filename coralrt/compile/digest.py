"""SHA-256 of model files, remembered across processes.

A cache-hit session should not pay for hashing a multi-megabyte model on
every load.  For a model given as a path, the digest is stored next to the
compile cache, keyed by the file's real path, together with its size, inode,
device, mtime and ctime (nanoseconds).  Any change to the file changes its
ctime, so a stored digest is only reused while the file is untouched; the
same test git uses for its index.  Bytes given directly are always hashed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from coralrt.fileio import atomic_write
from coralrt.model import read_bytes

__all__ = ["model_digest"]

log = logging.getLogger("coralrt.cache")


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns]


def model_digest(source, index_dir: Path | None) -> tuple[str, bytes | None]:
    """(sha256 hex digest, the bytes if they had to be read) of a path or bytes."""
    if not isinstance(source, (str, os.PathLike)):
        data = bytes(source)
        return hashlib.sha256(data).hexdigest(), data
    path = Path(source)
    try:
        real = path.resolve()
        st = real.stat()
    except OSError:
        return _hash_file(path)  # load_model will report the problem
    record = None
    if index_dir is not None:
        name = hashlib.sha256(os.fsencode(real)).hexdigest()
        record = index_dir / name[:2] / f"{name}.json"
        try:
            stored = json.loads(record.read_text())
            if stored.get("stamp") == _stamp(st) and stored.get("path") == str(real):
                return stored["sha256"], None
        except (OSError, ValueError, KeyError, AttributeError):
            pass
    digest, data = _hash_file(path)
    if record is not None and _stamp(real.stat()) == _stamp(st):
        _write(record, {"path": str(real), "stamp": _stamp(st), "sha256": digest})
    return digest, data


def _hash_file(path: Path) -> tuple[str, bytes]:
    data = read_bytes(path)
    return hashlib.sha256(data).hexdigest(), data


def _write(record: Path, content: dict) -> None:
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(record, json.dumps(content), mode=0o600)
    except OSError as e:  # a read-only cache only costs the shortcut
        log.debug("cannot record the digest of %s: %s", content["path"], e)
