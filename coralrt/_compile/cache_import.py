"""``coralrt cache import``: verify an archive of ``coralrt cache export`` and store its entries.

The archive's layout and the refusal rules are in :mod:`coralrt._compile.cache_archive`'s
docstring; this module reads it (twice: checked whole first, then stored) without
extracting anything to disk, unpickling or running anything.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tarfile
import zlib
from pathlib import Path
from typing import Callable

from coralrt._compile.cache import CompileCache
from coralrt._compile.cache_archive import (ARCHIVE_NAME, ARCHIVE_VERSION, MANIFEST, MANIFEST_MAX,
                                           RECORD_MAX, describe, member_name)
from coralrt._compile.cache_format import CACHE_FORMAT_VERSION, KEY_PATTERN, RESERVED, checksum
from coralrt.errors import CacheArchiveError, ConfigError
from coralrt._version import version

__all__ = ["import_cache"]

_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)
_TRAILER_MAX = 1 << 20    # zero blocks after the end of a tar (tar pads to 10 KiB records)


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
        described[key] = describe(meta)

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
        m = next_member(member_name(key, ".json"))
        record = read(m, entry["record_size"]) if entry["record_size"] <= RECORD_MAX else None
        if record is None and m.size != entry["record_size"]:
            read(m, entry["record_size"])   # the size mismatch refuses the archive
        m = next_member(member_name(key, ".bin"))
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
