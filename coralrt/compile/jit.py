"""Just-in-time compilation with the on-disk cache.

``jit_compile`` is what ``InferenceSession(path, target="sim")`` calls on
load: the first time a model is seen it is partitioned and compiled; later
loads (in any process) read the compiled model from the cache.  The cache
key covers the model bytes, the partition options, the compiler's id and
version and the cache format, so changing any of them compiles again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from coralrt.compile.cache import CompileCache, make_key
from coralrt.compile.digest import model_digest
from coralrt.compile.driver import compile_model
from coralrt.compile.native import NativeCompiler
from coralrt.compile.partition import MODES
from coralrt.compile.rules import RULES_VERSION
from coralrt.errors import ConfigError, ModelError
from coralrt.model import Model, load_model

__all__ = ["JitResult", "jit_compile"]

log = logging.getLogger("coralrt.compile")


@dataclass
class JitResult:
    model: Model          # the compiled model (segments as coralrt-segment operators)
    compile_info: dict    # cache_hit, compile_seconds, key, compiler, mode, segments, ...


def jit_compile(source, *, mode: str = "multi", compiler: NativeCompiler | None = None,
                cache: CompileCache | None = None, rules=None, rules_fingerprint=None,
                events=None, parsed: Model | None = None) -> JitResult:
    """The compiled form of ``source`` (a path, the model's bytes, or a Model).

    On a cache hit the source model is neither parsed nor validated again:
    its compiled form was made from these exact bytes after validation.  On
    a miss it is parsed once, unless the caller already did so and passes
    the result as ``parsed`` (``source`` still keys the cache), and the
    compiled model built here is used as it is, not read back from its bytes.
    ``rules`` (a RuleRegistry with plugin operators) and its
    ``rules_fingerprint`` come from the plugin host; ``events(**event)``
    receives cache hits and misses and compiled segments.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown partition mode {mode!r}; choose one of {', '.join(MODES)}")
    start = time.perf_counter()
    compiler = compiler or NativeCompiler()
    cache = cache if cache is not None else CompileCache()
    model = source if isinstance(source, Model) else parsed
    if isinstance(source, Model):
        digest, data = model_digest(source.to_bytes(), None)
    else:
        digest, data = model_digest(source, cache.path / "sources" if cache.enabled else None)
    options = {"mode": mode, "rules": RULES_VERSION}
    if rules_fingerprint:
        options["plugin_ops"] = rules_fingerprint
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
        result = compile_model(
            model, mode=mode, compiler=compiler, rules=rules,
            on_segment=lambda i, n, size, secs: emit(kind="segment_compiled", key=key,
                                                     segment=i, operators=n, bytes=size,
                                                     seconds=secs))
        out = result.to_bytes()
        built.append(result.model)
        log.info("compiled %d Edge TPU segment(s) (%d of %d operators) in %.0f ms",
                 len(result.plan.segments), result.plan.summary["tpu_ops"],
                 len(model.main.operators), 1e3 * (time.perf_counter() - t0))
        return out, {"compiler": f"{compiler.id} {compiler.version}", "options": options,
                     "build_seconds": time.perf_counter() - t0,
                     "summary": result.plan.summary,
                     "placement": [[o.target, o.segment, o.reason] for o in result.plan.ops]}

    entry, hit = cache.get_or_build(key, build)
    try:
        compiled = built[-1] if built else load_model(entry.data)
    except ModelError as e:
        # A verified entry that does not load was written by a broken build:
        # treat it as a miss and replace it.
        log.warning("cached compiled model %s does not load (%s); compiling again", key, e)
        out, meta = build()
        entry = cache.put(key, out, meta) if cache.enabled else entry
        compiled, hit = load_model(out), False
    if hit:
        log.info("compiled model found in the cache (%s)", key[:12])
        emit(kind="cache_hit", key=key)
    info = {
        "cache_hit": hit,
        "compile_seconds": time.perf_counter() - start,
        "key": key,
        "compiler": entry.meta.get("compiler"),
        "mode": mode,
        "segments": entry.meta.get("summary", {}).get("segments"),
        "summary": entry.meta.get("summary"),
        "placement": entry.meta.get("placement"),
        "cache_dir": str(cache.path) if cache.enabled else None,
    }
    return JitResult(compiled, info)
