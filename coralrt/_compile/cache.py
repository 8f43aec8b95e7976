"""The on-disk compile cache: compiled segments, keyed by what produced them.

An entry is two files, ``<root>/v<format>/<key[:2]>/<key>.bin`` (the raw
bytes) and ``<key>.json`` (its record: the caller's metadata plus ``key``,
``source``, ``size``, ``crc32``, ``created`` and ``format``).  The key, the
record and the checksum that binds an entry to its key and source model are
:mod:`coralrt._compile.cache_format` (re-exported here).  A reader checks the
format, that ``key`` and ``source`` are the ones it asks for, the size and the
CRC-32, so an entry copied to another key's slot (by a sync tool, an import,
a bug) or whose key or source field was edited is never served.

Writers put each file in place with temp file + fsync + rename
(:func:`coralrt._fileio.atomic_write`), data first, JSON last, so the JSON is
the commit record: a reader that finds it finds the whole data next to it.
An entry that fails verification (unparsable JSON, wrong size, wrong
checksum, another key or source) is logged, deleted and rebuilt.
A cache file that cannot be read for lack of permission is not corrupt: it
is logged as a permission problem, left alone, and the model is built
without the cache.
Concurrent compiles of one key are serialised by a lock file next to the
entry, so N processes asking for the same model compile it once.  Errors
while writing (read-only folder, full disk) cost the cache, never the compile.

Besides the lookup by key, :meth:`CompileCache.newest` finds the newest
entry built from a source model without knowing its key (a machine with no
compiler serving an entry compiled elsewhere).  Each :meth:`~CompileCache.put`
leaves a hint ``<root>/v<format>/by-source/<source[:2]>/<source>/<key>/``
after the record (:mod:`coralrt._compile.cache_index`); the hints only name
candidates, each of which is read with the same verification as a lookup by
key.  :meth:`~CompileCache.entries` lists every verified entry (what
``coralrt cache export`` ships, :mod:`coralrt._compile.cache_archive`).
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from pathlib import Path
from typing import Callable, Iterator

from filelock import FileLock, Timeout

from coralrt import _config as config
from coralrt._compile.cache_format import (CACHE_FORMAT_VERSION, KEY_PATTERN as _KEY, Entry,
                                          canonical_json, check_source, checksum as _checksum,
                                          make_key, new_record, record_of)
from coralrt._compile import cache_upkeep
from coralrt._compile.cache_index import SourceIndex, record_source
from coralrt.errors import CacheLockTimeoutError
from coralrt._fileio import atomic_write

__all__ = ["CACHE_FORMAT_VERSION", "Entry", "CompileCache", "make_key"]

log = logging.getLogger("coralrt.cache")



class _Changed(Exception):
    """The entry was replaced or removed while it was being read."""


class _Denied:
    """``_read``'s answer for a cache file it may not read."""


_DENIED = _Denied()


_unlink = cache_upkeep.unlink


