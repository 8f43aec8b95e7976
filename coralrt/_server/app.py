"""The compile service's HTTP interface (aiohttp).

Routes:

- ``GET /health``: ``{"status": "ok", "service": ..., "coralrt": version,
  "compiler": {"id", "version"}, "limits": {...}, "load": {...}}``.  Without
  the token (when one is set) only ``{"status": "ok"}``: enough for a
  liveness probe, nothing about the machine.
- ``POST /compile``: the body is one plain ``.tflite`` (an Edge TPU segment as
  coralrt extracts it, or a whole model).  The answer (200) is a JSON object:
  ``source_sha256`` (of the upload), ``sha256`` and ``size`` of the compiled
  model, ``compiled`` (its bytes, base64), ``log`` (edgetpu_compiler's
  output and log file), ``compiler``, ``cache_hit`` and ``compile_seconds``.

Every error is a JSON object ``{"error": message}`` (plus ``log_tail`` for a
compiler failure): 400 for an empty, truncated, non-TFLite, invalid or
already compiled upload; 401 without the right token
(``Authorization: Bearer <token>``); 404/405 for other paths and methods;
408 when the body does not arrive in time; 413 above the upload limit; 422
when the compiler fails on the model; 503 when every compile slot and the
queue are full, or the uploads in flight fill their memory (with
``Retry-After``); 504 when the compile runs past its time limit.  A request
with ``Expect: 100-continue`` gets its 401 or 413 before any ``100
Continue``.  A bad request never stops the service.  How an upload is read
and bounded: :mod:`coralrt._server.upload`; the connections under the
routes: :mod:`coralrt._server.wire`.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import signal
import ssl
import threading
from contextlib import contextmanager

from aiohttp import web

from coralrt.errors import CacheLockTimeoutError, CompileError
from coralrt._server.service import Busy, CompileService, UploadError
from coralrt._server.upload import received
from coralrt._server.wire import Site, runner_options
from coralrt._version import version as coralrt_version

__all__ = ["make_app", "serve", "running", "tls_context"]

log = logging.getLogger("coralrt.server")

SERVICE = "coralrt-compile-service"
RETRY_AFTER = "5"
_SERVICE_KEY = web.AppKey("service", CompileService)
_TOKEN_KEY = web.AppKey("token", object)


def _error(status: int, message: str, **extra) -> web.Response:
    headers = {"Retry-After": RETRY_AFTER} if status == 503 else None
    if status == 401:
        headers = {"WWW-Authenticate": 'Bearer realm="coralrt"'}
    return web.json_response({"error": message, **extra}, status=status, headers=headers)


def _authorized(request: web.Request) -> bool:
    token = request.app[_TOKEN_KEY]
    if token is None:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    try:
        given_bytes = given.strip().encode("utf-8", "surrogateescape")
    except UnicodeError:    # bytes that are not a token in any encoding
        return False
    return scheme.lower() == "bearer" and hmac.compare_digest(given_bytes, token.encode())


async def _closing(request: web.Request, response: web.Response) -> web.Response:
    """``response`` sent at once, then the connection closed, its body left unread
    (a slow or broken upload is not waited for)."""
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


@web.middleware
async def _errors(request: web.Request, handler):
    """Every answer but a success is a JSON error; nothing escapes as a traceback."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _error(e.status, e.reason if e.text is None or e.text.startswith(
            f"{e.status}:") else e.text)
    except UploadError as e:
        response = _error(e.status, str(e))
        return await _closing(request, response) if e.close else response
    except Busy as e:
        return _error(503, f"busy: {e}")
    except CacheLockTimeoutError as e:
        return _error(503, f"busy: {e}")
    except CompileError as e:
        status = 504 if e.timeout is not None else 422
        return _error(status, e.message, log_tail=e.log_tail)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - reported to the client, logged in full here
        log.exception("internal error on %s %s", request.method, request.path)
        return _error(500, f"internal error: {type(e).__name__}: {e}")


@web.middleware
async def _auth(request: web.Request, handler):
    if request.path == "/health" or _authorized(request):
        return await handler(request)
    return _unauthorized()


def _unauthorized() -> web.Response:
    return _error(401, "missing or wrong token: send the header 'Authorization: Bearer "
                       "<token>'")


