"""SHA-256 of model files, remembered across processes.

A cache-hit session should not pay for hashing a multi-megabyte model on
every load.  For a model given as a path, the digest is stored next to the
compile cache in a record named by the SHA-256 of the file's real path,
holding that path, the file's size, inode, device, mtime and ctime
(nanoseconds) and the digest.  A record is used only for the path it names
and while the file is untouched: any change to the file changes its ctime;
the same test git uses for its index.  A record whose path, stamp or digest
does not match (a record copied into another path's slot, a collision of
record names, a damaged record) is ignored and the file is hashed.

As git's "racily clean" entries: file systems stamp files with a coarse
clock (a kernel tick; two seconds on FAT), so a file rewritten within the
tick of its hashing can keep its stamp.  A digest is therefore only recorded
for a file whose stamp is older than ``_SETTLED_NS`` when hashing starts;
younger files are hashed on every load until they settle.
Bytes given directly are always hashed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path

from coralrt._fileio import atomic_write
from coralrt._model import read_bytes

__all__ = ["model_digest"]

log = logging.getLogger("coralrt.cache")

_SHA256 = re.compile(r"[0-9a-f]{64}")
_SETTLED_NS = 3_000_000_000  # more than FAT's 2 s timestamp granularity


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
        stored = _read(record)
        if (isinstance(stored, dict) and stored.get("path") == str(real)
                and stored.get("stamp") == _stamp(st)
                and isinstance(stored.get("sha256"), str) and _SHA256.fullmatch(stored["sha256"])):
            return stored["sha256"], None
    hashing = time.time_ns()
    digest, data = _hash_file(path)
    if record is not None and max(st.st_mtime_ns, st.st_ctime_ns) < hashing - _SETTLED_NS:
        try:
            unchanged = _stamp(real.stat()) == _stamp(st)
        except OSError:
            unchanged = False
        if unchanged:
            _write(record, {"path": str(real), "stamp": _stamp(st), "sha256": digest})
    return digest, data


def _read(record: Path):
    try:
        text = record.read_bytes()
    except PermissionError as e:
        log.warning("cannot read the model digest record %s: permission denied (%s); "
                    "hashing the model instead", record, e.strerror or e)
        return None
    except OSError:
        return None  # no record yet
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _hash_file(path: Path) -> tuple[str, bytes]:
    data = read_bytes(path)
    return hashlib.sha256(data).hexdigest(), data


def _write(record: Path, content: dict) -> None:
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(record, json.dumps(content), mode=0o600)
    except PermissionError as e:
        log.warning("cannot record the digest of %s: permission denied on %s; the model "
                    "is hashed on every load", content["path"], e.filename or record)
    except OSError as e:  # a read-only cache only costs the shortcut
        log.debug("cannot record the digest of %s: %s", content["path"], e)
