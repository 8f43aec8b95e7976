"""What the compile service does with an upload, apart from HTTP.

:class:`CompileService` checks an uploaded segment, compiles it with
edgetpu_compiler (:class:`~coralrt._compile.edgetpu_compiler.EdgeTpuCompiler`,
which runs the binary without a shell, under a time limit, killing its whole
process group past it) and keeps the results in a compile cache of its own
(:class:`~coralrt._compile.cache.CompileCache`), keyed by the upload's bytes,
the compiler's arguments and the compiler's id and version.  The same
segment posted by fifty clients is compiled once:

- requests for a key being compiled wait for that compile (one task per key
  in this process, whatever the number of requests);
- the cache's lock file serialises compiles of one key across processes (two
  services sharing a cache folder);
- later requests are cache hits.

Limits: at most ``max_concurrent`` compiles run at once; at most
``max_queue`` more wait for a slot, beyond which a request is refused as
busy (:class:`Busy`, HTTP 503, which clients retry).  Before that, while
an upload is read (:mod:`coralrt._server.upload`): one upload has at most
``max_upload_bytes``, all the uploads the service holds at once (being
read, waiting or compiling) at most ``max_upload_total`` (more is 503
busy), and one body must arrive within ``body_timeout`` seconds (HTTP 408).  A compiler failure is
not cached: edgetpu_compiler is known to fail and then succeed on the same
model.  What was written by a compile that failed or timed out never
enters the cache, and a compiled output is cached only after it loads as a
TFLite model.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from coralrt._compile.cache import CompileCache, make_key
from coralrt.errors import CompileError, ConfigError, ModelError
from coralrt._model import load_model
from coralrt._model.compiled import compiled_by

__all__ = ["CompileService", "Limits", "Budget", "UploadError", "Busy"]

log = logging.getLogger("coralrt.server")

TFLITE_ID = b"TFL3"      # the file identifier at bytes 4..8 of every TFLite model


class UploadError(Exception):
    """The upload is not something the service compiles (HTTP 4xx).

    ``close``: the connection is closed after the answer (its body was not read).
    """

    def __init__(self, message: str, status: int = 400, *, close: bool = False):
        super().__init__(message)
        self.status = status
        self.close = close


class Busy(Exception):
    """Every compile slot is taken and the queue is full (HTTP 503)."""


@dataclass(frozen=True)
class Limits:
    max_upload_bytes: int = 64 << 20     # one segment; Edge TPU models are a few MB
    max_concurrent: int = 2              # compiler runs at once
    max_queue: int = 32                  # requests waiting for a compile slot
    max_upload_total: int = 256 << 20    # the uploads held in memory at once, in all
    body_timeout: float = 60.0           # seconds for one upload's body to arrive

    def __post_init__(self):
        if self.max_upload_total < self.max_upload_bytes:
            raise ConfigError(f"the memory for uploads in flight (--max-upload-total, "
                              f"{self.max_upload_total} bytes) must hold at least one "
                              f"largest upload (--max-upload, {self.max_upload_bytes} bytes)")
        if not self.body_timeout > 0:
            raise ConfigError(f"--body-timeout must be a positive number of seconds, not "
                              f"{self.body_timeout!r}")


class Budget:
    """The bytes of uploads the service holds at once, at most ``total``.

    :meth:`take` before bytes are read, :meth:`give_back` once the request is
    answered (or refused).  Used from the event loop only.
    """

    def __init__(self, total: int):
        self.total = total
        self.held = 0
        self.peak = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.total:
            return False
        self.held += size
        self.peak = max(self.peak, self.held)
        return True

    def give_back(self, size: int) -> None:
        self.held -= size


class CompileService:
    """Compiles uploaded segments with ``compiler``, caching results in ``cache``.

    ``compiler`` needs ``id``, ``version``, ``extra_args`` and
    ``compile_raw(data) -> (compiled bytes, log text)``.  Use from one event
    loop; the compiler and the cache run on worker threads.
    """

    def __init__(self, compiler, cache: CompileCache, limits: Limits = Limits()):
        self.compiler = compiler
        self.cache = cache
        self.limits = limits
        self._slots = asyncio.Semaphore(limits.max_concurrent)
        self._pool = ThreadPoolExecutor(limits.max_concurrent, thread_name_prefix="compile")
        self._inflight: dict[str, asyncio.Task] = {}
        self.uploads = Budget(limits.max_upload_total)
        self.waiting = 0
        self.running = 0
        self.counts = {"requests": 0, "compiles": 0, "cache_hits": 0, "failures": 0,
                       "refused_busy": 0, "slow_uploads": 0}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def identity(self) -> dict:
        return {"id": self.compiler.id, "version": self.compiler.version}

    def limits_dict(self) -> dict:
        """The limits ``GET /health`` reports; the compile time limit is the compiler's."""
        return {**dataclasses.asdict(self.limits), "compile_timeout": self.compiler.timeout}

    def status(self) -> dict:
        return {"compiling": self.running, "waiting": self.waiting,
                "upload_bytes": self.uploads.held, "upload_bytes_peak": self.uploads.peak,
                **self.counts}

    async def compile(self, data: bytes) -> dict:
        """The answer for an uploaded model: the compiled model, its SHA-256, the log."""
        self.counts["requests"] += 1
        source = _digest(data)
        key = make_key(model_sha256=source, options={"args": list(self.compiler.extra_args)},
                       compiler_id=self.compiler.id, compiler_version=self.compiler.version)
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(self._build(key, source, data))
            task.add_done_callback(_retrieve)
            self._inflight[key] = task
            task.add_done_callback(lambda _t: self._inflight.pop(key, None))
        # shield: a client that hangs up does not cancel the compile others wait for.
        compiled, text, hit, seconds = await asyncio.shield(task)
        return {"source_sha256": source, "sha256": hashlib.sha256(compiled).hexdigest(),
                "size": len(compiled), "compiled": compiled, "log": text,
                "compiler": self.identity(), "cache_hit": hit, "compile_seconds": seconds}

    async def _build(self, key: str, source: str, data: bytes) -> tuple[bytes, str, bool, float]:
        loop = asyncio.get_running_loop()
        entry = await loop.run_in_executor(None, lambda: self.cache.get(key, source=source))
        if entry is not None:   # the same bytes were checked when they were compiled
            self.counts["cache_hits"] += 1
            return entry.data, str(entry.meta.get("log", "")), True, 0.0
        await loop.run_in_executor(None, _check_model, data)
        if self._slots.locked() and self.waiting >= self.limits.max_queue:
            self.counts["refused_busy"] += 1
            raise Busy(f"{self.limits.max_concurrent} compiles are running and "
                       f"{self.waiting} requests are waiting; try again later")
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            entry, hit = await loop.run_in_executor(
                self._pool, lambda: self.cache.get_or_build(key, lambda: self._run(data),
                                                            source=source))
        except CompileError:
            self.counts["failures"] += 1
            raise
        finally:
            self.running -= 1
            self._slots.release()
        if hit:
            self.counts["cache_hits"] += 1
        return (entry.data, str(entry.meta.get("log", "")), hit,
                float(entry.meta.get("compile_seconds", 0.0)))

    def _run(self, data: bytes) -> tuple[bytes, dict]:
        """One compiler run (a worker thread): what the cache stores on success."""
        self.counts["compiles"] += 1
        t0 = time.perf_counter()
        compiled, text = self.compiler.compile_raw(data)
        try:
            load_model(compiled)
        except ModelError as e:
            raise CompileError(f"the compiler's output does not load as a TFLite model: {e}",
                               log_tail=text[-2000:]) from None
        seconds = time.perf_counter() - t0
        log.info("compiled a %d-byte segment into %d bytes in %.1f s", len(data),
                 len(compiled), seconds)
        return compiled, {"log": text, "compile_seconds": seconds,
                          "compiler": f"{self.compiler.id} {self.compiler.version}"}


def _retrieve(task: asyncio.Task) -> None:
    # Mark a failure as seen even when every requester has gone away meanwhile.
    if not task.cancelled():
        task.exception()


def _digest(data: bytes) -> str:
    """The upload's SHA-256, or UploadError when it cannot be a TFLite model at all."""
    if not data:
        raise UploadError("the request body is empty; POST the segment's .tflite bytes")
    if len(data) < 8 or data[4:8] != TFLITE_ID:
        raise UploadError("the upload is not a TFLite model (no TFL3 file identifier)")
    return hashlib.sha256(data).hexdigest()


def _check_model(data: bytes) -> None:
    """UploadError unless ``data`` is a valid plain (not compiled) TFLite model."""
    try:
        model = load_model(data)
    except ModelError as e:
        raise UploadError(f"the upload is not a valid TFLite model: {e}") from None
    by = compiled_by(model)
    if by is not None:
        raise UploadError(f"the upload is already compiled (by {by}); send the plain model")
