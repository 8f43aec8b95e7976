"""``coralrt cache import``: verify an archive of ``coralrt cache export`` and store its entries.

The archive's layout and the refusal rules are in :mod:`coralrt._compile.cache_archive`'s
docstring.  The archive is read front to back twice (:mod:`coralrt._compile.cache_tar`),
without extracting anything to a path, unpickling or running anything, and in
bounded memory: an entry's data is never held whole, only one chunk of it at a time.

1. The check: the whole archive's structure, and each entry's digests,
   computed as its data streams past.  Nothing is written.
2. The store: each entry that passed, streamed into a temporary file next to
   its place in the cache while its digests are computed again (the file may
   have changed in between); its compiled model's inputs and outputs are
   compared with those its record gives for its source model
   (:mod:`coralrt._compile.cache_origin`); then the file is renamed into place
   and the record written (:meth:`CompileCache.put_file`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import mmap
import os
import tempfile
import zlib
from pathlib import Path
from typing import Callable, Iterator

from coralrt._compile.cache import CompileCache
from coralrt._compile.cache_archive import (ARCHIVE_NAME, ARCHIVE_VERSION, ENTRY_MAX, MANIFEST,
                                           MANIFEST_MAX, RECORD_MAX, describe, member_name)
from coralrt._compile.cache_format import CACHE_FORMAT_VERSION, KEY_PATTERN, RESERVED, checksum
from coralrt._compile.cache_origin import check_io
from coralrt._compile.cache_tar import TarStream
from coralrt.errors import CacheArchiveError, ConfigError
from coralrt._version import version

__all__ = ["import_cache"]


class _Skip(Exception):
    """One entry of the archive fails verification: skipped, reported."""


class _Digests:
    """SHA-256, CRC-32 and length of data seen chunk by chunk."""

    def __init__(self):
        self.sha256, self.crc32, self.size = hashlib.sha256(), 0, 0

    def update(self, chunk: bytes) -> None:
        self.sha256.update(chunk)
        self.crc32 = zlib.crc32(chunk, self.crc32)
        self.size += len(chunk)


# A visitor gets (manifest entry, record bytes or None, the data's chunks or None).
Visit = Callable[[dict, "bytes | None", "Iterator[bytes] | None"], None]


def import_cache(cache: CompileCache, file: str | os.PathLike, *,
                 max_entry_bytes: int | None = None) -> dict:
    """Store the entries of the archive ``file`` in ``cache`` (see the module docstring).

    ``max_entry_bytes`` (default :data:`~coralrt._compile.cache_archive.ENTRY_MAX`)
    is the largest entry the archive may declare; an archive declaring a
    larger one is refused whole before any data is read.

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
    bound = ENTRY_MAX if max_entry_bytes is None else int(max_entry_bytes)
    if bound < 0:
        raise ValueError(f"max_entry_bytes must be a number of bytes, got {max_entry_bytes!r}")
    path = Path(file)
    cap = cache.max_bytes
    problems: dict[str, str] = {}

    def check(entry: dict, record: bytes | None, data: Iterator[bytes] | None) -> None:
        try:
            digests = _Digests()
            for chunk in _readable(entry, record, data, cap):
                digests.update(chunk)
            _verify(entry, record, digests)
        except _Skip as e:
            problems[entry["key"]] = str(e)

    manifest = _read_archive(path, cap, bound, check)
    statuses: dict[str, str] = {}
    described: dict[str, dict] = {}   # from the verified records of the imported entries
    first = {e["key"]: e for e in manifest["entries"]}
    todo = {k for k in first if k not in problems}

    def store(entry: dict, record: bytes | None, data: Iterator[bytes] | None) -> None:
        key, source = entry["key"], entry["source"]
        if key not in todo:
            return
        todo.discard(key)
        if entry != first[key]:
            problems[key] = "the archive changed while it was being imported"
            return
        try:
            if cache.get(key, source=source) is not None:
                statuses[key] = "present"
                return
            meta = _store(cache, entry, record, _readable(entry, record, data, cap))
        except _Skip as e:   # the file changed between the two readings, or the origin check
            problems[key] = str(e)
            return
        except (OSError, ValueError) as e:
            problems[key] = f"cannot store it: {e}"
            return
        statuses[key] = "imported"
        described[key] = describe(meta)

    if todo:
        _read_archive(path, cap, bound, store, until=lambda: not todo)
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


