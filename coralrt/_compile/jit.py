"""Just-in-time compilation with the on-disk cache.

``jit_compile`` is what ``InferenceSession(path, target="sim")`` calls on
load: the first time a model is seen it is partitioned and compiled; later
loads (in any process) read the compiled model from the cache.  The cache
key covers the model bytes, the partition options, the compiler's id and
version and the cache format, so changing any of them compiles again.

A cached entry is used only if it is the build of this key and this model
(checked by the cache), its compiled model loads, has the source model's
inputs and outputs (:mod:`coralrt._compile.cache_origin`: an entry whose
digests were forged to match is caught here), and every coralrt segment in
it has an intact header and the body its header's CRC-32 describes;
otherwise it is logged, removed and rebuilt, so that a bad entry never stays
in the cache failing every session.  The segment check costs no second pass
over the segment bytes (see ``_segment_problem``).
"""

from __future__ import annotations

import logging
import struct
import time
import zlib
from dataclasses import dataclass

import numpy as np

from coralrt._compile.base import Compiler, as_compiler
from coralrt._compile.cache import CompileCache, Entry, make_key
from coralrt._compile.cache_origin import RECORD_FIELD, io_problem, model_io, source_io
from coralrt._compile.digest import model_digest
from coralrt._compile.segments import compile_model
from coralrt._compile.rewrite.base import cache_options, run_rewrites
from coralrt._compile.native import NativeCompiler
from coralrt._compile.partition import MODES
from coralrt._compile.rules import RULES_VERSION
from coralrt import _config as config
from coralrt.errors import ConfigError, ModelError
from coralrt._formats.crc import crc32_combine
from coralrt._formats.opnames import SEGMENT_OP
from coralrt._formats.segment_codec import FORMAT_VERSION, HEADER_SIZE, MAGIC
from coralrt._model import Model, load_model

__all__ = ["JitResult", "jit_compile"]

log = logging.getLogger("coralrt.compile")


@dataclass
class JitResult:
    model: Model          # the compiled model (segments as coralrt-segment operators)
    compile_info: dict    # cache_hit, compile_seconds, key, compiler, mode, segments, ...


