"""The software checks of ``coralrt doctor``: CPU backends, edgetpu_compiler, versions.

The USB-side checks (libusb, sticks, permissions, udev rule, firmware) are
in :mod:`coralrt._cli.doctor_cmd`; these look only at what is installed.
"""

from __future__ import annotations

import platform

from coralrt._cli.doctor_check import Check
from coralrt.errors import CoralRTError
from coralrt._wheels import platform_name, python_bits

__all__ = ["check_cpu_backends", "check_edgetpu_compiler", "check_python"]

_LITERT_FIX = "pip install ai-edge-litert"


def check_cpu_backends(report=None, *, has_litert_wheels: bool | None = None) -> list[Check]:
    """One check per CPU backend coralrt knows: which are installed and usable,
    why the others are not, and which one sessions use by default (the first
    usable one).  A backend that is not usable is ``info`` when another one is,
    and ``fail`` when none is; when sessions fall back on ``numpy`` although
    ai-edge-litert has wheels for this platform (``has_litert_wheels``, by
    default this machine's answer), the ``litert`` row is ``warn``: it would be
    faster."""
    from coralrt._backends import litert_has_wheels
    if report is None:
        from coralrt._backends import backend_report as report
    if has_litert_wheels is None:
        has_litert_wheels = litert_has_wheels()
    rows = report()
    first = next((r["name"] for r in rows if r["usable"]), None)
    checks = []
    for r in rows:
        name = f"CPU backend {r['name']}"
        if r["usable"]:
            tag = " (used by default)" if r["name"] == first else ""
            if r["name"] == "numpy":
                tag = (" (used by default: coralrt's NumPy kernels, slower than LiteRT)"
                       if first == "numpy" else
                       " (coralrt's NumPy kernels: the fallback when no LiteRT interpreter is "
                       "usable)")
            checks.append(Check(name, "ok", f"{r['name']} {r['version']}{tag}"))
        elif first is None:
            checks.append(Check(name, "fail", f"not usable: {r['reason']}", _LITERT_FIX))
        elif r["name"] == "litert" and not has_litert_wheels:
            why = (f"ai-edge-litert has no wheels for {platform_name()}, so it is not "
                   f"installed" if "is not installed" in r["reason"] else
                   f"{r['reason']} (ai-edge-litert has no wheels for {platform_name()})")
            checks.append(Check(name, "info", f"not usable: {why}; sessions use {first!r} "
                                f"(docs/backends.md)"))
        elif r["name"] == "litert" and first == "numpy":
            checks.append(Check(name, "warn", f"not usable: {r['reason']}; sessions fall "
                                f"back on the slower 'numpy' backend", _LITERT_FIX))
        else:
            checks.append(Check(name, "info", f"not usable: {r['reason']}"))
    return checks


def check_edgetpu_compiler(find=None, version=None,
                           machine: str | None = None) -> Check:
    """Whether edgetpu_compiler is available: it is needed only to run plain
    models on a real stick (target 'coral'), and it runs on x86-64 Linux only."""
    if find is None:
        from coralrt._compile.edgetpu_compiler import find_compiler as find
    machine = (machine or platform.machine()).lower()
    path = find()
    if path is None:
        found = ("not found (CORALRT_EDGETPU_COMPILER is not set and it is not on PATH); "
                 "needed only to run plain models on a real stick")
        if machine not in ("x86_64", "amd64"):
            return Check("edgetpu_compiler", "info",
                         f"{found}. There is no build for {machine}: see the compile paths "
                         f"below (a compile service, an x86-64 copy under an emulator, an "
                         f"imported cache, or compiling ahead of time elsewhere)")
        return Check("edgetpu_compiler", "info",
                     f"{found} (`coralrt compile --compiler edgetpu_compiler` prints how to "
                     f"install it)")
    if version is None:
        from coralrt._compile.edgetpu_compiler import EdgeTpuCompiler

        def version(p):
            return EdgeTpuCompiler(p).version
    try:
        return Check("edgetpu_compiler", "ok", f"{path}, version {version(path)}")
    except (CoralRTError, OSError) as e:
        # The first line only: CompilerUnavailableError appends the install text.
        reason = str(e).split("\n", 1)[0]
        return Check("edgetpu_compiler", "warn", f"{path} does not run: {reason}",
                     "point CORALRT_EDGETPU_COMPILER at a working edgetpu_compiler, or see "
                     "the compile paths below")


def check_python() -> Check:
    """Python and NumPy versions (information only)."""
    import numpy as np
    return Check("versions", "info",
                 f"Python {platform.python_version()} ({platform.python_implementation()}, "
                 f"{python_bits()}-bit, {platform_name()}), NumPy {np.__version__}")