def _readable(entry: dict, record: bytes | None, data: Iterator[bytes] | None,
              cap: int) -> Iterator[bytes]:
    """``data``, or :class:`_Skip` for an entry that is not read."""
    if entry["size"] > cap:
        raise _Skip(f"its data is {entry['size']:,} bytes, more than the cache's size cap "
                    f"({cap:,} bytes, CORALRT_CACHE_MAX_BYTES)")
    if record is None:
        raise _Skip(f"its record is {entry['record_size']:,} bytes, more than the "
                    f"{RECORD_MAX:,} bytes a record may have")
    assert data is not None
    return data


def _store(cache: CompileCache, entry: dict, record: bytes, data: Iterator[bytes]) -> dict:
    """Stream ``data`` into a temporary file in the cache, verify it and put it in
    place; the meta stored, or :class:`_Skip` (nothing stored)."""
    key = entry["key"]
    folder = cache.path / key[:2]
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key}.bin.", suffix=".tmp")
    try:
        digests = _Digests()
        with open(fd, "wb") as f:
            for chunk in data:
                digests.update(chunk)
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        meta, created = _verify(entry, record, digests)
        problem = _origin_problem(tmp, meta)
        if problem is not None:
            raise _Skip(problem)
        cache.put_file(key, Path(tmp), meta, source=entry["source"], created=created,
                       data_crc32=digests.crc32)
        return meta
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass   # renamed into place