def jit_compile(source, *, mode: str = "multi", compiler: Compiler | None = None,
                cache: CompileCache | None = None, rules=None, rules_fingerprint=None,
                events=None, parsed: Model | None = None, rewrites=()) -> JitResult:
    """The compiled form of ``source`` (a path, the model's bytes, or a Model).

    On a cache hit the source model is neither parsed nor validated again:
    its compiled form was made from these exact bytes after validation.  On
    a miss it is parsed once, unless the caller already did so and passes
    the result as ``parsed`` (``source`` still keys the cache), and the
    compiled model built here is used as it is, not read back from its bytes.
    ``rules`` (a RuleRegistry with plugin operators) and its
    ``rules_fingerprint`` come from the plugin host; ``events(**event)``
    receives cache hits and misses, the planned segments, each compiled
    segment and the end of a compile (the ``coralrt_compile_event`` kinds).
    ``rewrites``: the rewrite objects to apply before partitioning, in order
    (:func:`coralrt._compile.rewrite.select_rewrites`); their names and
    versions key the cache, and ``compile_info["rewrites"]`` lists what they
    replaced.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown partition mode {mode!r}; choose one of {', '.join(MODES)}")
    start = time.perf_counter()
    compiler = as_compiler(compiler or NativeCompiler())
    cache = cache if cache is not None else CompileCache()
    model = source if isinstance(source, Model) else parsed
    digest, data = _digest(source, cache)
    options = _options(mode, rules_fingerprint, rewrites)
    emit = events or (lambda **event: None)
    key = make_key(model_sha256=digest, options=options, compiler_id=compiler.id,
                   compiler_version=compiler.version)

    built: list[Model] = []     # the compiled model, when this call builds it

    def build() -> tuple[bytes, dict]:
        nonlocal model
        t0 = time.perf_counter()
        if model is None:
            model = load_model(data if data is not None else source)
        emit(kind="cache_miss", key=key)
        rewritten = run_rewrites(model, list(rewrites), rules=rules)
        for line in rewritten.lines():
            log.info("%s", line)
        result = compile_model(
            rewritten.model, mode=mode, compiler=compiler, rules=rules, origin=rewritten.origin,
            on_plan=lambda plan: emit(kind="segments_planned", key=key,
                                      segments=len(plan.segments),
                                      operators=plan.summary["tpu_ops"]),
            on_segment=lambda i, n, size, secs: emit(kind="segment_compiled", key=key,
                                                     segment=i, operators=n, bytes=size,
                                                     seconds=secs))
        out = result.to_bytes()
        emit(kind="compiled", key=key, segments=len(result.plan.segments),
             operators=result.plan.summary["tpu_ops"], seconds=time.perf_counter() - t0)
        built.append(result.model)
        log.info("compiled %d Edge TPU segment(s) (%d of %d operators) in %.0f ms",
                 len(result.plan.segments), result.plan.summary["tpu_ops"],
                 len(model.main.operators), 1e3 * (time.perf_counter() - t0))
        # compiler_id, compiler_version and device_kinds let jit_lookup find the
        # entry without the compiler (a Pi using an entry compiled elsewhere).
        return out, {"compiler": f"{compiler.id} {compiler.version}", "options": options,
                     "compiler_id": compiler.id, "compiler_version": compiler.version,
                     "device_kinds": sorted(compiler.runs_on),
                     "build_seconds": time.perf_counter() - t0,
                     "summary": result.plan.summary, RECORD_FIELD: model_io(model),
                     "placement": [[o.unit, o.segment, o.reason] for o in result.plan.ops],
                     "rewrites": rewritten.lines()}

    # A cached entry that does not load or whose segments do not verify is
    # removed and built again; if the second answer is bad too (another
    # process stored a bad one meanwhile), build without the cache.
    for _ in range(2):
        count = len(built)
        entry, hit = cache.get_or_build(key, build, source=digest)
        compiled = built[-1] if len(built) > count else _cached_model(
            entry, key, cache, lambda: source_io(source, data, model))
        if compiled is not None:
            break
    else:
        out, meta = build()
        entry, hit, compiled = Entry(out, meta), False, built[-1]
    if hit:
        log.info("compiled model found in the cache (%s)", key[:12])
        emit(kind="cache_hit", key=key)
    return JitResult(compiled, _info(entry, hit, start, key, mode, cache))


def jit_lookup(source, *, device_kind: str, mode: str = "multi", cache=None,
               rules_fingerprint=None, rewrites=()) -> JitResult | None:
    """The newest cached compile of ``source`` for ``device_kind`` devices, or None.

    No compiler is needed: the entry is found by the source model's SHA-256
    and the partition options, whichever compiler (and version) built it, as
    long as its programs run on ``device_kind`` (``"coral"``, formerly
    ``"usb"``: a real stick; a local edgetpu_compiler, an emulated one or a
    compile service).  This is
    how a machine without a compiler, or whose compile service is down, uses
    an entry compiled elsewhere (``coralrt cache import``).  The entry is
    checked as a hit of :func:`jit_compile` is.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown partition mode {mode!r}; choose one of {', '.join(MODES)}")
    start = time.perf_counter()
    cache = cache if cache is not None else CompileCache()
    if not cache.enabled:
        return None
    digest, data = _digest(source, cache)
    options = _options(mode, rules_fingerprint, rewrites)

    def accept(meta: dict) -> bool:
        kinds = meta.get("device_kinds")
        # Entries written before the Edge TPU kind was called "coral" say "usb".
        return meta.get("options") == options and isinstance(kinds, list) \
            and config.device_kind(device_kind) in map(config.device_kind, kinds)

    entry = cache.newest(digest, accept)
    if entry is None:
        return None
    key = entry.meta["key"]
    compiled = _cached_model(entry, key, cache, lambda: source_io(source, data))
    if compiled is None:
        return None
    log.info("compiled model found in the cache (%s, built by %s)", key[:12],
             entry.meta.get("compiler"))
    return JitResult(compiled, _info(entry, True, start, key, mode, cache))


def _digest(source, cache: CompileCache) -> tuple[str, bytes | None]:
    if isinstance(source, Model):
        return model_digest(source.to_bytes(), None)
    return model_digest(source, cache.path / "sources" if cache.enabled else None)


def _options(mode: str, rules_fingerprint, rewrites=()) -> dict:
    """The partition options that key a compile (with the compiler's id and version)."""
    options = {"mode": mode, "rules": RULES_VERSION}
    if rules_fingerprint:
        options["plugin_ops"] = rules_fingerprint
    if rewrites:
        options["rewrites"] = cache_options(rewrites)
    return options


def _info(entry: Entry, hit: bool, start: float, key: str, mode: str,
          cache: CompileCache) -> dict:
    return {
        "cache_hit": hit,
        "compile_seconds": time.perf_counter() - start,
        "key": key,
        "compiler": entry.meta.get("compiler"),
        "mode": mode,
        "segments": entry.meta.get("summary", {}).get("segments"),
        "summary": entry.meta.get("summary"),
        "placement": entry.meta.get("placement"),
        "rewrites": [r for r in (entry.meta.get("rewrites") or [])
                     if isinstance(r, str)] if isinstance(entry.meta.get("rewrites"), list)
        else [],
        "cache_dir": str(cache.path) if cache.enabled else None,
    }


