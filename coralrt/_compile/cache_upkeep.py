"""Upkeep of the compile cache: what is in it, eviction, clearing.

Functions over a :class:`coralrt._compile.cache.CompileCache`'s folders; the
cache's ``evict``, ``info`` and ``clear`` methods call them.  Only names
coralrt writes are looked at or removed, so a cache folder shared with other
files is safe.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from coralrt._compile.cache_format import KEY_PATTERN as _KEY
from coralrt._compile.cache_index import SourceIndex, record_source
from coralrt._fileio import is_temporary

__all__ = ["walk", "scan", "evict", "clear", "unlink"]

log = logging.getLogger("coralrt.cache")

VERSION_DIR = re.compile(r"v\d+")
_SHARD_DIR = re.compile(r"[0-9a-f]{2}")


def unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


def walk(versions: list[Path]) -> Iterator[tuple[Path, list[Path]]]:
    """``(shard folder, its files)`` under the given version folders."""
    for version in versions:
        shards = version.iterdir() if version.is_dir() else ()
        for shard in shards:
            if _SHARD_DIR.fullmatch(shard.name) and shard.is_dir():
                yield shard, list(shard.iterdir())


def scan(folder: Path) -> dict[str, tuple[int, float]]:
    """``key -> (bytes on disk, last use)`` for every entry under the version ``folder``."""
    found: dict[str, tuple[int, float]] = {}
    for _, files in walk([folder]):
        for f in files:
            if f.suffix in (".bin", ".json") and _KEY.fullmatch(f.stem):
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                size, used = found.get(f.stem, (0, 0.0))
                # The .bin's mtime is the LRU clock; a lone .json counts by its own.
                used = st.st_mtime if f.suffix == ".bin" or not used else used
                found[f.stem] = (size + st.st_size, used)
    return found


def evict(cache, keep: str | None) -> int:
    """Remove least recently used entries of ``cache`` until it fits its ``max_bytes``,
    never ``keep``; the number removed."""
    entries = scan(cache.path)
    total = sum(size for size, _ in entries.values())
    removed = 0
    index = SourceIndex(cache.path)
    for key, (size, _) in sorted(entries.items(), key=lambda kv: kv[1][1]):
        if total <= cache.max_bytes:
            break
        if key == keep:
            continue
        shard = cache.path / key[:2]
        bin_path, json_path = shard / f"{key}.bin", shard / f"{key}.json"
        source = record_source(json_path)
        unlink(json_path)     # the JSON first: never a JSON without its data
        unlink(bin_path)
        if source is not None:
            index.remove(source, key)
        total -= size
        removed += 1
        log.debug("evicted cache entry %s (%d bytes)", key, size)
    return removed


def clear(root: Path) -> int:
    """Remove every entry under ``root`` (every format version), the index hints, and
    leftover temporary and idle lock files; the number of entries removed."""
    versions = [v for v in (root.iterdir() if root.is_dir() else ())
                if VERSION_DIR.fullmatch(v.name)]
    removed: set[Path] = set()
    for shard, files in walk(versions):
        for f in files:
            keyed = _KEY.fullmatch(f.stem)
            if keyed and f.suffix in (".bin", ".json"):
                if unlink(f):
                    removed.add(f.with_suffix(""))
            elif is_temporary(f.name):
                unlink(f)
            elif keyed and f.suffix == ".lock":
                _remove_idle_lock(f)
        try:
            shard.rmdir()
        except OSError:
            pass  # not empty: a lock in use, or someone else's file
    for version in versions:
        SourceIndex(version).clear()
    return len(removed)


def _remove_idle_lock(path: Path) -> None:
    lock = FileLock(path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return  # a compile is running: its lock stays
    try:
        unlink(path)
    finally:
        lock.release()
