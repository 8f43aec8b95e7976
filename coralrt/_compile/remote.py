"""The ``remote`` compiler: Edge TPU segments compiled by a compile service.

edgetpu_compiler runs on x86-64 Linux only.  A Raspberry Pi (or a fleet of
them) gets real Edge TPU programs from a machine that has it and runs
``coralrt serve-compiler`` (:mod:`coralrt._server`): :class:`RemoteCompiler`
posts each segment, a standalone sub-model, to the service's
``POST /compile`` and reads back what edgetpu_compiler wrote for it (the
compiled ``.tflite`` and the compiler's log).  The answer carries the
SHA-256 of the compiled model, checked here before anything is used, and is
then read exactly as a local edgetpu_compiler run's output
(:func:`coralrt._compile.edgetpu_compiler.package_of`), so operators the
compiler left on the CPU are re-split the same way.

The compiler's identity and version come from the service (``GET
/health``), asked once per process and URL when a compile first needs them;
they are this compiler's ``version`` (``"edgetpu_compiler 16.0.384591198"``)
and so part of every compile-cache key.  Nothing is sent over the network
when the compiler is only registered.

Settings (:mod:`coralrt._config`): ``CORALRT_COMPILER_URL``,
``CORALRT_COMPILER_TOKEN`` / ``CORALRT_COMPILER_TOKEN_FILE``,
``CORALRT_COMPILER_CA``, ``CORALRT_COMPILER_URL_TIMEOUT`` and
``CORALRT_COMPILER_URL_MAX_ANSWER``.  A token is
never sent in clear to another machine: with a token, the URL must be
``https`` unless its host is this machine (an SSH tunnel, a local proxy).

Bounds: a request's timeout is one deadline for all of it (connecting,
sending, every read, busy retries), and its answer is read up to a cap
(``max_answer_bytes``, default 256 MiB), refused unread when its
``Content-Length`` is larger (:mod:`coralrt._compile.remote_http`).

Everything that goes wrong (no route, refused connection, no answer in
time, an answer too large, a refused token, a compiler failure on the
service, an answer that is not JSON or does not verify) raises
:class:`~coralrt.errors.CompileServiceError` naming the URL and the cause.
The stdlib's ``http.client`` is the transport: a Pi needs no extra package
to use a compile service.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import http.client
import ipaddress
import json
import logging
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

from coralrt import _config as config
from coralrt._compile.base import Compiler
from coralrt._compile.edgetpu_compiler import CompiledSegment, package_of, parse_log
from coralrt._compile.remote_http import AnswerTooLarge, Connection, read_answer
from coralrt.errors import CompileServiceError, ConfigError
from coralrt._formats.opnames import EDGETPU_OP
from coralrt._model import Model, load_model

__all__ = ["COMPILER_ID", "DEFAULT_MAX_ANSWER_BYTES", "RemoteCompiler", "check_url",
           "is_loopback"]

log = logging.getLogger("coralrt.compile")

COMPILER_ID = "remote"
HEALTH_TIMEOUT = 15.0     # seconds for the whole GET /health
DEFAULT_MAX_ANSWER_BYTES = config.DEFAULT_COMPILER_URL_MAX_ANSWER
BUSY_RETRIES = 4          # answers 503 (all compile slots and the queue full) retried
_USER_AGENT = "coralrt-remote-compiler"
_IDENTITIES: dict[str, tuple[str, str]] = {}   # url -> (compiler id, version)
_IDENTITIES_LOCK = threading.Lock()


def is_loopback(host: str) -> bool:
    """True for "localhost" and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_url(url: str, *, token: bool) -> tuple[str, str, int, str]:
    """``(scheme, host, port, base path)`` of a compile service URL, or ConfigError.

    With a ``token``, plain ``http`` is refused unless the host is loopback.
    """
    try:
        parts = urlsplit(url)
    except ValueError as e:     # "http://[::1": an unclosed or invalid IPv6 address
        raise ConfigError(f"compile service URL {url!r} is not a valid URL ({e}); an IPv6 "
                          f"address goes in brackets, for example http://[::1]:8765") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"compile service URL {url!r} is not an http:// or https:// URL "
                          f"with a host (for example https://builder.local:8765)")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ConfigError(f"compile service URL {url!r} may not carry a query, a fragment or "
                          f"credentials; give the token with CORALRT_COMPILER_TOKEN or "
                          f"CORALRT_COMPILER_TOKEN_FILE")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 8765)
    except ValueError:
        raise ConfigError(f"compile service URL {url!r} has an invalid port") from None
    if token and parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ConfigError(f"compile service URL {url!r}: refusing to send the token in clear "
                          f"to another machine; use https:// (coralrt serve-compiler "
                          f"--tls-cert/--tls-key, or a TLS reverse proxy), or reach the "
                          f"service through a tunnel to localhost")
    return parts.scheme, parts.hostname, port, parts.path.rstrip("/")


