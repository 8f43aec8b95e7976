"""Shippable compile caches: ``coralrt cache export`` and ``coralrt cache import``.

An archive is a plain (ustar) tar file (gzip-compressed when its name ends
with ``.tar.gz`` or ``.tgz``; the reader recognises gzip by its magic bytes
whatever the name), in this order::

    manifest.json                 what the archive holds (below)
    entries/<key>.json            entry 1's record, byte for byte as the cache stores it
    entries/<key>.bin             entry 1's data
    entries/<key>.json ...        the next entries, in the manifest's order

``manifest.json`` is one JSON object: ``archive`` (:data:`ARCHIVE_NAME`),
``archive_version`` (:data:`ARCHIVE_VERSION`), ``coralrt_version``,
``cache_format`` (the entries' :data:`~coralrt._compile.cache.CACHE_FORMAT_VERSION`),
``created`` (UTC, ISO 8601), ``host`` and ``machine`` (``platform.node()``,
``platform.machine()``) and ``entries``: per entry ``key``, ``source``,
``size``, ``sha256`` (of the data), ``record_size``, ``record_sha256``,
``created`` and ``description`` (``compiler``, ``options``, ``compiler_url``
and ``segments``, when the record has them).

The digests prove that an archive arrived as it was written, not who wrote it
or from what its entries were compiled: anyone can write an archive with
self-consistent digests.  What ties an entry to its source model is checked
apart (:mod:`coralrt._compile.cache_origin`): at import against the inputs and
outputs its record gives for the source model, at every load against the
source model itself.

Import (:mod:`coralrt._compile.cache_import`) never extracts to disk paths,
unpickles or runs anything, and its memory does not grow with what the
archive declares: members are streamed (:mod:`coralrt._compile.cache_tar`),
an entry's data one chunk at a time, and only the manifest (at most
:data:`MANIFEST_MAX` bytes) and one record (at most :data:`RECORD_MAX`) are
held whole.  The whole archive is refused
(:class:`~coralrt.errors.CacheArchiveError`, nothing stored) when it is not a
tar file, is truncated, has anything but zero padding after its end, its
first member is not the manifest or the manifest is larger than
:data:`MANIFEST_MAX`, its archive or cache format version is not this
coralrt's, an entry declares more data than the import's per-entry bound
(:data:`ENTRY_MAX` unless raised), its entries declare more in all than the
larger of that bound and the cache's size cap, or a member is not a regular
file, has an absolute or ``..`` path, a name or position the manifest does
not give it, a duplicate name, or a size other than the manifest's.  The size
refusals come before any entry's data is read.  For the rest, the archive is
read twice: first checked whole, then stored.  An entry whose data is larger
than the cache's size cap, whose record is larger than :data:`RECORD_MAX`,
whose data or record does not match its SHA-256, whose record does not name
the key, source and size the manifest gives, or whose compiled model's inputs
and outputs are not those its record gives for its source model is skipped and
reported; the others are imported.

Export refuses to write an archive that import would refuse for its own
limits (a manifest or a record too large), saying what to do instead.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import platform
import tarfile
import time
from pathlib import Path
from typing import Callable, Iterable

from coralrt._compile.cache import CompileCache
from coralrt._compile.cache_format import CACHE_FORMAT_VERSION, canonical_json
from coralrt.errors import CacheArchiveError
from coralrt._fileio import atomic_write_with
from coralrt._version import version

__all__ = ["ARCHIVE_NAME", "ARCHIVE_VERSION", "ENTRY_MAX", "MANIFEST_MAX", "RECORD_MAX",
           "MANIFEST", "member_name", "describe", "export_cache"]

ARCHIVE_NAME = "coralrt-cache-archive"
ARCHIVE_VERSION = 1
MANIFEST = "manifest.json"
# Parsed JSON takes up to about 33 times its text in memory (one empty object
# per 3 bytes): these two bounds keep an import's peak far below 256 MiB.
MANIFEST_MAX = 2 << 20    # about 600 bytes per entry: 3,500 entries
RECORD_MAX = 1 << 20      # about 40 bytes per operator of the model: 25,000 operators
ENTRY_MAX = 256 << 20     # the default bound on one entry's data (raise: --max-entry-bytes)
_DESCRIPTION = ("compiler", "options", "compiler_url")


def member_name(key: str, suffix: str) -> str:
    return f"entries/{key}{suffix}"


def describe(record: dict) -> dict:
    out = {k: record[k] for k in _DESCRIPTION if k in record}
    summary = record.get("summary")
    if isinstance(summary, dict) and "segments" in summary:
        out["segments"] = summary["segments"]
    return out


# -- export -------------------------------------------------------------------------

def export_cache(cache: CompileCache, file: str | os.PathLike,
                 sources: Iterable[str] | None = None, *,
                 progress: Callable[[int, int], None] | None = None) -> dict:
    """Write the verified entries of ``cache`` (only those built from one of
    ``sources``, SHA-256 hex digests, when given) to the archive ``file``.

    ``progress(done, total)``, if given, is called with the bytes of entry
    data written so far and in all, once before the first entry and after
    each one (the export reports progress only through it).

    Returns what was written: ``file``, ``directory``, ``count``,
    ``total_bytes`` (the entries' data), ``archive_bytes`` and ``entries``
    (``key``, ``source``, ``size``, ``description``).  Raises
    :class:`~coralrt.errors.CacheArchiveError` when there is nothing to export.
    """
    wanted = None if sources is None else set(sources)
    described = []
    for entry in cache.entries():   # first pass: hashes for the manifest
        meta = entry.meta
        if wanted is not None and meta["source"] not in wanted:
            continue
        record = canonical_json(meta)   # what put() wrote, byte for byte
        described.append({
            "key": meta["key"], "source": meta["source"], "size": len(entry.data),
            "sha256": hashlib.sha256(entry.data).hexdigest(),
            "record_size": len(record), "record_sha256": hashlib.sha256(record).hexdigest(),
            "created": meta["created"], "description": describe(meta)})
    if not described:
        which = ("built from the given model(s)" if wanted is not None
                 else f"of cache format {CACHE_FORMAT_VERSION}")
        raise CacheArchiveError(f"nothing to export: the compile cache {cache.root} holds no "
                                f"entry {which}")
    manifest = {
        "archive": ARCHIVE_NAME, "archive_version": ARCHIVE_VERSION,
        "coralrt_version": version(), "cache_format": CACHE_FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(), "machine": platform.machine(), "entries": described}
    manifest_bytes = json.dumps(manifest, separators=(",", ":")).encode("utf-8")
    _check_limits(manifest_bytes, described, cache.root)
    path = Path(file)
    gz = path.name.endswith((".tar.gz", ".tgz"))
    keys = {d["key"] for d in described}

    def changed(key: str) -> CacheArchiveError:
        return CacheArchiveError(f"cache entry {key} changed or was removed while it was "
                                 f"being exported; export again")

    def write(f) -> None:
        with tarfile.open(fileobj=f, mode="w:gz" if gz else "w", format=tarfile.USTAR_FORMAT,
                          **({"compresslevel": 6} if gz else {})) as tar:
            _add(tar, MANIFEST, manifest_bytes, time.time())
            # Second pass: the same entries with the same bytes, or the export fails.
            todo = iter(described)
            done, total = 0, sum(d["size"] for d in described)
            if progress is not None:
                progress(done, total)
            for entry in cache.entries():
                if entry.meta["key"] not in keys:
                    continue
                d, record = next(todo, None), canonical_json(entry.meta)
                if (d is None or d["key"] != entry.meta["key"]
                        or hashlib.sha256(entry.data).hexdigest() != d["sha256"]
                        or hashlib.sha256(record).hexdigest() != d["record_sha256"]):
                    raise changed(entry.meta["key"])
                _add(tar, member_name(d["key"], ".json"), record, d["created"])
                _add(tar, member_name(d["key"], ".bin"), entry.data, d["created"])
                done += d["size"]
                if progress is not None:
                    progress(done, total)
            missing = next(todo, None)
            if missing is not None:
                raise changed(missing["key"])

    atomic_write_with(path, write)
    return {"file": str(path), "directory": str(cache.root), "count": len(described),
            "total_bytes": sum(d["size"] for d in described),
            "archive_bytes": path.stat().st_size,
            "entries": [{k: d[k] for k in ("key", "source", "size", "description")}
                        for d in described]}


def _check_limits(manifest: bytes, described: list[dict], root) -> None:
    """CacheArchiveError before writing an archive that import would refuse."""
    for d in described:
        if d["record_size"] > RECORD_MAX:
            raise CacheArchiveError(
                f"cannot export cache entry {d['key']} of {root}: its record is "
                f"{d['record_size']:,} bytes, more than the {RECORD_MAX:,} bytes 'coralrt "
                f"cache import' reads; export the other models")
    if len(manifest) > MANIFEST_MAX:
        raise CacheArchiveError(
            f"cannot export {len(described):,} cache entries of {root} in one archive: its "
            f"manifest would be {len(manifest):,} bytes, more than the {MANIFEST_MAX:,} bytes "
            f"'coralrt cache import' reads; export fewer models per archive (coralrt cache "
            f"export FILE MODEL...)")


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.type = len(data), 0o644, tarfile.REGTYPE
    info.mtime = int(mtime) if isinstance(mtime, (int, float)) and math.isfinite(mtime) else 0
    tar.addfile(info, io.BytesIO(data))
