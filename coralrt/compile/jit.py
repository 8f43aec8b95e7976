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
from coralrt.compile.native import NativeCompiler, compile_model
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


def jit_compile(model: Model, model_bytes: bytes, *, mode: str = "multi",
                compiler: NativeCompiler | None = None,
                cache: CompileCache | None = None) -> JitResult:
    """The compiled form of ``model`` (whose serialized form is ``model_bytes``)."""
    if mode not in MODES:
        raise ConfigError(f"unknown partition mode {mode!r}; choose one of {', '.join(MODES)}")
    compiler = compiler or NativeCompiler()
    cache = cache if cache is not None else CompileCache()
    options = {"mode": mode, "rules": RULES_VERSION}
    key = make_key(model_bytes, options=options, compiler_id=compiler.id,
                   compiler_version=compiler.version)
    start = time.perf_counter()

    def build() -> tuple[bytes, dict]:
        t0 = time.perf_counter()
        result = compile_model(model, mode=mode, compiler=compiler)
        data = result.to_bytes()
        log.info("compiled %d Edge TPU segment(s) (%d of %d operators) in %.0f ms",
                 len(result.plan.segments), result.plan.summary["tpu_ops"],
                 len(model.main.operators), 1e3 * (time.perf_counter() - t0))
        return data, {"compiler": f"{compiler.id} {compiler.version}", "options": options,
                      "build_seconds": time.perf_counter() - t0,
                      "summary": result.plan.summary,
                      "placement": [[o.target, o.segment, o.reason] for o in result.plan.ops]}

    entry, hit = cache.get_or_build(key, build)
    try:
        compiled = load_model(entry.data)
    except ModelError as e:
        # A verified entry that does not load was written by a broken build:
        # treat it as a miss and replace it.
        log.warning("cached compiled model %s does not load (%s); compiling again", key, e)
        data, meta = build()
        entry = cache.put(key, data, meta) if cache.enabled else entry
        compiled, hit = load_model(data), False
    if hit:
        log.info("compiled model found in the cache (%s)", key[:12])
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
