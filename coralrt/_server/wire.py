"""The compile service's connections, below the HTTP routes.

aiohttp serves the HTTP; two things are changed under it:

- **A half-closed connection is still answered.**  A client that closes its
  sending side (``shutdown(SHUT_WR)``) can still read.  aiohttp closes such
  a connection at once, so a client whose upload was cut short that way got
  no answer at all, and one that half-closes after a complete request lost
  the compile's answer.  :class:`_Protocol` wraps aiohttp's protocol of each
  connection: when a request is in progress at the end of the client's
  data, its unfinished body ends there and is marked cut short
  (:func:`cut_short`; the route answers 400), and the connection is closed
  after the answer instead of before.  (Over TLS the end of the client's
  data closes the connection, as before: asyncio's TLS transport cannot
  stay half-open.)  Which requests are in progress is read from aiohttp's
  protocol object (``_current_request``, ``_messages``,
  ``_request_in_progress``, with defaults): with an aiohttp that has none of
  them, a half-closed connection is closed as aiohttp does.
- **A malformed request is one line in the log.**  aiohttp logs the
  traceback of every request it cannot parse; anyone who can reach the port
  (no token is needed to send a malformed request) could fill the log with
  them.  :class:`_OneLine` turns each into one warning naming the client
  and what was wrong.

:class:`Site` is a TCP site serving the app's runner with :class:`_Protocol`;
:func:`runner_options` the options an ``AppRunner`` is made with.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["Site", "runner_options", "cut_short", "HTTP_LOG"]

#: The logger aiohttp's protocol writes to (malformed requests, broken connections).
HTTP_LOG = logging.getLogger("coralrt.server.http")


# id() of the bodies ended by a client's half-close; the connection's _Protocol holds
# each of those bodies (so that no other object takes its id) until the connection ends.
_CUT_SHORT: set[int] = set()


def cut_short(payload) -> bool:
    """True when ``payload`` (a request's body stream) ended because the client closed
    its sending side before the end of the body."""
    return id(payload) in _CUT_SHORT


class _OneLine(logging.Filter):
    """A malformed request logged by aiohttp: one warning line, no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            client = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            what = (exc.message or type(exc).__name__).strip().splitlines()
            record.msg, record.args = "malformed request from %s: %s", (client, what[0])
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


HTTP_LOG.addFilter(_OneLine())


def runner_options(access_log: logging.Logger | None = None) -> dict:
    """Keyword arguments of ``web.AppRunner`` for the service."""
    return {"access_log": access_log, "logger": HTTP_LOG}


class _Protocol(asyncio.Protocol):
    """aiohttp's protocol for one connection, answering a request whose client
    half-closed the connection (see the module's docstring)."""

    def __init__(self, inner):
        self._inner = inner
        self._transport = None
        self._tls = False
        self._cut: list = []      # the bodies this connection's half-close ended

    def connection_made(self, transport) -> None:
        self._transport = transport
        self._tls = transport.get_extra_info("sslcontext") is not None
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self):
        if self._tls:
            return self._inner.eof_received()
        # Decided on the next turn of the loop: a request whose head came with the
        # end of the data may sit between aiohttp's queue and its handler's task now.
        asyncio.get_running_loop().call_soon(self._after_eof)
        return True     # the sending side stays open for an answer

    def _after_eof(self) -> None:
        if not _end_requests(self._inner, self._cut) and self._transport is not None:
            self._transport.close()     # nothing to answer: closed, as aiohttp would

    def connection_lost(self, exc) -> None:
        self._transport = None
        self._inner.connection_lost(exc)
        _CUT_SHORT.difference_update(id(payload) for payload in self._cut)
        self._cut.clear()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def _end_requests(handler, cut: list) -> bool:
    """End the bodies of the requests in progress on ``handler``'s connection, and
    close it once they are answered; False when there are none.  The bodies ended
    are added to ``cut``."""
    request = getattr(handler, "_current_request", None)
    queued = getattr(handler, "_messages", None) or ()
    payloads = [request.content] if request is not None else []
    payloads += [payload for _message, payload in queued]
    if not payloads and not getattr(handler, "_request_in_progress", False):
        return False
    for payload in payloads:
        if not payload.is_eof():
            cut.append(payload)
            _CUT_SHORT.add(id(payload))
            payload.feed_eof()
    handler.close()     # no further request on this connection: closed after the answer
    return True


class Site(web.BaseSite):
    """A TCP site (``host``, ``port``; 0 takes a free port) whose connections use
    :class:`_Protocol` around the runner's aiohttp protocol."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, *,
                 ssl_context=None):
        super().__init__(runner, ssl_context=ssl_context)
        self._host = host
        self._port = port

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{scheme}://{host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Protocol(server()), self._host,
                                                self._port, ssl=self._ssl_context,
                                                reuse_address=True)