class RemoteCompiler(Compiler):
    """Compiles Edge TPU segments on a compile service; the programs run on a real stick.

    ``url``: the service (default ``CORALRT_COMPILER_URL``); ``token``
    (default ``CORALRT_COMPILER_TOKEN`` or ``_FILE``); ``timeout``: seconds
    one compile request may take in all, busy retries included (default
    ``CORALRT_COMPILER_URL_TIMEOUT``, 240), a deadline that no request
    passes by more than about a second; ``ca_file``: certificates to trust
    for ``https`` (default ``CORALRT_COMPILER_CA``, else the system's);
    ``max_answer_bytes``: the largest answer read (default
    ``CORALRT_COMPILER_URL_MAX_ANSWER``, 256 MiB).
    """

    id = COMPILER_ID
    runs_on = ("coral",)
    op_name = EDGETPU_OP

    def __init__(self, url: str | None = None, *, token: str | None = None,
                 timeout: float | None = None, ca_file=None,
                 max_answer_bytes: int | None = None):
        url = url if url is not None else config.compiler_url()
        if not url:
            raise ConfigError("no compile service URL: set CORALRT_COMPILER_URL or pass one")
        self.url = url.rstrip("/")
        self._token = token if token is not None else config.compiler_token()
        self.scheme, self.host, self.port, self.base = check_url(self.url,
                                                                 token=bool(self._token))
        self.timeout = float(timeout) if timeout is not None else config.compiler_url_timeout()
        self._ca = ca_file if ca_file is not None else config.compiler_ca()
        self.max_answer_bytes = (int(max_answer_bytes) if max_answer_bytes is not None
                                 else config.compiler_url_max_answer())

    def __repr__(self) -> str:
        return f"RemoteCompiler({self.url!r})"

    # -- identity ------------------------------------------------------------------------

    @property
    def identity(self) -> tuple[str, str]:
        """``(compiler id, version)`` of the service's compiler, asked once per URL."""
        with _IDENTITIES_LOCK:
            found = _IDENTITIES.get(self.url)
        if found is None:
            info = self.health()
            compiler = info.get("compiler")
            if not (isinstance(compiler, dict) and isinstance(compiler.get("id"), str)
                    and isinstance(compiler.get("version"), str)):
                raise CompileServiceError(self.url, "GET /health did not name the service's "
                                                    "compiler and its version (is the URL a "
                                                    "coralrt compile service?)")
            found = (compiler["id"], compiler["version"])
            with _IDENTITIES_LOCK:
                _IDENTITIES[self.url] = found
        return found

    @property
    def version(self) -> str:
        """``"<compiler id> <version>"`` of the service's compiler (part of cache keys)."""
        return " ".join(self.identity)

    # -- requests ------------------------------------------------------------------------

    def health(self, timeout: float = HEALTH_TIMEOUT) -> dict:
        """The service's ``GET /health`` answer (with the token, when one is set)."""
        status, body = self._request("GET", "/health", None,
                                     time.monotonic() + timeout, timeout)
        return self._json(status, body, "/health")

    def compile_raw(self, data: bytes) -> tuple[bytes, str, dict]:
        """``(compiled .tflite, compiler log, answer)`` for the model ``data``, verified
        against the SHA-256 the service sends."""
        data = bytes(data)
        sent = hashlib.sha256(data).hexdigest()
        deadline = time.monotonic() + self.timeout
        for attempt in range(BUSY_RETRIES + 1):
            status, body = self._request("POST", "/compile", data, deadline, self.timeout)
            wait = min(2.0 ** attempt, deadline - time.monotonic() - 1.0)
            if status != 503 or attempt == BUSY_RETRIES or wait <= 0:
                break    # a 503 left is reported as busy below
            log.info("compile service %s is busy; trying again in %.0f s", self.url, wait)
            time.sleep(wait)
        answer = self._json(status, body, "/compile")
        return _verified(self.url, answer, sent), str(answer.get("log") or ""), answer

    def compile_segment(self, piece: Model) -> CompiledSegment:
        """The DWN1 package for ``piece``, every operator mapped; SegmentNotMapped
        with the compiler's reasons otherwise (as a local edgetpu_compiler run)."""
        compiled, text, _ = self.compile_raw(piece.to_bytes())
        try:
            model = load_model(compiled)
        except Exception as e:  # noqa: BLE001 - verified bytes that do not load: say so
            raise CompileServiceError(self.url, f"the compiled model it sent does not load: "
                                                f"{e}") from e
        return package_of(piece, model, parse_log(text))

    def _json(self, status: int, body: bytes, path: str) -> dict:
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):    # not JSON, or nested too deeply to read
            answer = None
        if status == 200 and isinstance(answer, dict):
            return answer
        error = answer.get("error") if isinstance(answer, dict) else None
        detail = str(error or bytes(body[:200]).decode("utf-8", "replace").strip()
                     or "no details")
        log_tail = answer.get("log_tail", "") if isinstance(answer, dict) else ""
        if status == 200:
            cause = f"{path} answered with something that is not a JSON object"
        elif status == 401:
            cause = (f"{'refused the token' if self._token else 'requires a token'} "
                     f"(HTTP 401); set CORALRT_COMPILER_TOKEN or CORALRT_COMPILER_TOKEN_FILE "
                     f"to the service's token")
        else:
            cause = f"{path} answered HTTP {status}: {detail}"
        raise CompileServiceError(self.url, cause, status=status, log_tail=str(log_tail or ""))

    def _request(self, method: str, path: str, body: bytes | None, deadline: float,
                 timeout: float) -> tuple[int, bytearray]:
        """``(status, answer body)`` of one request, all of it done by ``deadline``
        (``timeout``: the seconds that deadline stands for, for messages)."""
        headers = {"User-Agent": _USER_AGENT, "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/octet-stream"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        context = None
        if self.scheme == "https":
            context = ssl.create_default_context(cafile=str(self._ca) if self._ca else None)
        conn = Connection(self.host, self.port, deadline=deadline, context=context)
        try:
            try:
                conn.connect()
            except OSError as e:
                raise CompileServiceError(self.url, f"cannot connect: {_why(e)}",
                                          timeout=timeout if _timed_out(e) else None) from e
            try:
                conn.request(method, self.base + path, body=body, headers=headers)
                response = conn.getresponse()
                return response.status, read_answer(response, self.max_answer_bytes)
            except AnswerTooLarge as e:
                size = (f"has {e.size} bytes, more than" if e.size is not None
                        else "runs past")
                raise CompileServiceError(
                    self.url, f"the answer to {method} {path} {size} the largest answer this "
                              f"client reads ({e.cap} bytes); if the service's compiled "
                              f"models are that large, raise "
                              f"{config.COMPILER_URL_MAX_ANSWER} (or max_answer_bytes)") \
                    from None
            except (OSError, http.client.HTTPException) as e:
                raise CompileServiceError(self.url, f"{method} {path} failed: "
                                                    f"{_why(e, timeout)}",
                                          timeout=timeout if _timed_out(e) else None) from e
        finally:
            conn.close()


def _timed_out(e: BaseException) -> bool:
    return isinstance(e, (socket.timeout, TimeoutError))


def _why(e: BaseException, timeout: float | None = None) -> str:
    if _timed_out(e):
        if timeout is None:
            return "no answer in time (timed out)"
        return f"no complete answer within {timeout:g} s (timed out)"
    if isinstance(e, ssl.SSLCertVerificationError):
        return (f"its TLS certificate does not verify ({e.verify_message}); give the "
                f"service's certificate or CA with CORALRT_COMPILER_CA")
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (is coralrt serve-compiler running there, on that port?)"
    if isinstance(e, socket.gaierror):
        return f"unknown host ({e.strerror or e})"
    if isinstance(e, http.client.RemoteDisconnected):
        return "the service closed the connection without answering"
    text = getattr(e, "strerror", None) or str(e) or type(e).__name__
    return text


def _verified(url: str, answer: dict, sent: str) -> bytes:
    """The compiled model of ``answer``, after checking it against the SHA-256 and
    size the service sent and that it answers the model that was sent."""
    if answer.get("source_sha256") != sent:
        raise CompileServiceError(url, f"the answer is for another model (SHA-256 "
                                       f"{str(answer.get('source_sha256'))[:16]}..., sent "
                                       f"{sent[:16]}...)")
    try:
        compiled = base64.b64decode(answer["compiled"])   # the SHA-256 below checks it
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise CompileServiceError(url, "the answer has no valid base64 'compiled' "
                                       "model") from None
    digest = hashlib.sha256(compiled).hexdigest()
    if digest != answer.get("sha256") or len(compiled) != answer.get("size"):
        raise CompileServiceError(url, f"the compiled model does not match the SHA-256 and "
                                       f"size in the answer ({len(compiled)} bytes, SHA-256 "
                                       f"{digest[:16]}...): damaged in transit; nothing was "
                                       f"cached")
    return compiled
