"""Shippable compile caches: ``coralrt cache export`` and ``coralrt cache import``.

An archive is a plain tar file (gzip-compressed when its name ends with
``.tar.gz`` or ``.tgz``; the reader recognises gzip by its magic bytes
whatever the name), in this order::

    manifest.json                 what the archive holds (below)
    entries/<key>.json            entry 1's record, byte for byte as the cache stores it
    entries/<key>.bin             entry 1's data
    entries/<key>.json ...        the next entries, in the manifest's order

``manifest.json`` is one JSON object: ``archive`` (:data:`ARCHIVE_NAME`),
``archive_version`` (:data:`ARCHIVE_VERSION`), ``coralrt_version``,
``cache_format`` (the entries' :data:`~coralrt.compile.cache.CACHE_FORMAT_VERSION`),
``created`` (UTC, ISO 8601), ``host`` and ``machine`` (``platform.node()``,
``platform.machine()``) and ``entries``: per entry ``key``, ``source``,
``size``, ``sha256`` (of the data), ``record_size``, ``record_sha256``,
``created`` and ``description`` (``compiler``, ``options``, ``compiler_url``
and ``segments``, when the record has them).

Import never extracts to disk paths, unpickles or runs anything: members are
read into memory through :mod:`tarfile`, one entry at a time, and stored with
:meth:`CompileCache.put <coralrt.compile.cache.CompileCache.put>`.  The whole
archive is refused (:class:`~coralrt.errors.CacheArchiveError`, nothing
stored) when it is not a tar file, is truncated, its first member is not the
manifest or the manifest is larger than :data:`MANIFEST_MAX`, its archive or
cache format version is not this coralrt's, or a member is not a regular
file, has an absolute or ``..`` path, a name or position the manifest does
not give it, a duplicate name, or a size other than the manifest's.  For
that, the archive is read twice: first checked whole, then stored.  An entry
whose data is larger than the cache's size cap, whose record is larger than
:data:`RECORD_MAX`, whose data or record does not match its SHA-256, or whose
record does not name the key, source and size the manifest gives is skipped
and reported; the others are imported.
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
import zlib
from pathlib import Path
from typing import Callable, Iterable

from coralrt.compile.cache import CompileCache
from coralrt.compile.cache_format import (CACHE_FORMAT_VERSION, KEY_PATTERN, RESERVED,
                                          canonical_json, checksum)
from coralrt.errors import CacheArchiveError, ConfigError
from coralrt.fileio import atomic_write_with
from coralrt.version import version

__all__ = ["ARCHIVE_NAME", "ARCHIVE_VERSION", "MANIFEST_MAX", "RECORD_MAX",
           "export_cache", "import_cache"]

ARCHIVE_NAME = "coralrt-cache-archive"
ARCHIVE_VERSION = 1
MANIFEST = "manifest.json"
MANIFEST_MAX = 16 << 20   # about 40,000 entries' worth
RECORD_MAX = 16 << 20     # a record holds one line per operator: far below this
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)
_TRAILER_MAX = 1 << 20    # zero blocks after the end of a tar (tar pads to 10 KiB records)
_DESCRIPTION = ("compiler", "options", "compiler_url")


def _member_name(key: str, suffix: str) -> str:
    return f"entries/{key}{suffix}"


def _describe(record: dict) -> dict:
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
            "created": meta["created"], "description": _describe(meta)})
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
    path = Path(file)
    gz = path.name.endswith((".tar.gz", ".tgz"))
    keys = {d["key"] for d in described}

    def changed(key: str) -> CacheArchiveError:
        return CacheArchiveError(f"cache entry {key} changed or was removed while it was "
                                 f"being exported; export again")

    def write(f) -> None:
        with tarfile.open(fileobj=f, mode="w:gz" if gz else "w", format=tarfile.USTAR_FORMAT,
                          **({"compresslevel": 6} if gz else {})) as tar:
            _add(tar, MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"), time.time())
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
                _add(tar, _member_name(d["key"], ".json"), record, d["created"])
                _add(tar, _member_name(d["key"], ".bin"), entry.data, d["created"])
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


def _add(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.type = len(data), 0o644, tarfile.REGTYPE
    info.mtime = int(mtime) if isinstance(mtime, (int, float)) and math.isfinite(mtime) else 0
    tar.addfile(info, io.BytesIO(data))


# -- import -------------------------------------------------------------------------

class _Skip(Exception):
    """One entry of the archive fails verification: skipped, reported."""


def import_cache(cache: CompileCache, file: str | os.PathLike) -> dict:
    """Store the entries of the archive ``file`` in ``cache`` (see the module docstring).

    Returns the report: ``file``, ``directory``, ``archive`` (the manifest's
    ``coralrt_version``, ``created``, ``host``, ``machine``,
    ``archive_version``, ``cache_format``), the counts ``imported``,
    ``present`` and ``failed``, ``evicted`` (entries the size cap removed
    afterwards) and ``entries``: per entry ``key``, ``source``, ``size``,
    ``description``, ``status`` (``imported``, ``present`` or ``failed``) and,
    when failed, ``reason``.
    """
    if not cache.enabled:
        raise ConfigError(f"cannot import into the compile cache {cache.root}: it is disabled "
                          f"(CORALRT_CACHE); enable it first")
    path = Path(file)
    cap = cache.max_bytes
    problems: dict[str, str] = {}

    def check(entry: dict, record: bytes | None, data: bytes | None) -> None:
        try:
            _verify(entry, record, data, cap)
        except _Skip as e:
            problems[entry["key"]] = str(e)

    manifest = _read_archive(path, cap, check)
    statuses: dict[str, str] = {}
    described: dict[str, dict] = {}   # from the verified records of the imported entries

    def store(entry: dict, record: bytes | None, data: bytes | None) -> None:
        key, source = entry["key"], entry["source"]
        if key in problems:
            return
        try:
            meta, created = _verify(entry, record, data, cap)
        except _Skip as e:   # the file changed between the two readings
            problems[key] = str(e)
            return
        if cache.get(key, source=source) is not None:
            statuses[key] = "present"
            return
        try:
            cache.put(key, data, meta, source=source, created=created)
        except (OSError, ValueError) as e:
            problems[key] = f"cannot store it: {e}"
            return
        statuses[key] = "imported"
        described[key] = _describe(meta)

    _read_archive(path, cap, store)
    evicted = cache.evict() if statuses else 0
    entries = []
    for e in manifest["entries"]:
        row = {k: e[k] for k in ("key", "source", "size")}
        row["description"] = described.get(e["key"]) or (
            e["description"] if isinstance(e.get("description"), dict) else {})
        if e["key"] in problems:
            row.update(status="failed", reason=problems[e["key"]])
        else:
            row["status"] = statuses.get(e["key"], "failed")
            if row["status"] == "failed":
                row["reason"] = "not found in the archive on the second reading"
        entries.append(row)
    count = {s: sum(r["status"] == s for r in entries) for s in ("imported", "present", "failed")}
    return {"file": str(path), "directory": str(cache.root),
            "archive": {k: manifest.get(k) for k in ("coralrt_version", "created", "host",
                                                      "machine", "archive_version",
                                                      "cache_format")},
            **count, "evicted": evicted, "entries": entries}


def _verify(entry: dict, record_bytes: bytes | None, data: bytes | None,
            cap: int) -> tuple[dict, float]:
    """``(meta for put, created)`` of a manifest entry, or :class:`_Skip` saying why not."""
    key, source = entry["key"], entry["source"]
    if entry["size"] > cap:
        raise _Skip(f"its data is {entry['size']:,} bytes, more than the cache's size cap "
                    f"({cap:,} bytes, CORALRT_CACHE_MAX_BYTES)")
    if entry["record_size"] > RECORD_MAX:
        raise _Skip(f"its record is {entry['record_size']:,} bytes, more than the "
                    f"{RECORD_MAX:,} bytes a record may have")
    assert record_bytes is not None and data is not None
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise _Skip("its data does not match its SHA-256 in the manifest")
    if hashlib.sha256(record_bytes).hexdigest() != entry["record_sha256"]:
        raise _Skip("its record does not match its SHA-256 in the manifest")
    try:
        record = json.loads(record_bytes)
    except (ValueError, RecursionError) as e:
        raise _Skip(f"its record is not JSON ({e})") from None
    if not isinstance(record, dict):
        raise _Skip("its record is not a JSON object")
    for name, want in (("key", key), ("source", source), ("size", len(data)),
                       ("format", CACHE_FORMAT_VERSION)):
        if record.get(name) != want:
            raise _Skip(f"its record says {name} {record.get(name)!r}, the manifest and "
                        f"data say {want!r}")
    if record.get("crc32") != checksum(key, source, zlib.crc32(data)):
        raise _Skip("its record's CRC-32 does not match the data")
    created = record.get("created")
    if isinstance(created, bool) or not isinstance(created, (int, float)) \
            or not math.isfinite(created):
        raise _Skip(f"its record's created time {created!r} is not a number")
    return {k: v for k, v in record.items() if k not in RESERVED}, float(created)


def _read_archive(path: Path, cap: int,
                  visit: Callable[[dict, bytes | None, bytes | None], None]) -> dict:
    """Check the archive's structure and call ``visit(manifest entry, record,
    data)`` for each entry (None for a member too large to read); returns
    the manifest.  Raises CacheArchiveError for anything that refuses the
    whole archive, before or after some visits."""
    with open(path, "rb") as f:   # a missing file is the OSError it is
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        try:
            with tarfile.open(fileobj=f, mode="r:gz" if gz else "r:") as tar:
                manifest = _read_members(path, tar, cap, visit)
                if gz:   # the gzip trailer (CRC-32, length) must be there and right
                    rest = 0
                    while chunk := tar.fileobj.read(1 << 16):
                        rest += len(chunk)
                        if rest > _TRAILER_MAX or chunk.count(0) != len(chunk):
                            raise CacheArchiveError(f"{path}: unexpected data after the "
                                                    f"end of the archive")
                return manifest
        except (tarfile.TarError, EOFError, zlib.error) as e:
            what = "gzip-compressed tar" if gz else "tar"
            raise CacheArchiveError(f"{path} is not a readable {what} archive, or it is "
                                    f"truncated or damaged ({e})") from None
        except OSError as e:
            if not gz or getattr(e, "errno", None) is not None:
                raise
            raise CacheArchiveError(f"{path} is not a readable gzip-compressed archive, or "
                                    f"it is truncated or damaged ({e})") from None


def _read_members(path: Path, tar: tarfile.TarFile, cap: int, visit) -> dict:
    members = iter(tar)
    seen: set[str] = set()

    def next_member(expected: str) -> tarfile.TarInfo:
        m = next(members, None)
        if m is None:
            raise CacheArchiveError(f"{path} is truncated or incomplete: it ends where "
                                    f"{expected} should be")
        name = m.name
        if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/"):
            raise CacheArchiveError(f"{path}: member {name!r} has an unsafe path "
                                    f"(absolute or with '..'); refusing the archive")
        if m.type not in _REGULAR:
            kind = ("a symbolic link" if m.issym() else "a hard link" if m.islnk() else
                    "a directory" if m.isdir() else "a device" if m.isdev() else
                    f"of tar type {m.type!r}")
            raise CacheArchiveError(f"{path}: member {name!r} is {kind}; a cache archive "
                                    f"holds regular files only; refusing the archive")
        if name in seen:
            raise CacheArchiveError(f"{path}: member {name!r} appears twice; refusing the "
                                    f"archive")
        seen.add(name)
        if name != expected:
            raise CacheArchiveError(f"{path}: unexpected member {name!r} where {expected} "
                                    f"should be; refusing the archive")
        return m

    def read(m: tarfile.TarInfo, size: int) -> bytes:
        if m.size != size:
            raise CacheArchiveError(f"{path}: member {m.name} is {m.size:,} bytes, the "
                                    f"manifest says {size:,}; refusing the archive")
        data = tar.extractfile(m).read(size + 1)
        if len(data) != size:
            raise CacheArchiveError(f"{path} is truncated: member {m.name} ends after "
                                    f"{len(data):,} of {size:,} bytes")
        return data

    first = next_member(MANIFEST)
    if first.size > MANIFEST_MAX:
        raise CacheArchiveError(f"{path}: {MANIFEST} is {first.size:,} bytes, more than "
                                f"the {MANIFEST_MAX:,} a manifest may have")
    manifest = _parse_manifest(path, read(first, first.size))
    for entry in manifest["entries"]:
        key = entry["key"]
        m = next_member(_member_name(key, ".json"))
        record = read(m, entry["record_size"]) if entry["record_size"] <= RECORD_MAX else None
        if record is None and m.size != entry["record_size"]:
            read(m, entry["record_size"])   # the size mismatch refuses the archive
        m = next_member(_member_name(key, ".bin"))
        data = read(m, entry["size"]) if entry["size"] <= cap else None
        if data is None and m.size != entry["size"]:
            read(m, entry["size"])
        visit(entry, record, data)
    extra = next(members, None)
    if extra is not None:
        raise CacheArchiveError(f"{path}: unexpected member {extra.name!r} after the last "
                                f"entry the manifest lists; refusing the archive")
    return manifest


def _parse_manifest(path: Path, text: bytes) -> dict:
    def bad(why: str) -> CacheArchiveError:
        return CacheArchiveError(f"{path}: {MANIFEST} {why}")

    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise bad(f"is not JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("archive") != ARCHIVE_NAME:
        raise bad(f"does not describe a coralrt cache archive (no \"archive\": "
                  f"\"{ARCHIVE_NAME}\")")
    got = manifest.get("archive_version")
    if got != ARCHIVE_VERSION:
        raise CacheArchiveError(
            f"{path} is a coralrt cache archive of archive format version {got!r}; this "
            f"coralrt ({version()}) reads version {ARCHIVE_VERSION} only (an archive made "
            f"by another coralrt version: use the same version on both machines)")
    got = manifest.get("cache_format")
    if got != CACHE_FORMAT_VERSION:
        raise CacheArchiveError(
            f"{path} holds entries of cache format version {got!r}; this coralrt "
            f"({version()}) uses cache format version {CACHE_FORMAT_VERSION}; export them "
            f"again with a coralrt that uses cache format {CACHE_FORMAT_VERSION}")
    entries = manifest.get("entries")
    if not isinstance(entries, list):
        raise bad("has no list of entries")
    keys = set()
    for n, e in enumerate(entries):
        ok = (isinstance(e, dict)
              and all(isinstance(e.get(k), str) and KEY_PATTERN.fullmatch(e[k])
                      for k in ("key", "source", "sha256", "record_sha256"))
              and all(isinstance(e.get(k), int) and not isinstance(e[k], bool) and e[k] >= 0
                      for k in ("size", "record_size")))
        if not ok:
            raise bad(f"entry {n} is malformed (key, source, sha256, record_sha256 must be "
                      f"64 lowercase hex digits, size and record_size counts of bytes)")
        if e["key"] in keys:
            raise bad(f"lists key {e['key']} twice")
        keys.add(e["key"])
    return manifest