async def _health(request: web.Request) -> web.Response:
    if not _authorized(request):
        return web.json_response({"status": "ok"})
    service = request.app[_SERVICE_KEY]
    return web.json_response({
        "status": "ok", "service": SERVICE, "coralrt": coralrt_version(),
        "compiler": service.identity(), "limits": service.limits_dict(),
        "load": service.status()})


async def _compile(request: web.Request) -> web.Response:
    service = request.app[_SERVICE_KEY]
    async with received(request, service) as data:    # the upload's bounds: upload.py
        answer = await service.compile(data)
        compiled = base64.b64encode(answer.pop("compiled"))
    # The base64 text needs no JSON escaping: it is put in as it is, since json.dumps
    # of a string of megabytes costs more than the rest of a cache hit together.
    head = json.dumps(answer, separators=(",", ":")).encode("utf-8")
    body = b"".join((head[:-1], b',"compiled":"', compiled, b'"}'))
    return web.Response(body=body, content_type="application/json")


async def _expect(request: web.Request) -> web.Response | None:
    """``Expect: 100-continue`` on ``POST /compile``: the token and the announced size
    are checked first, so a client without the token gets 401 and never ``100 Continue``."""
    refusal = None
    limit = request.app[_SERVICE_KEY].limits.max_upload_bytes
    if not _authorized(request):
        refusal = _unauthorized()
    elif request.content_length is not None and request.content_length > limit:
        refusal = _error(413, f"the upload has {request.content_length} bytes, more than the "
                              f"service's limit of {limit} (coralrt serve-compiler "
                              f"--max-upload)")
    elif request.headers.get("Expect", "").lower() != "100-continue":
        refusal = _error(417, f"unknown Expect: {request.headers.get('Expect')!r}")
    if refusal is not None:     # the body was not sent: the connection is not reused
        return await _closing(request, refusal)
    if request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0    # the answer proper has not started
    return None


def make_app(service: CompileService, *, token: str | None = None) -> web.Application:
    """The aiohttp application serving ``service`` (``token``: required when given)."""
    app = web.Application(middlewares=[_errors, _auth],
                          client_max_size=service.limits.max_upload_bytes)
    app[_SERVICE_KEY] = service
    app[_TOKEN_KEY] = token
    app.router.add_get("/health", _health)
    app.router.add_post("/compile", _compile, expect_handler=_expect)

    async def _close(_app) -> None:
        service.close()

    app.on_cleanup.append(_close)
    return app


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server TLS context from a PEM certificate (chain) and its private key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def serve(service: CompileService, *, host: str, port: int, token: str | None,
          ssl_context: ssl.SSLContext | None, announce=print) -> None:
    """Run the service until interrupted (SIGINT or SIGTERM)."""
    async def main() -> None:
        runner = web.AppRunner(make_app(service, token=token),
                               **runner_options(logging.getLogger("coralrt.server.access")))
        await runner.setup()
        try:
            site = Site(runner, host, port, ssl_context=ssl_context)
            await site.start()
            announce(f"coralrt compile service on {site.name} "
                     f"({service.compiler.id} {service.compiler.version}; "
                     f"{'token required' if token else 'no token'}; "
                     f"cache {service.cache.root}); Ctrl-C stops it", flush=True)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())


@contextmanager
def running(service: CompileService, *, host: str = "127.0.0.1", port: int = 0,
            token: str | None = None, ssl_context: ssl.SSLContext | None = None):
    """The service on a background thread for the ``with`` block; yields its base URL.

    ``port=0`` takes a free port.  For tests, benchmarks and programs that
    embed the service.
    """
    ready = threading.Event()
    state: dict = {}
    loop = asyncio.new_event_loop()

    async def start() -> None:
        runner = web.AppRunner(make_app(service, token=token), **runner_options())
        await runner.setup()
        site = Site(runner, host, port, ssl_context=ssl_context)
        await site.start()
        state["runner"] = runner
        state["port"] = runner.addresses[0][1]

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            state["error"] = e
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(state["runner"].cleanup())
        loop.close()

    thread = threading.Thread(target=main, name="coralrt-compile-service", daemon=True)
    thread.start()
    ready.wait()
    if "error" in state:
        thread.join()
        raise state["error"]
    scheme = "https" if ssl_context else "http"
    try:
        yield f"{scheme}://{host}:{state['port']}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
