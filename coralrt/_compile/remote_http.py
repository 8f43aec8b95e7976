"""The ``remote`` compiler's HTTP exchange, bounded in time and in size.

A socket timeout bounds each read: a service that sends one byte every half
second never trips it, and a request would last as long as the service
likes.  Here one deadline (a :func:`time.monotonic` instant) bounds the whole
exchange instead: connecting, the TLS handshake, sending the upload and every
read of the answer each wait at most what is left of it, so a request ends
at most one socket operation past its deadline, and one operation is given
only what is left.  The answer is read in pieces up to a cap: one whose
``Content-Length`` is over the cap is refused before any of it is read, one
without a length as soon as it passes the cap.

:class:`Connection` is an ``http.client`` connection over such a socket;
:func:`read_answer` reads a response's body under the cap.  Both raise
``TimeoutError`` past the deadline and :class:`AnswerTooLarge` over the cap;
:mod:`coralrt._compile.remote` turns them into ``CompileServiceError``.
Only the standard library is used: a Raspberry Pi needs nothing else.
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import time

__all__ = ["AnswerTooLarge", "Connection", "read_answer", "CONNECT_TIMEOUT"]

CONNECT_TIMEOUT = 10.0     # seconds to open the connection (a host that does not answer)
_SEND_PIECE = 1 << 16      # bytes sent per bounded send
_READ_PIECE = 1 << 20      # bytes read per bounded read of the answer


class AnswerTooLarge(Exception):
    """The answer is larger than the cap; ``size`` is its announced length, or None."""

    def __init__(self, size: int | None, cap: int):
        self.size = size
        self.cap = cap
        super().__init__(f"{size} bytes over the cap of {cap}")


def _left(deadline: float) -> float:
    """Seconds left before ``deadline``; TimeoutError when none are."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the request's deadline passed")
    return left


class _Reader(io.RawIOBase):
    """The socket's receiving side, each read waiting at most until the deadline."""

    def __init__(self, sock, deadline: float):
        super().__init__()
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        self._sock.settimeout(_left(self._deadline))
        return self._sock.recv_into(buffer)


class _DeadlineSocket:
    """What ``http.client`` uses of a socket (``sendall``, ``makefile``, ``close``),
    every operation bounded by the deadline."""

    def __init__(self, sock, deadline: float):
        self._sock = sock
        self._deadline = deadline

    def sendall(self, data) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), _SEND_PIECE):
            self._sock.settimeout(_left(self._deadline))
            self._sock.sendall(view[start:start + _SEND_PIECE])

    def makefile(self, mode: str = "rb", *args, **kwargs):
        return io.BufferedReader(_Reader(self._sock, self._deadline))

    def close(self) -> None:
        self._sock.close()

    def __getattr__(self, name):
        return getattr(self._sock, name)


class Connection(http.client.HTTPConnection):
    """An HTTP(S) connection whose connect, handshake, sends and reads end by ``deadline``.

    ``context``: an ``ssl.SSLContext`` for ``https`` (the host name is checked
    against the certificate), None for plain ``http``.
    """

    def __init__(self, host: str, port: int, *, deadline: float,
                 context: ssl.SSLContext | None = None):
        super().__init__(host, port)
        self.deadline = deadline
        self._context = context

    def connect(self) -> None:
        wait = min(CONNECT_TIMEOUT, _left(self.deadline))
        sock = socket.create_connection((self.host, self.port), wait)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._context is not None:
                sock = self._context.wrap_socket(sock, server_hostname=self.host,
                                                 do_handshake_on_connect=False)
                sock.settimeout(_left(self.deadline))
                sock.do_handshake()       # the whole handshake within the timeout
        except BaseException:
            sock.close()
            raise
        self.sock = _DeadlineSocket(sock, self.deadline)


def read_answer(response: http.client.HTTPResponse, cap: int) -> bytearray:
    """The body of ``response``, at most ``cap`` bytes; AnswerTooLarge beyond."""
    length = response.getheader("Content-Length")
    if length is not None and length.strip().isdigit():
        if int(length) > cap:
            raise AnswerTooLarge(int(length), cap)
        if not response.chunked:    # read in place: no copy of the pieces
            body = bytearray(int(length))
            view, got = memoryview(body), 0
            while got < len(body):
                n = response.readinto(view[got:got + _READ_PIECE])
                if not n:
                    raise http.client.IncompleteRead(bytes(body[:got]), len(body) - got)
                got += n
            return body
    body = bytearray()
    while True:
        piece = response.read(min(_READ_PIECE, cap + 1 - len(body)))
        if not piece:
            return body
        body += piece
        if len(body) > cap:
            raise AnswerTooLarge(None, cap)