def _origin_problem(file: str, record: dict) -> str | None:
    """check_io over the staged data, memory-mapped: only the pages it reads count."""
    with open(file, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return check_io(b"", record)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return check_io(m, record)


def _verify(entry: dict, record_bytes: bytes, data: _Digests) -> tuple[dict, float]:
    """``(meta for put, created)`` of a manifest entry, or :class:`_Skip` saying why not."""
    key, source = entry["key"], entry["source"]
    if data.sha256.hexdigest() != entry["sha256"]:
        raise _Skip("its data does not match its SHA-256 in the manifest")
    if hashlib.sha256(record_bytes).hexdigest() != entry["record_sha256"]:
        raise _Skip("its record does not match its SHA-256 in the manifest")
    try:
        record = json.loads(record_bytes)
    except (ValueError, RecursionError) as e:
        raise _Skip(f"its record is not JSON ({e})") from None
    if not isinstance(record, dict):
        raise _Skip("its record is not a JSON object")
    for name, want in (("key", key), ("source", source), ("size", data.size),
                       ("format", CACHE_FORMAT_VERSION)):
        if record.get(name) != want:
            raise _Skip(f"its record says {name} {record.get(name)!r}, the manifest and "
                        f"data say {want!r}")
    if record.get("crc32") != checksum(key, source, data.crc32):
        raise _Skip("its record's CRC-32 does not match the data")
    created = record.get("created")
    if isinstance(created, bool) or not isinstance(created, (int, float)) \
            or not math.isfinite(created):
        raise _Skip(f"its record's created time {created!r} is not a number")
    return {k: v for k, v in record.items() if k not in RESERVED}, float(created)


def _read_archive(path: Path, cap: int, bound: int, visit: Visit,
                  until: Callable[[], bool] | None = None) -> dict:
    """Check the archive's structure and call ``visit`` for each entry; returns
    the manifest.  Raises CacheArchiveError for anything that refuses the
    whole archive, before or after some visits.  ``until()``: stop reading as
    soon as it returns True after a visit (the structure was checked before)."""
    with open(path, "rb") as raw:   # a missing file is the OSError it is
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        try:
            f = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
            tar = TarStream(f, path)
            manifest = _read_members(tar, cap, bound, visit, until)
            if until is None:
                tar.finish()
            return manifest
        except (EOFError, zlib.error) as e:
            raise CacheArchiveError(f"{path} is not a readable gzip-compressed tar archive, "
                                    f"or it is truncated or damaged ({e})") from None
        except OSError as e:
            if not gz or getattr(e, "errno", None) is not None:
                raise
            raise CacheArchiveError(f"{path} is not a readable gzip-compressed archive, or "
                                    f"it is truncated or damaged ({e})") from None


def _read_members(tar: TarStream, cap: int, bound: int, visit: Visit, until) -> dict:
    path = tar.path
    seen: set[str] = set()

    def next_member(expected: str, size: int | None):
        m = tar.next()
        if m is None:
            raise CacheArchiveError(f"{path} is truncated or incomplete: it ends where "
                                    f"{expected} should be")
        name = m.name
        if name.startswith(("/", "\\")) or ".." in name.replace("\\", "/").split("/"):
            raise CacheArchiveError(f"{path}: member {name!r} has an unsafe path "
                                    f"(absolute or with '..'); refusing the archive")
        if name in seen:
            raise CacheArchiveError(f"{path}: member {name!r} appears twice; refusing the "
                                    f"archive")
        seen.add(name)
        if name != expected:
            raise CacheArchiveError(f"{path}: unexpected member {name!r} where {expected} "
                                    f"should be; refusing the archive")
        if size is not None and m.size != size:
            raise CacheArchiveError(f"{path}: member {name} is {m.size:,} bytes, the "
                                    f"manifest says {size:,}; refusing the archive")
        return m

    first = next_member(MANIFEST, None)
    if first.size > MANIFEST_MAX:
        raise CacheArchiveError(f"{path}: {MANIFEST} is {first.size:,} bytes, more than "
                                f"the {MANIFEST_MAX:,} a manifest may have")
    manifest = _parse_manifest(path, tar.read(MANIFEST))
    _check_sizes(path, manifest["entries"], cap, bound)
    for entry in manifest["entries"]:
        key = entry["key"]
        name = member_name(key, ".json")
        next_member(name, entry["record_size"])
        record = tar.read(name) if entry["record_size"] <= RECORD_MAX else None
        if record is None:
            tar.skip(name)
        name = member_name(key, ".bin")
        next_member(name, entry["size"])
        data = tar.chunks(name)
        visit(entry, record, data)
        for _ in data:   # what the visitor did not read
            pass
        if until is not None and until():
            return manifest
    extra = tar.next()
    if extra is not None:
        raise CacheArchiveError(f"{path}: unexpected member {extra.name!r} after the last "
                                f"entry the manifest lists; refusing the archive")
    return manifest


def _check_sizes(path: Path, entries: list[dict], cap: int, bound: int) -> None:
    """Refuse an archive declaring more than an import reads, before reading it."""
    for e in entries:
        if e["size"] > bound:
            raise CacheArchiveError(
                f"{path}: entry {e['key']} declares {e['size']:,} bytes of data, more than "
                f"the {bound:,} bytes an imported entry may have; refusing the archive "
                f"before reading it (to import larger entries, raise the limit with "
                f"'coralrt cache import --max-entry-bytes SIZE')")
    total = sum(e["size"] + e["record_size"] for e in entries)
    limit = max(cap, bound)
    if total > limit:
        raise CacheArchiveError(
            f"{path}: its entries declare {total:,} bytes in all, more than the {limit:,} "
            f"bytes an import reads (the larger of the cache's size cap, "
            f"CORALRT_CACHE_MAX_BYTES, and the largest entry it accepts, --max-entry-bytes); "
            f"refusing the archive before reading it (import fewer models at a time, or "
            f"raise the cap)")


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
