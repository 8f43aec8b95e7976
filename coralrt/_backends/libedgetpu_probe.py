"""The libedgetpu probe: load the library in a child process and report what happened.

A libedgetpu build made for another LiteRT version can crash the process that
loads it (a segfault, not an exception), so :mod:`coralrt._backends.libedgetpu`
never loads it before :func:`probe` has done so in a child: the child imports
the interpreter module, opens the library, checks for the delegate's entry
points, reads its version and creates and destroys a delegate, reporting each
stage; a crash, an error or a timeout becomes a
:class:`~coralrt.errors.DriverUnavailableError` (:func:`failure`).  Verdicts are
kept per process, library and interpreter, except the ones that can change
(no stick yet, a slow first open).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal as _signal
import subprocess
import sys
import threading

from ..errors import DriverUnavailableError

__all__ = ["LIBRARY", "PROBE_TIMEOUT", "Probe", "probe", "clear_probe_cache", "failure"]

log = logging.getLogger("coralrt.backends")

#: The library the delegate is loaded from (found by the dynamic loader:
#: ``LD_LIBRARY_PATH``, then the ``ldconfig`` cache).
LIBRARY = "libedgetpu.so.1"
#: Seconds the probing child may take: starting Python, importing LiteRT, and
#: libedgetpu opening the stick (a firmware download on its first open).
PROBE_TIMEOUT = 60.0

_MARK = "CORALRT-LIBEDGETPU-PROBE "
_SYMBOLS = ("tflite_plugin_create_delegate", "tflite_plugin_destroy_delegate")

# The child: import the interpreter module first (as the user's process has),
# then the library, then create and destroy the delegate, reporting each stage
# on stdout; a crash after "loaded" happened inside the delegate.
_CHILD = r"""
import ctypes, importlib, json, sys
MARK = %r
def say(stage, message="", version=None):
    sys.stdout.write(MARK + json.dumps({"stage": stage, "message": message,
                                        "version": version}) + "\n")
    sys.stdout.flush()
module, library, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
try:
    mod = importlib.import_module(module)
except Exception as e:
    say("no-litert", "%%s: %%s" %% (type(e).__name__, e)); sys.exit(0)
try:
    lib = ctypes.CDLL(library)
except OSError as e:
    say("dlopen", str(e)); sys.exit(0)
missing = [s for s in %r if not hasattr(lib, s)]
if missing:
    say("not-libedgetpu", "it does not export " + ", ".join(missing)); sys.exit(0)
version = None
try:
    f = lib.edgetpu_version
    f.restype = ctypes.c_char_p
    version = f().decode("utf-8", "replace")
except Exception:
    pass
say("loaded", version=version)
try:
    delegate = mod.load_delegate(library, options)
except Exception as e:
    say("delegate", "%%s: %%s" %% (type(e).__name__, e), version); sys.exit(0)