class CompileCache:
    """Compiled segments on disk, with atomic writes, a build lock and an LRU size cap.

    ``directory``, ``max_bytes`` and ``enabled`` default to
    :mod:`coralrt._config` (``CORALRT_CACHE_DIR``, ``CORALRT_CACHE_MAX_BYTES``,
    ``CORALRT_CACHE``).  ``lock_timeout`` is how long to wait, in seconds, for
    another process compiling the same key.
    """

    def __init__(self, directory: Path | str | None = None, *, max_bytes: int | None = None,
                 enabled: bool | None = None, lock_timeout: float = 600.0):
        self.root = Path(directory) if directory is not None else config.cache_dir()
        self.max_bytes = int(max_bytes) if max_bytes is not None else config.cache_max_bytes()
        self.enabled = bool(enabled) if enabled is not None else config.cache_enabled()
        self.lock_timeout = lock_timeout
        self.path = self.root / f"v{CACHE_FORMAT_VERSION}"
        self._index = SourceIndex(self.path)

    def __repr__(self) -> str:
        return (f"CompileCache({str(self.root)!r}, max_bytes={self.max_bytes}, "
                f"enabled={self.enabled})")

    def _files(self, key: str) -> tuple[Path, Path, Path]:
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise ValueError(f"cache key must be 64 lowercase hex digits (see make_key), "
                             f"got {key!r}")
        d = self.path / key[:2]
        return d, d / f"{key}.bin", d / f"{key}.json"

    def _unstored(self, key: str, source: str, data: bytes, meta: dict) -> Entry:
        data = bytes(data)
        return Entry(data, *new_record(key, source, data, meta))

    def get(self, key: str, *, source: str) -> Entry | None:
        """The entry stored under ``key`` built from the model whose SHA-256 is
        ``source``, or None (absent, disabled, corrupt, bound to another key or
        source, or unreadable)."""
        self._files(key)
        check_source(source)
        if not self.enabled:
            return None
        found = self._lookup(key, source)
        return None if found is _DENIED else found

    def _lookup(self, key: str, source: str, *,
                keep_foreign: bool = False) -> Entry | _Denied | None:
        """The verified entry, _DENIED or None.  ``keep_foreign``: an entry
        whose record names another source is a plain miss, not removed (the
        question came from an index hint, not from the entry's own key)."""
        _, bin_path, json_path = self._files(key)
        for _ in range(3):
            try:
                return self._read(key, source, bin_path, json_path, keep_foreign)
            except _Changed:
                continue  # a writer or an eviction got in between: look again
        return None

    def _read(self, key: str, source: str, bin_path: Path, json_path: Path,
              keep_foreign: bool = False) -> Entry | _Denied | None:
        try:
            jf = open(json_path, "rb")
        except (FileNotFoundError, NotADirectoryError):
            return None  # absent, or its data is still being written
        except PermissionError as e:
            return self._denied(json_path, e)
        except OSError as e:
            return self._corrupt(key, f"cannot read {json_path.name}: {e}")
        # The JSON file stays open while the data is read, so its inode cannot
        # be reused: comparing it with the path afterwards tells whether
        # someone replaced or removed the entry meanwhile.
        with jf:
            before = os.fstat(jf.fileno())
            problem = foreign = None
            try:
                meta = json.loads(jf.read())
                if not isinstance(meta, dict):
                    raise ValueError("not a JSON object")
                size, checksum = meta["size"], meta["crc32"]
                if meta["format"] != CACHE_FORMAT_VERSION:
                    raise ValueError(f"format {meta['format']!r}")
                if meta["key"] != key:
                    foreign = (f"its record names key {meta['key']!r} (an entry copied "
                               f"from another key?)")
                elif meta["source"] != source:
                    if keep_foreign:
                        return None
                    foreign = (f"it was built from the model with SHA-256 "
                               f"{meta['source']!r}, not {source}")
            except (OSError, ValueError, KeyError, RecursionError) as e:
                problem = f"{json_path.name} is not valid metadata ({e!r})"
            if problem is None and foreign is None:
                try:
                    data = bin_path.read_bytes()
                except PermissionError as e:
                    return self._denied(bin_path, e)
                except OSError as e:
                    problem = f"cannot read {bin_path.name} ({e.strerror or e})"
                else:
                    data_crc32 = zlib.crc32(data)
                    if len(data) != size:
                        problem = f"{bin_path.name} has {len(data)} bytes, expected {size}"
                    elif _checksum(key, source, data_crc32) != checksum:
                        problem = f"{bin_path.name} does not match its CRC-32"
            if problem is not None or foreign is not None:
                try:
                    now = os.stat(json_path)
                except OSError:
                    raise _Changed from None
                if (now.st_ino, now.st_mtime_ns) != (before.st_ino, before.st_mtime_ns):
                    raise _Changed
                if foreign is not None:
                    return self._remove(key, "cache entry %s in %s does not belong to this "
                                             "key and model: %s; rebuilding", foreign)
                return self._corrupt(key, problem)
        try:
            os.utime(bin_path)  # the LRU clock
        except OSError:
            pass  # a read-only cache still serves hits
        return Entry(data, meta, data_crc32)

    def _denied(self, path: Path, error: OSError) -> _Denied:
        log.warning("cannot read compile cache file %s: permission denied (%s); building "
                    "without the cache (check the owner and mode of the files and folders "
                    "under %s)", path, error.strerror or error, self.root)
        return _DENIED

    def invalidate(self, key: str, problem: str) -> None:
        """Remove the entry under ``key`` because its content is unusable
        (``problem`` says why; it is logged as a corrupt entry)."""
        if self.enabled:
            self._corrupt(key, problem)

    def _corrupt(self, key: str, problem: str) -> None:
        return self._remove(key, "corrupt cache entry %s in %s: %s; rebuilding", problem)

    def _remove(self, key: str, message: str, problem: str) -> None:
        log.warning(message, key, self.path, problem)
        _, bin_path, json_path = self._files(key)
        for p in (json_path, bin_path):  # the JSON first: never a JSON without its data
            try:
                _unlink(p)
            except OSError as e:
                log.warning("cannot remove bad cache file %s: %s", p, e)
        return None

    def put(self, key: str, data: bytes, meta: dict, *, source: str,
            created: float | None = None) -> Entry:
        """Store ``data``, built from the model whose SHA-256 is ``source``, with
        ``meta`` under ``key``; raises OSError if it cannot be written.

        ``created`` (seconds since the epoch, default now) is the build time
        recorded, which :meth:`newest` orders by: an imported entry keeps the
        time it was built elsewhere.  The entry is then indexed by source; an
        error doing so costs the index (logged), never the entry.
        """
        d, bin_path, json_path = self._files(key)
        check_source(source)
        data = bytes(data)
        record, data_crc32 = new_record(key, source, data, meta, created=created)
        text = canonical_json(record)  # before touching the disk: bad meta writes nothing
        if not self.enabled:
            return Entry(data, record, data_crc32)  # nothing is stored
        d.mkdir(parents=True, exist_ok=True)
        # Retire an old record first, so that no reader pairs it with the new data.
        _unlink(json_path)
        # Temp file + fsync + rename + folder fsync each (coralrt._fileio); owner-only
        # files, as tempfile.mkstemp made them before.
        atomic_write(bin_path, data, mode=0o600)
        atomic_write(json_path, text, mode=0o600)
        self._index.add(source, key)  # after the record: see SourceIndex.drop
        return Entry(data, record, data_crc32)

    def put_file(self, key: str, file: Path, meta: dict, *, source: str, created: float,
                 data_crc32: int) -> None:
        """Store the file ``file`` as the data of ``key`` (as :meth:`put` stores
        bytes): data too large to hold in memory, streamed by the caller into
        a temporary file in this cache's folder (a name :func:`coralrt._fileio.
        is_temporary` recognises), complete and fsynced, whose CRC-32 is
        ``data_crc32``.  The file is renamed into place, not copied."""
        _, bin_path, json_path = self._files(key)
        check_source(source)
        record = record_of(key, source, os.stat(file).st_size, data_crc32, meta,
                           created=created)
        text = canonical_json(record)
        _unlink(json_path)
        os.replace(file, bin_path)
        atomic_write(json_path, text, mode=0o600)   # also fsyncs the folder of both
        self._index.add(source, key)

    def newest(self, source: str, accept: Callable[[dict], bool]) -> Entry | None:
        """The verified entry built from the model whose SHA-256 is ``source``
        with the largest ``created`` among those whose record ``accept(meta)``
        returns True for; None if there is none or the cache is disabled.

        Cost: the entries of that model, not the whole cache (the first call
        on a cache written before the index existed indexes it once).  Records
        are read first and the data of candidates only, newest first, until
        one verifies.  Hints are removed eagerly by :meth:`evict` and
        :meth:`clear`, and lazily here: a hint whose entry is missing, corrupt
        (the entry is removed, as :meth:`get` does) or bound to another source
        is dropped; an entry of another source is left alone.
        """
        check_source(source)
        if not self.enabled:
            return None
        if not self._index.is_complete():
            self._index.rebuild((f.stem, f) for _, files in self._walk([self.path])
                                for f in files if f.suffix == ".json" and _KEY.fullmatch(f.stem))
        for key in self._index.candidates(source, accept, lambda k: self._files(k)[2]):
            found = self._lookup(key, source, keep_foreign=True)
            if found is None:
                self._index.drop(source, key, self._files(key)[2])
            elif isinstance(found, Entry) and accept(found.meta):
                return found
        return None

    def entries(self) -> Iterator[Entry]:
        """Every verified entry of this format, in key order (each read as
        :meth:`get` reads it: a corrupt entry is logged, removed and skipped)."""
        for key in sorted(self._scan()):
            source = record_source(self._files(key)[2])
            found = self._lookup(key, source) if source is not None else None
            if isinstance(found, Entry):
                yield found

    def get_or_build(self, key: str, build: Callable[[], tuple[bytes, dict]], *,
                     source: str) -> tuple[Entry, bool]:
        """The entry for ``key`` (built from the model whose SHA-256 is
        ``source``) and whether it came from the cache.

        On a miss ``build()`` returns ``(data, meta)``; across processes only
        one builds a given key at a time, the others wait and then read its
        result.  Raises :class:`~coralrt.errors.CacheLockTimeoutError` after
        ``lock_timeout`` seconds of waiting.
        """
        self._files(key)
        check_source(source)
        entry = self._lookup(key, source) if self.enabled else None
        if isinstance(entry, Entry):
            return entry, True
        if entry is _DENIED or not self.enabled:
            return self._unstored(key, source, *build()), False
        d, _, _ = self._files(key)
        lock_path = d / f"{key}.lock"
        try:
            d.mkdir(parents=True, exist_ok=True)
            lock = FileLock(lock_path, timeout=self.lock_timeout)
            lock.acquire()
        except Timeout:
            raise CacheLockTimeoutError(lock_path, self.lock_timeout) from None
        except PermissionError as e:
            log.warning("cannot use compile cache %s: permission denied on %s; building "
                        "without it", self.path, e.filename or lock_path)
            return self._unstored(key, source, *build()), False
        except OSError as e:
            log.warning("compile cache %s is not usable (%s); building without it",
                        self.path, e)
            return self._unstored(key, source, *build()), False
        try:
            entry = self._lookup(key, source)
            if isinstance(entry, Entry):
                return entry, True  # another process built it while we waited
            data, meta = build()
            if entry is _DENIED:
                return self._unstored(key, source, data, meta), False
            try:
                entry = self.put(key, data, meta, source=source)
            except PermissionError as e:
                log.warning("cannot write compile cache entry %s: permission denied on %s",
                            key, e.filename or self.path)
                return self._unstored(key, source, data, meta), False
            except OSError as e:
                log.warning("cannot write compile cache entry %s in %s: %s", key, self.path, e)
                return self._unstored(key, source, data, meta), False
        finally:
            lock.release()
        try:
            self.evict(keep=key)
        except OSError as e:
            log.warning("cannot evict from compile cache %s: %s", self.path, e)
        return entry, False

    # Upkeep (sizes, eviction, clearing): coralrt/_compile/cache_upkeep.py.

    def _walk(self, versions: list[Path]) -> Iterator[tuple[Path, list[Path]]]:
        return cache_upkeep.walk(versions)

    def _scan(self) -> dict[str, tuple[int, float]]:
        """``key -> (bytes on disk, last use)`` for every entry of this format."""
        return cache_upkeep.scan(self.path)

    def evict(self, *, keep: str | None = None) -> int:
        """Remove least recently used entries until the cache fits ``max_bytes``.

        ``keep`` (the entry just written) is never removed.  Returns the
        number of entries removed.
        """
        return cache_upkeep.evict(self, keep)

    def info(self) -> dict:
        """What ``coralrt cache info`` reports."""
        entries = self._scan()
        return {"directory": str(self.root), "enabled": self.enabled,
                "entries": len(entries), "total_bytes": sum(s for s, _ in entries.values()),
                "max_bytes": self.max_bytes, "format_version": CACHE_FORMAT_VERSION}

    def clear(self) -> int:
        """Remove every entry (of every format version), its index hints, and
        leftover temp and lock files; returns the number of entries removed.
        Files coralrt did not write are left alone."""
        return cache_upkeep.clear(self.root)
