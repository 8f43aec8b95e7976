"""Reading an upload's body, bounded in size, in total memory and in time.

The bounds apply before a request reaches the compile queue:

- one body has at most ``max_upload_bytes`` (HTTP 413; a ``Content-Length``
  above it is refused before anything is read);
- the bodies the service holds at once, being read, waiting for a compile
  slot or compiling, have at most ``max_upload_total`` bytes in all
  (:class:`~coralrt._server.service.Budget`).  A body with a
  ``Content-Length`` reserves that many bytes before it is read, a chunked
  one as its pieces arrive; one that does not fit is refused as busy (HTTP
  503, ``Retry-After``), which clients retry.  The bytes are given back
  once the request is answered;
- the whole body must arrive within ``body_timeout`` seconds of the
  request's head (HTTP 408, and the connection is closed): a client that
  trickles its body, or announces more than it sends, does not hold a
  connection and its memory for longer;
- a body cut short (the client closed its side, or hung up) is HTTP 400.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from coralrt._server.service import Busy, CompileService, UploadError
from coralrt._server.wire import cut_short

__all__ = ["received"]


@asynccontextmanager
async def received(request, service: CompileService):
    """The upload's bytes for the ``async with`` block, held in the service's budget
    until the block ends; UploadError (400, 408, 413) or Busy (503) instead."""
    limits = service.limits
    budget = service.uploads
    taken = [0]
    try:
        try:
            data = await asyncio.wait_for(_read(request, limits.max_upload_bytes, budget,
                                                taken), limits.body_timeout)
        except asyncio.TimeoutError:
            service.counts["slow_uploads"] += 1
            raise UploadError(f"the upload did not arrive within {limits.body_timeout:g} s; "
                              f"a slow link needs a larger limit (coralrt serve-compiler "
                              f"--body-timeout)", 408, close=True) from None
        except Busy:
            service.counts["refused_busy"] += 1
            raise
        yield data
    finally:
        budget.give_back(taken[0])


async def _read(request, limit: int, budget, taken: list) -> bytes:
    length = request.content_length
    if length is not None:
        if length > limit:
            raise UploadError(f"the upload has {length} bytes, more than the service's limit "
                              f"of {limit} (coralrt serve-compiler --max-upload)", 413)
        _take(budget, length, taken)
    body = bytearray()
    try:
        while True:
            piece = await request.content.readany()
            if not piece:
                break
            if len(body) + len(piece) > limit:
                raise UploadError(f"the upload is larger than the service's limit of {limit} "
                                  f"bytes (coralrt serve-compiler --max-upload)", 413)
            if length is None:
                _take(budget, len(piece), taken)
            body += piece
    except (ConnectionError, asyncio.IncompleteReadError, EOFError) as e:
        raise UploadError(f"the upload was cut short ({_why(e)})") from None
    except (UploadError, Busy):
        raise
    except Exception as e:  # noqa: BLE001 - aiohttp's payload errors for a bad body
        if type(e).__module__.startswith("aiohttp"):
            raise UploadError(f"the upload was cut short or malformed ({_why(e)})") from None
        raise
    if cut_short(request.content):
        raise UploadError(f"the upload was cut short: the client closed its side of the "
                          f"connection after {len(body)} bytes", close=True)
    if length is not None and len(body) != length:
        raise UploadError(f"the upload was cut short ({len(body)} of {length} bytes)",
                          close=True)
    return bytes(body)


def _take(budget, size: int, taken: list) -> None:
    if not budget.take(size):
        raise Busy(f"the uploads in flight hold {budget.held} of the {budget.total} bytes the "
                   f"service keeps for them (coralrt serve-compiler --max-upload-total); "
                   f"try again later")
    taken[0] += size


def _why(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
