"""A compile service on loopback for tests and benchmarks, over the stand-in compiler.

:func:`stand_in` writes an ``edgetpu_compiler`` that runs
``tests/support/fake_edgetpu_compiler.py`` (it answers from the real compiled
models in ``shared/models``) after appending its arguments to ``calls.log``
beside it, optionally sleeping first (a slow compile, so that concurrent
requests overlap).  :func:`service` runs :class:`coralrt._server.service.CompileService`
with it through :func:`coralrt._server.app.running`.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

from coralrt._compile.cache import CompileCache
from coralrt._compile.edgetpu_compiler import EdgeTpuCompiler

__all__ = ["FAKE", "stand_in", "compile_calls", "service"]

FAKE = Path(__file__).resolve().parent / "fake_edgetpu_compiler.py"


def stand_in(folder: Path, *, delay: float = 0.0) -> Path:
    """An executable ``folder/edgetpu_compiler`` running the stand-in compiler."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "edgetpu_compiler"
    path.write_text(f'#!/bin/sh\necho "$@" >> "{folder / "calls.log"}"\n'
                    + (f"sleep {delay}\n" if delay else "")
                    + f'exec "{sys.executable}" "{FAKE}" "$@"\n')
    path.chmod(0o755)
    return path


def compile_calls(compiler: Path) -> list[str]:
    """The command lines of the compiles the stand-in ran (``--version`` left out)."""
    log = compiler.parent / "calls.log"
    lines = log.read_text().splitlines() if log.is_file() else []
    return [ln for ln in lines if ln.strip() not in ("--version", "-v")]


@contextmanager
def service(tmp: Path, *, delay: float = 0.0, token: str | None = None, ssl_context=None,
            compile_timeout: float = 60.0, **limits):
    """``(url, service, compiler path)`` of a running service for the ``with`` block."""
    from coralrt._server.app import running
    from coralrt._server.service import CompileService, Limits

    compiler = stand_in(tmp / "bin", delay=delay)
    svc = CompileService(EdgeTpuCompiler(compiler, timeout=compile_timeout),
                         CompileCache(tmp / "service-cache", enabled=True),
                         Limits(**limits))
    with running(svc, token=token, ssl_context=ssl_context) as url:
        yield url, svc, compiler
