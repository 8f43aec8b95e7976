"""The "compile paths" part of ``coralrt doctor``: how this machine can compile plain models.

A plain (not yet compiled) quantized model needs edgetpu_compiler to run on a
real stick.  This part lists the ways this machine has to run it:

- ``native``: an edgetpu_compiler built for this machine (x86-64 Linux);
- ``emulated``: an x86-64 edgetpu_compiler under box64 or qemu-x86_64, or
  through binfmt_misc (:mod:`coralrt._compile.emulation`);
- ``remote``: a compile service (``coralrt serve-compiler`` on an x86-64
  machine) named by ``CORALRT_COMPILER_URL``; ``coralrt doctor`` asks its
  ``GET /health`` (:func:`probe_service`, 5 s at most) and reports the
  compiler it answers with, or why it cannot be used;
- ``none``: no local compiler, with how to get one.

It is information, not a check: pre-compiled ``*_edgetpu.tflite`` models run
without any compiler, so having none does not make ``coralrt doctor`` fail.
Nothing is run here either: whether the compiler answers is the
``edgetpu_compiler`` check's job.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

from coralrt import _config as config
from coralrt.errors import CoralRTError

__all__ = ["COMPILER_URL", "HOW", "compile_paths_report", "remote_path", "usable",
           "probe_service",
           "format_compile_paths"]

COMPILER_URL = config.COMPILER_URL
PROBE_TIMEOUT = 5.0

#: Every way to get a compile path, shown when this machine has none.
HOW = ("install edgetpu_compiler on an x86-64 Linux machine (Coral's apt package "
       "edgetpu-compiler);\n"
       "on ARM (Raspberry Pi), install box64 or qemu-user plus an x86-64 copy of "
       "edgetpu_compiler and point CORALRT_EDGETPU_COMPILER at it "
       "(docs/install-raspberry-pi.md);\n"
       "or point CORALRT_COMPILER_URL at a compile service run with `coralrt serve-compiler` "
       "on an x86-64 machine;\n"
       "or import the compiled cache of a machine that compiled your models (`coralrt cache "
       "export` there, `coralrt cache import` here);\n"
       "or compile ahead of time elsewhere (`coralrt compile --compiler edgetpu_compiler`) and "
       "copy the _edgetpu.tflite here")


def _redact(url: str) -> str:
    """``url`` without a password (``https://user:secret@host`` -> ``https://user:***@host``)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if parts.port is not None:
            host += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))
    except ValueError:
        return url


def probe_service(url: str) -> str:
    """What the compile service at ``url`` answers to ``GET /health``, in words."""
    from coralrt._compile.remote import RemoteCompiler
    from coralrt.errors import CompileServiceError
    try:
        info = RemoteCompiler(url).health(timeout=PROBE_TIMEOUT)
    except CompileServiceError as e:
        return f"not usable: {e.cause}"
    except CoralRTError as e:     # a URL or token setting it refuses
        return f"not usable: {e}"
    compiler = info.get("compiler")
    if isinstance(compiler, dict):
        return f"answers with {compiler.get('id')} {compiler.get('version')}"
    return ("answers, but did not accept the token, so it names no compiler (set "
            "CORALRT_COMPILER_TOKEN or CORALRT_COMPILER_TOKEN_FILE)")


def remote_path(environ=None, probe=None) -> dict:
    """The compile-service path: configured (``CORALRT_COMPILER_URL`` set) or not.

    Same keys as :func:`coralrt._compile.emulation.compile_paths`; ``via`` is
    the URL (password hidden) when set.  ``probe(url)`` (e.g.
    :func:`probe_service`) says how the service answers; without it the
    service is not contacted.
    """
    environ = os.environ if environ is None else environ
    url = (environ.get(COMPILER_URL) or "").strip()
    if url:
        shown = _redact(url)
        answer = probe(url) if probe is not None else "not contacted"
        return {"path": "remote", "compiler": None, "via": shown,
                "detail": f"{COMPILER_URL} is set to {shown} ({answer})",
                "how": None if not answer.startswith("not usable") else
                "check the URL, that `coralrt serve-compiler` runs there, and the token"}
    return {"path": "remote", "compiler": None, "via": None,
            "detail": f"not configured ({COMPILER_URL} is not set)",
            "how": "run `coralrt serve-compiler` on an x86-64 machine with edgetpu_compiler "
                   f"and set {COMPILER_URL} to its address"}


def compile_paths_report(find=None, *, environ=None, host: str | None = None,
                         binfmt_root=None, probe=None) -> list[dict]:
    """The local compile paths, then the remote one.  ``find``: replaces
    :func:`~coralrt._compile.edgetpu_compiler.find_compiler`; ``host`` and
    ``binfmt_root``: as in :func:`coralrt._compile.emulation.compile_paths`."""
    from coralrt._compile import emulation
    if find is None:
        from coralrt._compile.edgetpu_compiler import find_compiler as find
    try:
        compiler = find()
    except CoralRTError as e:  # CORALRT_EDGETPU_COMPILER names no executable
        local = [{"path": "none", "compiler": None, "via": None, "detail": str(e),
                  "how": "point CORALRT_EDGETPU_COMPILER at the edgetpu_compiler executable "
                         "or unset it"}]
    else:
        local = emulation.compile_paths(compiler, host=host, binfmt_root=binfmt_root)
    return [*local, remote_path(environ, probe)]


def usable(paths: list[dict]) -> list[dict]:
    """The paths that can compile: native, emulated, or a configured service."""
    return [p for p in paths if p["path"] in ("native", "emulated")
            or (p["path"] == "remote" and p["via"] and "not usable" not in p["detail"])]


def format_compile_paths(paths: list[dict]) -> str:
    """The text section: one line per path, and every way to get one when there is none."""
    lines = ["compile paths (plain models on a real stick; pre-compiled *_edgetpu.tflite "
             "models need none):"]
    lines.extend(f"  {p['path']:<9} {p['detail']}" for p in paths)
    if not usable(paths):
        lines.append("  no way to compile plain models here (information only: "
                     "pre-compiled models run without one). To get one:")
        lines.extend(f"    {ln}" for ln in HOW.splitlines())
    return "\n".join(lines)
