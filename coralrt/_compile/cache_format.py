"""What a compile cache entry is: its key, its record and its checksum.

The cache key (:func:`make_key`) is a SHA-256 over the source model's
SHA-256, the partition options, the compiler and :data:`CACHE_FORMAT_VERSION`.
An entry's record (its ``<key>.json``) is the caller's metadata plus ``key``,
``source``, ``size``, ``crc32``, ``created`` and ``format``, written as
canonical JSON.  Nothing is pickled: loading a cache entry never runs code.

An entry is bound to what it was built from: ``key`` is its own cache key and
``source`` the SHA-256 (hex) of the source model, and ``crc32`` is the CRC-32
of the data followed by the 128 ASCII characters of ``key`` and ``source``
(:func:`checksum`), so an entry copied to another key's slot or whose key or
source field was edited does not verify.  CRC-32 rather than a cryptographic
hash: the threat is accidents, not an adversary who can write the user's own
cache.  Where entries live and how they are read, written and evicted is
:mod:`coralrt._compile.cache`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
import zlib
from dataclasses import dataclass, field

__all__ = ["CACHE_FORMAT_VERSION", "KEY_PATTERN", "RESERVED", "Entry", "canonical_json",
           "check_source", "checksum", "make_key", "new_record", "record_of"]

# 2: entries carry their key and source digest, covered by the CRC-32.  Entries
# of older formats live in another folder (v1/) and are never read: misses.
CACHE_FORMAT_VERSION = 2

KEY_PATTERN = re.compile(r"[0-9a-f]{64}")  # a cache key, and a source digest
# The record fields coralrt sets itself; the caller's metadata may not.
RESERVED = ("key", "source", "size", "crc32", "created", "format")


def canonical_json(obj) -> bytes:
    """Sorted keys, no whitespace, ASCII only: the same bytes on every Python."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=True, allow_nan=False).encode("ascii")


def make_key(model_bytes: bytes | None = None, *, options: dict, compiler_id: str,
             compiler_version: str, model_sha256: str | None = None) -> str:
    """The cache key (64 hex digits) of compiling ``model_bytes`` with these settings.

    ``model_sha256`` (the hex digest of the model bytes) may be given instead
    of the bytes when the caller already knows it.

    ``options`` must be JSON-serialisable (the partition options); any change
    to the model, the options, the compiler or the cache format gives a new key.
    """
    parts = {"options": options, "compiler_id": compiler_id,
             "compiler_version": compiler_version, "format": CACHE_FORMAT_VERSION}
    try:
        text = canonical_json(parts)
    except (TypeError, ValueError) as e:
        raise TypeError(f"cache key parts must be plain JSON values: {e}") from e
    if model_sha256 is None:
        if model_bytes is None:
            raise TypeError("make_key needs model_bytes or model_sha256")
        model_sha256 = hashlib.sha256(model_bytes).hexdigest()
    h = hashlib.sha256(model_sha256.encode("ascii"))
    h.update(b"\0")
    h.update(text)
    return h.hexdigest()


def checksum(key: str, source: str, data_crc32: int) -> int:
    """The record's ``crc32``: the data's CRC-32 continued over key and source.

    One pass over the data gives both this and the data's own CRC-32
    (:attr:`Entry.data_crc32`).
    """
    return zlib.crc32(f"{key}{source}".encode("ascii"), data_crc32)


def check_source(source) -> str:
    if not isinstance(source, str) or not KEY_PATTERN.fullmatch(source):
        raise ValueError(f"source must be the SHA-256 of the source model as 64 lowercase "
                         f"hex digits, got {source!r}")
    return source


def new_record(key: str, source: str, data: bytes, meta: dict, *,
               created: float | None = None) -> tuple[dict, int]:
    """The record of ``data`` stored under ``key``, and the data's own CRC-32.

    ``created`` (seconds since the epoch) is when the data was built; default
    now.  An imported entry keeps its original build time this way.
    """
    data_crc32 = zlib.crc32(data)
    return record_of(key, source, len(data), data_crc32, meta, created=created), data_crc32


def record_of(key: str, source: str, size: int, data_crc32: int, meta: dict, *,
              created: float | None = None) -> dict:
    """The record of ``size`` bytes of data whose CRC-32 is ``data_crc32`` (data
    streamed to a file rather than held in memory), as :func:`new_record`."""
    clash = [k for k in RESERVED if k in meta]
    if clash:
        raise ValueError(f"cache metadata may not set {', '.join(clash)}: coralrt "
                         f"records them itself")
    if created is None:
        created = time.time()
    elif (isinstance(created, bool) or not isinstance(created, (int, float))
          or not math.isfinite(created)):
        raise ValueError(f"created must be a finite number of seconds since the epoch, "
                         f"got {created!r}")
    return {**meta, "key": key, "source": source, "size": size,
            "crc32": checksum(key, source, data_crc32), "created": float(created),
            "format": CACHE_FORMAT_VERSION}


@dataclass
class Entry:
    """A cached build: the raw bytes and the metadata stored next to them.

    ``data_crc32`` is the CRC-32 of ``data`` alone, as verified against the
    entry's checksum (None when unknown).
    """

    data: bytes = field(repr=False)
    meta: dict
    data_crc32: int | None = field(default=None, repr=False, compare=False)