def _cached_model(entry: Entry, key: str, cache: CompileCache, interface) -> Model | None:
    """The compiled model of a cache hit, or None after removing an entry that
    a broken build wrote or that was compiled from another model (the cache
    verified its bytes, not their meaning).  ``interface()`` is the source
    model's inputs and outputs (cache_origin.source_io)."""
    meta = entry.meta
    placement = meta.get("placement")
    # The entry's checksum covers its data, key and source, not this description
    # of the build; compile_info passes it on, so its shape is checked here.
    if not (isinstance(meta.get("summary"), dict) and isinstance(meta.get("compiler"), str)
            and isinstance(placement, list)
            and all(isinstance(row, list) and len(row) == 3 for row in placement)):
        problem = "its metadata has no valid build summary and placement"
    else:
        try:
            compiled = load_model(entry.data)
        except ModelError as e:
            problem = f"its compiled model does not load ({e})"
        else:
            problem = io_problem(model_io(compiled), interface())
            if problem is not None:
                problem = f"it was not compiled from this model: {problem}"
            else:
                problem = _segment_problem(compiled, entry)
            if problem is None:
                return compiled
    cache.invalidate(key, problem)
    return None


# -- segment check ---------------------------------------------------------------------
#
# The segment decoder (coralrt._formats.segment_codec.decode) runs on a segment's
# first run and takes longer than the whole cache hit (about 7 ms for MobileNet
# v2's one segment, against about 2 ms for the JIT's cache hit), so it is not run
# here.
# What is checked is the header (docs/segment-format.md) and the body's CRC-32
# it records: together they catch a segment that was cut, misplaced or damaged
# before its entry's checksum was taken.  A segment whose bytes match its CRC
# but do not decode would have been written so by the encoder itself; that is
# not caught before the first run.
#
# A second CRC-32 over the segment bodies would add about 40% to the cache hit.
# It is not needed: CRC-32 is linear, and the cache has just verified the CRC-32
# of the whole data.  Computing that whole-data CRC again from the bytes around
# the segment bodies and the body CRCs their headers claim (crc32_combine) gives
# the verified value if and only if every claim is right.

_SEGMENT_HEAD = struct.Struct("<8sHHIQI")  # magic, version, flags, header size, total, CRC-32


def _segment_problem(compiled: Model, entry: Entry) -> str | None:
    """Why a coralrt segment of ``compiled`` (read from ``entry``) is bad, or None."""
    checks = []  # (operator index, segment bytes, CRC-32 its header records)
    for i, op in enumerate(compiled.main.operators):
        if op.name != SEGMENT_OP:
            continue
        seg = memoryview(op.custom_options if op.custom_options is not None else b"")
        seg = seg.cast("B") if seg.format != "B" or seg.ndim != 1 else seg
        if len(seg) < HEADER_SIZE or bytes(seg[:8]) != MAGIC:
            return f"operator {i} ({SEGMENT_OP}) does not hold a coralrt segment"
        magic, version, flags, header_size, total, crc = _SEGMENT_HEAD.unpack_from(seg)
        if (version, flags, header_size, total) != (FORMAT_VERSION, 0, HEADER_SIZE, len(seg)):
            return (f"the segment of operator {i} has a bad header (version {version}, flags "
                    f"{flags:#x}, header size {header_size}, total size {total} for "
                    f"{len(seg)} bytes)")
        checks.append((i, seg, crc))
    if not checks:
        return None
    spans = _spans(checks, entry.data) if entry.data_crc32 is not None else None
    if spans is not None and _claimed_crc(entry.data, spans) == entry.data_crc32:
        return None
    for i, seg, crc in checks:  # direct: no verified CRC to lean on, or a claim is wrong
        if zlib.crc32(seg[HEADER_SIZE:]) != crc:
            return f"the segment of operator {i} does not match its CRC-32"
    return None


def _address(buf) -> int:
    return np.frombuffer(buf, np.uint8).__array_interface__["data"][0]


def _spans(checks, data: bytes) -> list[tuple[int, int, int]] | None:
    """(start, length, claimed CRC-32) of each segment body inside ``data``,
    in order; None unless every segment is a distinct view into ``data``."""
    base, spans = _address(data), []
    for _, seg, crc in checks:
        start = _address(seg) - base + HEADER_SIZE
        if start < HEADER_SIZE or start + len(seg) - HEADER_SIZE > len(data):
            return None
        spans.append((start, len(seg) - HEADER_SIZE, crc))
    spans.sort()
    if any(a[0] + a[1] > b[0] for a, b in zip(spans, spans[1:])):
        return None
    return spans


def _claimed_crc(data: bytes, spans) -> int:
    """CRC-32 of ``data`` if each span's bytes had the CRC-32 claimed for them."""
    view, crc, pos = memoryview(data), 0, 0
    for start, length, claimed in spans:
        crc = crc32_combine(zlib.crc32(view[pos:start], crc), claimed, length)
        pos = start + length
    return zlib.crc32(view[pos:], crc)