del delegate
say("ok", version=version)
""" % (_MARK, _SYMBOLS)


@dataclasses.dataclass(frozen=True)
class Probe:
    """What the child reported: ``stage`` is ``"ok"`` or where it stopped
    (``"no-litert"``, ``"dlopen"``, ``"not-libedgetpu"``, ``"delegate"``), or
    ``"crash"``, ``"timeout"``, ``"error"`` (no report); ``reached`` the last
    stage it reported before that."""

    library: str
    module: str
    stage: str
    message: str = ""
    version: str | None = None
    reached: str | None = None
    returncode: int | None = None
    signal: int | None = None

    @property
    def ok(self) -> bool:
        return self.stage == "ok"


_cache: dict[tuple, Probe] = {}
_cache_lock = threading.Lock()
# Not kept: a stick can be plugged in, a slow first open can go faster.
_TRANSIENT = ("delegate", "timeout")


def clear_probe_cache() -> None:
    """Forget every probe (after installing or replacing libedgetpu)."""
    with _cache_lock:
        _cache.clear()


def probe(library: str | None = None, *, module: str = "ai_edge_litert.interpreter",
          options: dict[str, str] | None = None, timeout: float = PROBE_TIMEOUT,
          command: list[str] | None = None) -> Probe:
    """Load ``library`` (default :data:`LIBRARY`) as ``module``'s delegate in a
    child process, with delegate ``options``, and return its :class:`Probe`.

    ``command`` replaces the child's ``[python, -c, script]`` (tests stand in
    a crashing child); it is given the module, the library and the options as
    JSON as its last three arguments.  Never raises for what the child does.
    """
    library = library or LIBRARY
    key = (library, module, tuple(command) if command else None)
    with _cache_lock:
        found = _cache.get(key)
        if found is not None:
            return found
        result = _run_child(library, module, dict(options or {}), timeout, command)
        log.debug("libedgetpu probe of %s with %s: %s", library, module, result)
        if result.stage not in _TRANSIENT:
            _cache[key] = result
        return result


def _run_child(library, module, options, timeout, command) -> Probe:
    argv = list(command) if command else [sys.executable, "-c", _CHILD]
    argv += [module, library, json.dumps(options)]
    # The child must import the installed interpreter, not coralrt.compat's stand-in.
    env = {k: v for k, v in os.environ.items() if k != "CORALRT_COMPAT"}
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, env=env, text=True, errors="replace")
    except subprocess.TimeoutExpired as e:   # run() has killed the child
        return Probe(library, module, "timeout", _tail(e.stderr), reached=_last(e.stdout))
    except OSError as e:
        return Probe(library, module, "error", f"cannot start the probing child: {e}")
    reports = _reports(done.stdout)
    reached = reports[-1]["stage"] if reports else None
    if done.returncode < 0:
        return Probe(library, module, "crash", _tail(done.stderr), reached=reached,
                     returncode=done.returncode, signal=-done.returncode)
    if done.returncode != 0 or not reports or reached == "loaded":
        return Probe(library, module, "error", _tail(done.stderr), reached=reached,
                     returncode=done.returncode)
    last = reports[-1]
    return Probe(library, module, last["stage"], str(last.get("message") or ""),
                 last.get("version"), reached=reached, returncode=0)


def _reports(stdout) -> list[dict]:
    out = []
    for line in (stdout or "").splitlines():
        if line.startswith(_MARK):
            try:
                out.append(json.loads(line[len(_MARK):]))
            except ValueError:
                pass
    return [r for r in out if isinstance(r, dict) and isinstance(r.get("stage"), str)]


def _last(stdout) -> str | None:
    if isinstance(stdout, bytes):
        stdout = stdout.decode("utf-8", "replace")
    reports = _reports(stdout)
    return reports[-1]["stage"] if reports else None


def _tail(text, lines: int = 5) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return " | ".join((text or "").strip().splitlines()[-lines:])


def _package(module: str) -> str:
    return "tflite-runtime" if module.startswith("tflite_runtime") else "ai-edge-litert"


def failure(p: Probe, options: dict, timeout: float) -> DriverUnavailableError:
    """The typed error for a probe that did not end in "ok"."""
    lib, version = p.library, f" (libedgetpu {p.version})" if p.version else ""
    said = f": {p.message}" if p.message else ""
    if p.stage == "dlopen":
        base = os.path.basename(lib)
        if "No such file" in p.message and p.message.startswith((lib + ":", base + ":")):
            cause, text = "missing", f"libedgetpu is not installed: {lib} was not found{said}"
        else:
            cause, text = "not-loadable", f"{lib} cannot be loaded as a shared library{said}"
    elif p.stage == "not-libedgetpu":
        cause = "not-libedgetpu"
        text = f"{lib} is not libedgetpu: {p.message} (what a LiteRT delegate library exports)"
    elif p.stage == "no-litert":
        cause = "no-litert"
        text = f"the probing child could not import {p.module}{said}"
    elif p.stage == "delegate":
        cause = "delegate"
        text = (f"{lib}{version} loaded, but it could not create the Edge TPU delegate with "
                f"options {options}{said}; is a Coral USB Accelerator plugged in "
                f"(`coralrt devices`), not in use by another process, and is device= right?")
    elif p.stage == "crash":
        try:
            name = _signal.Signals(p.signal).name
        except (ValueError, TypeError):
            name = f"signal {p.signal}"
        where = ("while creating the delegate" if p.reached == "loaded"
                 else "while loading the library")
        cause = "crash"
        text = (f"loading {lib}{version} crashed the child process that probed it ({name} "
                f"{where}); coralrt did not load it into this process. A libedgetpu built "
                f"for another LiteRT version does this: install a build made for the "
                f"installed {_package(p.module)}" + (f" [stderr: {p.message}]" if p.message
                                                     else ""))
    elif p.stage == "timeout":
        cause = "timeout"
        text = (f"the child process probing {lib} did not finish within {timeout:g} s and "
                f"was stopped" + (f" (last stage reached: {p.reached})" if p.reached else ""))
    else:
        cause = "error"
        text = (f"the child process probing {lib} ended with status {p.returncode} "
                f"without a report" + (f" [stderr: {p.message}]" if p.message else ""))
    return DriverUnavailableError(text, library=lib, cause=cause, signal=p.signal,
                                  detail=p.message or None)
