"""The compile cache's index by source model: which keys were built from which model.

:meth:`coralrt._compile.cache.CompileCache.newest` finds the entries of one
source model without knowing their keys (a Raspberry Pi without a compiler
does not know which compiler version built them).  For that, each stored
entry has a hint, an empty folder::

    <root>/v<format>/by-source/<source[:2]>/<source>/<key>/

An empty folder rather than a marker file: ``mkdir`` is atomic, has no
content that could be half written or damaged, needs no temp file, and
leaves the cache's file list (the entries' ``.bin``/``.json`` files) as it
was.  Listing ``<source>/`` costs what the entries of that model cost, not
what the whole cache costs.

The entries stay the source of truth; a hint is only a hint.  A hint whose
entry is missing, corrupt or records another source is ignored and removed
when it is met (see :meth:`SourceIndex.drop`), and every candidate is read
through the cache's verified read.  Writing the index follows the cache's
rule for writes: an error costs the index (logged), never the entry.
Entries written before the index existed (or while it could not be written)
are indexed once, by a scan of the whole cache on the first lookup by
source; the file ``by-source/complete`` records that this was done.
"""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Callable, Iterable

from coralrt._compile.cache_format import KEY_PATTERN
from coralrt._fileio import atomic_write

__all__ = ["INDEX_DIR", "SourceIndex", "record_source"]

log = logging.getLogger("coralrt.cache")

INDEX_DIR = "by-source"
_COMPLETE = "complete"
_SHARD = re.compile(r"[0-9a-f]{2}")


def record_source(json_path: Path) -> str | None:
    """The ``source`` an entry's record names, or None (absent, unreadable, not a record).

    Only the record is read, not the data: a hint for the index, never a
    verified answer.
    """
    try:
        record = json.loads(json_path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    source = record.get("source") if isinstance(record, dict) else None
    return source if isinstance(source, str) and KEY_PATTERN.fullmatch(source) else None


class SourceIndex:
    """The hints under ``<version folder>/by-source``."""

    def __init__(self, version_dir: Path):
        self.path = version_dir / INDEX_DIR

    def _folder(self, source: str) -> Path:
        return self.path / source[:2] / source

    def add(self, source: str, key: str) -> bool:
        """Record that ``key`` was built from ``source``; False (logged) if it
        cannot be written."""
        try:
            (self._folder(source) / key).mkdir(parents=True, exist_ok=True)
            return True
        except OSError as e:
            log.warning("cannot index compile cache entry %s by its source model in %s: %s; "
                        "the entry is still found by its key", key, self.path, e)
            return False

    def keys(self, source: str) -> list[str]:
        """The keys hinted for ``source`` (unverified)."""
        try:
            names = [p.name for p in self._folder(source).iterdir()]
        except OSError:
            return []  # no entry of this model, or an unreadable index: no hints
        return sorted(n for n in names if KEY_PATTERN.fullmatch(n))

    def candidates(self, source: str, accept: Callable[[dict], bool],
                   record_path: Callable[[str], Path]) -> list[str]:
        """The keys hinted for ``source`` whose record names ``source`` and is
        accepted by ``accept``, newest ``created`` first (ties: by key).

        Only the records are read (``record_path(key)`` is a key's record
        file); a hint whose record is gone or names another source is
        dropped.  A record that does not parse is ranked last: the caller's
        verified read decides about it.
        """
        ranked = []
        for key in self.keys(source):
            json_path = record_path(key)
            try:
                record = json.loads(json_path.read_bytes())
            except FileNotFoundError:
                self.drop(source, key, json_path)
                continue
            except (OSError, ValueError, RecursionError):
                record = None
            if isinstance(record, dict):
                if record.get("source") != source:
                    self.drop(source, key, json_path)
                    continue
                if not accept(record):
                    continue
                created = record.get("created")
                if isinstance(created, (int, float)) and not isinstance(created, bool):
                    ranked.append((-created, key))
                    continue
            ranked.append((math.inf, key))
        return [key for _, key in sorted(ranked)]

    def remove(self, source: str, key: str) -> None:
        """Remove the hint ``source -> key`` if there is one (errors are logged, not raised)."""
        try:
            (self._folder(source) / key).rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.debug("cannot remove compile cache index hint %s/%s: %s", source, key, e)

    def drop(self, source: str, key: str, json_path: Path) -> None:
        """Remove a hint found wrong, unless the entry's record names ``source`` again.

        A writer stores the record first and the hint after it, so checking
        the record after removing the hint keeps the hint of an entry that was
        (re)written meanwhile.
        """
        self.remove(source, key)
        if record_source(json_path) == source:
            self.add(source, key)

    def is_complete(self) -> bool:
        return (self.path / _COMPLETE).is_file()

    def rebuild(self, records: Iterable[tuple[str, Path]]) -> None:
        """Index every ``(key, record path)`` given, then mark the index complete."""
        for key, json_path in records:
            source = record_source(json_path)
            if source is not None and not self.add(source, key):
                return  # the index cannot be written: try again next time
        try:
            atomic_write(self.path / _COMPLETE,
                         "every entry of this folder's cache has a hint here\n", mode=0o600)
        except OSError as e:
            log.debug("cannot mark the compile cache index %s complete: %s", self.path, e)

    def clear(self) -> None:
        """Remove every hint and the completion mark, and the folders left empty;
        anything coralrt did not write is left alone."""
        if not self.path.is_dir():
            return
        for shard in self.path.iterdir():
            if not (_SHARD.fullmatch(shard.name) and shard.is_dir()):
                continue
            for folder in shard.iterdir():
                if KEY_PATTERN.fullmatch(folder.name) and folder.is_dir():
                    for hint in folder.iterdir():
                        if KEY_PATTERN.fullmatch(hint.name):
                            self.remove(folder.name, hint.name)
                    _rmdir(folder)
            _rmdir(shard)
        try:
            (self.path / _COMPLETE).unlink()
        except OSError:
            pass
        _rmdir(self.path)


def _rmdir(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass  # not empty: someone else's file, or a hint just written
