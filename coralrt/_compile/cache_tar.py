"""Reading a cache archive's tar stream one member at a time, in bounded memory.

:class:`TarStream` reads a tar file (or the decompressed stream of a
``.tar.gz``) front to back with ``read()`` only: a 512-byte header, then the
member's data in chunks, never a whole member at once.  Headers are parsed
by :meth:`tarfile.TarInfo.frombuf` (checksum, numbers, ustar name prefix),
which reads nothing beyond the block it is given.  Nothing else of
:mod:`tarfile` runs: its reader would follow pax and GNU extension headers,
which it reads whole into memory whatever size they declare.  A cache
archive never has them (``coralrt cache export`` writes plain ustar), so
their headers are refused like any member that is not a regular file.

The end of the archive is its first all-zero block (as :mod:`tarfile` and
GNU tar read it).  What follows it must be zero bytes, at most
:data:`TRAILER_MAX` of them (tar pads an archive to whole records of 10 KiB;
``tar -b 2048`` to 1 MiB): anything else after the end is refused, the same
way whether or not the archive is compressed.  A stream that ends right after
its last member, without the zero blocks, is complete too.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import BinaryIO, Iterator

from coralrt.errors import CacheArchiveError

__all__ = ["BLOCK", "CHUNK", "TRAILER_MAX", "TarStream"]

BLOCK = 512
CHUNK = 1 << 20          # what is read at once: at most this much of a member is in memory
TRAILER_MAX = 1 << 20    # zero bytes accepted after the end of an archive
_REGULAR = (tarfile.REGTYPE, tarfile.AREGTYPE)


class TarStream:
    """The members of the tar stream ``f`` (a binary file object), in order.

    ``path`` names the archive in messages.  Call :meth:`next` for each
    header, then consume its data with :meth:`read`, :meth:`chunks` or
    :meth:`skip` (exactly once) before the next header; :meth:`finish` after
    :meth:`next` returned None checks what follows the end.
    """

    def __init__(self, f: BinaryIO, path: Path):
        self._f = f
        self.path = path
        self._size = None     # the size of the member whose data is still to be consumed

    def _exactly(self, n: int, what: str) -> bytes:
        data = self._f.read(n)
        if len(data) != n:
            raise CacheArchiveError(f"{self.path} is truncated: it ends inside {what}")
        return data

    def next(self) -> tarfile.TarInfo | None:
        """The next member's header, or None at the end of the archive.

        Raises CacheArchiveError for a damaged header and for a member that
        is not a regular file (links, devices, folders, extension headers).
        """
        if self._size is not None:
            raise RuntimeError("the previous member's data was not consumed")
        block = self._f.read(BLOCK)
        if not block or block.count(0) == BLOCK:
            return None
        if len(block) != BLOCK:
            raise CacheArchiveError(f"{self.path} is truncated: it ends inside a member's "
                                    f"header")
        try:
            m = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as e:
            raise CacheArchiveError(f"{self.path} is not a readable tar archive, or it is "
                                    f"truncated or damaged (a member header is invalid: "
                                    f"{e})") from None
        if m.type not in _REGULAR:
            kind = ("a symbolic link" if m.issym() else "a hard link" if m.islnk() else
                    "a directory" if m.isdir() else "a device" if m.isdev() else
                    "an extension header" if m.type in tarfile.GNU_TYPES + tarfile.PAX_TYPES
                    else f"of tar type {m.type!r}")
            raise CacheArchiveError(f"{self.path}: member {m.name!r} is {kind}; a cache "
                                    f"archive holds regular files only; refusing the archive")
        if m.size < 0:
            raise CacheArchiveError(f"{self.path}: member {m.name!r} declares a negative "
                                    f"size; refusing the archive")
        self._size = m.size
        return m

    def chunks(self, what: str) -> Iterator[bytes]:
        """The current member's data, at most :data:`CHUNK` bytes at a time."""
        size, self._size = self._size, None
        if size is None:
            raise RuntimeError("no member's data to read")
        left = size
        while left:
            data = self._exactly(min(left, CHUNK), what)
            left -= len(data)
            yield data
        if size % BLOCK:
            self._exactly(-size % BLOCK, what)

    def read(self, what: str) -> bytes:
        """The current member's data in one piece (for members whose size the
        caller has bounded)."""
        return b"".join(self.chunks(what))

    def skip(self, what: str) -> None:
        for _ in self.chunks(what):
            pass

    def finish(self) -> None:
        """Check that only zero bytes, at most :data:`TRAILER_MAX`, follow the end
        (reading a compressed stream to its end also checks its CRC and length)."""
        rest = 0
        while chunk := self._f.read(1 << 16):
            rest += len(chunk)
            if rest > TRAILER_MAX or chunk.count(0) != len(chunk):
                raise CacheArchiveError(f"{self.path}: unexpected data after the end of the "
                                        f"archive (only zero padding, at most "
                                        f"{TRAILER_MAX:,} bytes, may follow it); refusing "
                                        f"the archive")
