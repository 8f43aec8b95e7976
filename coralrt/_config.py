"""Every environment variable and platform directory coralrt reads, in one place.

Each variable is read when the function that needs it is called, not at
import time, so a process (or a test) can change it at any moment and the
next call sees the new value.  A value coralrt cannot make sense of raises
:class:`~coralrt.errors.ConfigError` naming the variable, instead of being
silently ignored.

======================================  ==================================================
variable                                meaning
======================================  ==================================================
``CORALRT_CACHE_DIR``                   root folder of the compile cache; default: the
                                        platform's user cache folder for ``coralrt``
                                        (``~/.cache/coralrt`` on Linux, from platformdirs)
``CORALRT_CACHE``                       ``0``, ``false``, ``no`` or ``off`` disable the
                                        compile cache (every model is compiled again);
                                        ``1``, ``true``, ``yes``, ``on`` or unset enable
                                        it; anything else is an error
``CORALRT_CACHE_MAX_BYTES``             size cap of the compile cache in bytes, optionally
                                        with a ``K``, ``M`` or ``G`` suffix (powers of
                                        1024); least recently used entries are evicted
                                        above it; default 1 GiB
``CORALRT_DISABLE_PLUGIN_AUTOLOAD``     ``1`` (or true/yes/on): do not load plugins from
                                        the ``coralrt`` entry-point group; plugins passed
                                        to ``InferenceSession(plugins=...)`` still load
``CORALRT_PLUGINS_STRICT``              ``1`` (or true/yes/on): an installed plugin that
                                        cannot be loaded or whose registration hook
                                        fails raises ``PluginError`` instead of being
                                        skipped with a warning; ``0`` or unset: skipped
``CORALRT_EDGETPU_COMPILER``            path of the ``edgetpu_compiler`` executable to
                                        use (a file, or a folder holding one); unset:
                                        looked up on ``PATH``
``CORALRT_EDGETPU_COMPILER_TIMEOUT``    seconds one edgetpu_compiler run may take before
                                        it is stopped (default 180, its own default)
``CORALRT_X86_EMULATOR``                the x86-64 emulator that runs edgetpu_compiler on
                                        another machine (ARM): a path, or a name looked
                                        up on ``PATH`` (``box64``, ``qemu-x86_64``);
                                        ``none`` forbids emulation; unset: the first of
                                        box64, qemu-x86_64, qemu-x86_64-static on ``PATH``
                                        (:mod:`coralrt._compile.emulation`)
``CORALRT_X86_SYSROOT``                 folder of an x86-64 root file system (its C
                                        library) that qemu-x86_64 is given with ``-L``;
                                        unset: qemu's own ``QEMU_LD_PREFIX``, if any
``CORALRT_COMPILER_URL``                URL of a compile service (``coralrt
                                        serve-compiler``), e.g.
                                        ``https://builder:8765``: plain models for
                                        ``target="coral"`` are compiled there
                                        (:mod:`coralrt._compile.remote`); unset: the
                                        local edgetpu_compiler, if any
``CORALRT_COMPILER_TOKEN``              the service's token (sent as ``Authorization:
                                        Bearer``); or ``CORALRT_COMPILER_TOKEN_FILE``:
                                        a file holding it
``CORALRT_COMPILER_CA``                 a PEM file of certificates to trust for an
                                        ``https`` service (a self-signed one); unset:
                                        the system's certificate store
``CORALRT_COMPILER_URL_TIMEOUT``        seconds a request to the compile service may
                                        take, compile included (default 240)
``CORALRT_COMPILER_URL_MAX_ANSWER``     largest answer read from the compile service,
                                        a size like ``512M`` (default 256M)
``CORALRT_RUNTIME_DIR``                 folder of the per-stick lock files (and the pid
                                        of each lock's holder); default: the platform's
                                        user runtime folder for ``coralrt`` (from
                                        platformdirs, ``$XDG_RUNTIME_DIR/coralrt`` on
                                        Linux), else ``<temp dir>/coralrt-<uid>``; it
                                        must be a directory (not a symbolic link) the
                                        user owns and only the user can write to
                                        (:func:`coralrt._usb.lock.lock_dir` checks)
``CORALRT_TARGET``                      target of the tflite_runtime-compatible
                                        interpreter (:mod:`coralrt.tflite`) when it is
                                        given the Edge TPU delegate: ``cpu``, ``sim``,
                                        ``coral`` or ``auto`` (any case); default
                                        ``auto``; anything else is an error
``CORALRT_DRIVER``                      how ``target="coral"`` reaches the stick:
                                        ``coralrt`` (default: coralrt's own pyusb
                                        driver) or ``libedgetpu`` (Google's library as
                                        a LiteRT delegate, docs/libedgetpu.md), any
                                        case; a session's ``driver=`` wins over it;
                                        anything else is an error
``CORALRT_SIM_STICKS``                  how many simulated sticks the compatibility
                                        layer (:mod:`coralrt.pycoral`,
                                        :mod:`coralrt.tflite`) presents when
                                        ``CORALRT_TARGET=sim``: what
                                        ``list_edge_tpus()`` lists and the device
                                        indexes ``:N`` / ``usb:N`` accept (default 4,
                                        1 to 64)
``CORALRT_PLAIN_MODELS``                folders (separated by ``:``, ``;`` on Windows)
                                        where the plain model of an
                                        ``X_edgetpu.tflite`` is looked for, after the
                                        file's own folder, when it must run on ``cpu``
                                        or ``sim``
======================================  ==================================================

An empty value (``CORALRT_CACHE_DIR= coralrt ...``) counts as unset.

The platform directories, also looked up only here, each when its function is
called (so a changed ``XDG_*`` variable applies at the next call):

=========================  =======================================================
function                   folder
=========================  =======================================================
:func:`cache_dir`          ``platformdirs.user_cache_dir("coralrt")`` unless
                           ``CORALRT_CACHE_DIR`` is set
:func:`runtime_dir`        ``platformdirs.user_runtime_dir("coralrt")`` unless
                           ``CORALRT_RUNTIME_DIR`` is set (its warning when
                           ``XDG_RUNTIME_DIR`` is unset is silenced); if
                           platformdirs fails, :func:`temp_runtime_dir`
:func:`temp_runtime_dir`   ``tempfile.gettempdir()/coralrt-<uid>``: the last
                           resort for the lock files
:func:`firmware_dir`       ``platformdirs.user_data_dir("coralrt")/firmware``
                           (``~/.local/share/coralrt/firmware`` on Linux)
=========================  =======================================================
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from pathlib import Path

from coralrt.errors import ConfigError

__all__ = [
    "CACHE_DIR", "CACHE", "CACHE_MAX_BYTES", "DEFAULT_CACHE_MAX_BYTES",
    "cache_dir", "cache_enabled", "cache_max_bytes", "parse_size", "DISABLE_PLUGIN_AUTOLOAD",
    "plugin_autoload", "PLUGINS_STRICT", "plugins_strict", "EDGETPU_COMPILER",
    "EDGETPU_COMPILER_TIMEOUT", "DEFAULT_EDGETPU_COMPILER_TIMEOUT", "edgetpu_compiler",
    "edgetpu_compiler_timeout",
    "RUNTIME_DIR", "runtime_dir", "temp_runtime_dir", "firmware_dir",
    "TARGET", "TARGETS", "COMPAT_TARGETS", "TargetNames", "compat_target",
    "CORAL", "SIM", "KIND_ALIASES", "device_kind",
    "COMPILER_URL", "COMPILER_TOKEN", "COMPILER_TOKEN_FILE", "COMPILER_CA",
    "COMPILER_URL_TIMEOUT", "DEFAULT_COMPILER_URL_TIMEOUT", "compiler_url",
    "compiler_token", "compiler_ca", "compiler_url_timeout",
    "SIM_STICKS", "DEFAULT_SIM_STICKS", "sim_sticks", "PLAIN_MODELS", "plain_model_dirs",
]

CACHE_DIR = "CORALRT_CACHE_DIR"
CACHE = "CORALRT_CACHE"
CACHE_MAX_BYTES = "CORALRT_CACHE_MAX_BYTES"
DISABLE_PLUGIN_AUTOLOAD = "CORALRT_DISABLE_PLUGIN_AUTOLOAD"
PLUGINS_STRICT = "CORALRT_PLUGINS_STRICT"
EDGETPU_COMPILER = "CORALRT_EDGETPU_COMPILER"
EDGETPU_COMPILER_TIMEOUT = "CORALRT_EDGETPU_COMPILER_TIMEOUT"
RUNTIME_DIR = "CORALRT_RUNTIME_DIR"
TARGET = "CORALRT_TARGET"
COMPILER_URL = "CORALRT_COMPILER_URL"
COMPILER_TOKEN = "CORALRT_COMPILER_TOKEN"
COMPILER_TOKEN_FILE = "CORALRT_COMPILER_TOKEN_FILE"
COMPILER_CA = "CORALRT_COMPILER_CA"
COMPILER_URL_TIMEOUT = "CORALRT_COMPILER_URL_TIMEOUT"



# The target names and the device-kind words live in coralrt._kinds (same layer).
from coralrt._kinds import (  # noqa: E402
    CORAL, COMPAT_TARGETS, KIND_ALIASES, SIM, TARGETS, TargetNames, device_kind,
)

DEFAULT_EDGETPU_COMPILER_TIMEOUT = 180.0
# The service's default compile limit (180 s) plus time to upload and answer.
DEFAULT_COMPILER_URL_TIMEOUT = 240.0

DEFAULT_CACHE_MAX_BYTES = 1 << 30

_FALSE = frozenset({"0", "false", "no", "off"})
_TRUE = frozenset({"", "1", "true", "yes", "on"})
_SIZE = re.compile(r"(\d+)\s*(?:([kmg])(?:i?b)?|b)?", re.IGNORECASE)
_UNITS = {None: 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _get(name: str) -> str | None:
    value = os.environ.get(name)
    # An empty assignment (`CORALRT_CACHE_DIR= coralrt ...`) means "not set".
    return value.strip() if value is not None and value.strip() else None


def cache_dir() -> Path:
    """Root folder of the compile cache (``CORALRT_CACHE_DIR`` or the user cache folder)."""
    value = _get(CACHE_DIR)
    if value is not None:
        return Path(value).expanduser()
    import platformdirs  # only needed when the variable is not set

    return Path(platformdirs.user_cache_dir("coralrt"))


def cache_enabled() -> bool:
    """False when ``CORALRT_CACHE`` is ``0``, ``false``, ``no`` or ``off`` (any case)."""
    value = _get(CACHE)
    if value is None:
        return True
    word = value.lower()
    if word in _FALSE:
        return False
    if word in _TRUE:
        return True
    raise ConfigError(
        f"{CACHE}={value!r} is not understood; use 0, false, no or off to disable the "
        f"compile cache, or 1, true, yes or on (or leave it unset) to enable it")


def cache_max_bytes() -> int:
    """Size cap of the compile cache (``CORALRT_CACHE_MAX_BYTES``, default 1 GiB)."""
    value = _get(CACHE_MAX_BYTES)
    if value is None:
        return DEFAULT_CACHE_MAX_BYTES
    size = parse_size(value)
    if size is None:
        raise ConfigError(
            f"{CACHE_MAX_BYTES}={value!r} is not a size; give a whole number of bytes, "
            f"optionally with a K, M or G suffix (for example 500M or 2G)")
    return size


def parse_size(value: str) -> int | None:
    """Bytes of ``"500"``, ``"64K"``, ``"500M"``, ``"2G"`` (also ``MB``, ``MiB``:
    powers of 1024), or None when ``value`` is not such a size."""
    m = _SIZE.fullmatch(value.strip())
    if m is None:
        return None
    unit = m.group(2).lower() if m.group(2) else None
    return int(m.group(1)) * _UNITS[unit]


def _flag(name: str, meaning: str) -> bool:
    """A true/false variable: False when unset; ``meaning`` completes "use 1 to ..."."""
    value = _get(name)
    if value is None or value.lower() in _FALSE:
        return False
    if value.lower() in _TRUE:
        return True
    raise ConfigError(f"{name}={value!r} is not understood; use 1 to {meaning}")


def plugin_autoload() -> bool:
    """False when ``CORALRT_DISABLE_PLUGIN_AUTOLOAD`` is set to a true value."""
    return not _flag(DISABLE_PLUGIN_AUTOLOAD, "disable plugin autoloading or 0 to keep it")


def plugins_strict() -> bool:
    """True when ``CORALRT_PLUGINS_STRICT`` is set to a true value: a broken
    installed plugin is an error instead of being skipped."""
    return _flag(PLUGINS_STRICT, "make a broken installed plugin an error or 0 to skip it "
                                 "with a warning")


def edgetpu_compiler() -> Path | None:
    """The ``edgetpu_compiler`` that ``CORALRT_EDGETPU_COMPILER`` names, or None if unset.

    A folder means the ``edgetpu_compiler`` inside it.  A path that is not an
    executable file is an error (a typo must not silently fall back to ``PATH``).
    """
    value = _get(EDGETPU_COMPILER)
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_dir():
        path = path / "edgetpu_compiler"
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ConfigError(f"{EDGETPU_COMPILER}={value!r} is not an executable file; point it "
                          f"at the edgetpu_compiler executable or unset it to search PATH")
    return path


def edgetpu_compiler_timeout() -> float:
    """Seconds one edgetpu_compiler run may take (``CORALRT_EDGETPU_COMPILER_TIMEOUT``)."""
    return _seconds(EDGETPU_COMPILER_TIMEOUT, DEFAULT_EDGETPU_COMPILER_TIMEOUT)


# -- edgetpu_compiler under an x86-64 emulator (coralrt._compile.emulation) --------------

__all__ += ["X86_EMULATOR", "X86_SYSROOT", "NO_EMULATOR", "x86_emulator", "x86_sysroot"]

X86_EMULATOR = "CORALRT_X86_EMULATOR"
X86_SYSROOT = "CORALRT_X86_SYSROOT"
#: What :func:`x86_emulator` returns for ``CORALRT_X86_EMULATOR=none``.
NO_EMULATOR = "none"


def x86_emulator() -> str | None:
    """``CORALRT_X86_EMULATOR``: a path or a name of the x86-64 emulator (looked up by
    :func:`coralrt._compile.emulation.find_emulator`), :data:`NO_EMULATOR` when it is
    ``none`` (any case), None when unset."""
    value = _get(X86_EMULATOR)
    if value is not None and value.lower() == NO_EMULATOR:
        return NO_EMULATOR
    return str(Path(value).expanduser()) if value is not None and "/" in value else value


def x86_sysroot() -> Path | None:
    """``CORALRT_X86_SYSROOT``: the x86-64 root folder given to qemu-x86_64 as ``-L``, or None."""
    value = _get(X86_SYSROOT)
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{X86_SYSROOT}={value!r} is not a folder; point it at an x86-64 "
                          f"root file system (one holding lib/x86_64-linux-gnu or lib64 with "
                          f"the C library) or unset it")
    return path


def _seconds(name: str, default: float) -> float:
    """A positive number of seconds from the variable ``name``, or ``default`` when unset."""
    value = _get(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError(f"{name}={value!r} is not a positive number of seconds (for "
                          f"example {default:g})")
    return seconds


def compiler_url() -> str | None:
    """The compile service's URL (``CORALRT_COMPILER_URL``), or None."""
    return _get(COMPILER_URL)


def compiler_token() -> str | None:
    """The compile service's token: ``CORALRT_COMPILER_TOKEN``, else the content of
    the file ``CORALRT_COMPILER_TOKEN_FILE`` names (surrounding whitespace
    stripped), else None."""
    token = _get(COMPILER_TOKEN)
    if token is not None:
        return token
    value = _get(COMPILER_TOKEN_FILE)
    if value is None:
        return None
    try:
        token = Path(value).expanduser().read_text("utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{COMPILER_TOKEN_FILE}={value!r}: cannot read the token ({e})") \
            from None
    if not token:
        raise ConfigError(f"{COMPILER_TOKEN_FILE}={value!r} is empty")
    return token


def compiler_ca() -> Path | None:
    """The certificates to trust for an ``https`` compile service (``CORALRT_COMPILER_CA``)."""
    value = _get(COMPILER_CA)
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise ConfigError(f"{COMPILER_CA}={value!r} is not a file of PEM certificates")
    return path


def compiler_url_timeout() -> float:
    """Seconds one request to the compile service may take (``CORALRT_COMPILER_URL_TIMEOUT``)."""
    return _seconds(COMPILER_URL_TIMEOUT, DEFAULT_COMPILER_URL_TIMEOUT)


def compat_target() -> str:
    """Target of a :mod:`coralrt.tflite` interpreter given the Edge TPU delegate
    (``CORALRT_TARGET``, default ``"auto"``), lower-cased."""
    value = _get(TARGET)
    if value is None:
        return "auto"
    word = value.lower()
    if word not in COMPAT_TARGETS:
        raise ConfigError(f"{TARGET}={value!r} is not a target; use one of "
                          f"{', '.join(COMPAT_TARGETS)} (or leave it unset for auto)")
    return word



# -- how target="coral" reaches the stick (coralrt._backends.libedgetpu) -----------------

__all__ += ["DRIVER", "DRIVERS", "driver"]

DRIVER = "CORALRT_DRIVER"
#: What ``CORALRT_DRIVER`` and ``InferenceSession(driver=...)`` accept; the first is the default.
DRIVERS = ("coralrt", "libedgetpu")


def driver() -> str:
    """``CORALRT_DRIVER`` lower-cased: ``"coralrt"`` (also when unset) or ``"libedgetpu"``."""
    value = _get(DRIVER)
    if value is None:
        return DRIVERS[0]
    word = value.lower()
    if word not in DRIVERS:
        raise ConfigError(f"{DRIVER}={value!r} is not a driver; use one of "
                          f"{', '.join(DRIVERS)} (or leave it unset for coralrt)")
    return word

def runtime_dir() -> Path:
    """Folder of the per-stick lock files (not created or checked here: that is
    :func:`coralrt._usb.lock.lock_dir`, which makes it 0700 and refuses one that is a
    symbolic link, another user's, or writable by others).

    ``CORALRT_RUNTIME_DIR`` if set, else ``platformdirs.user_runtime_dir("coralrt")``
    (without its warning when there is no ``XDG_RUNTIME_DIR``), else, when
    platformdirs fails, :func:`temp_runtime_dir`.
    """
    value = _get(RUNTIME_DIR)
    if value is not None:
        return Path(value)
    try:
        import platformdirs
        with warnings.catch_warnings():   # no XDG_RUNTIME_DIR: it warns and falls back
            warnings.simplefilter("ignore")
            return Path(platformdirs.user_runtime_dir("coralrt"))
    except Exception:  # noqa: BLE001 - no runtime dir on this platform
        return temp_runtime_dir()


def temp_runtime_dir() -> Path:
    """``<temp dir>/coralrt-<uid>``: where lock files go when the runtime folder cannot be used."""
    return Path(tempfile.gettempdir()) / f"coralrt-{os.getuid()}"


def firmware_dir() -> Path:
    """Where ``coralrt firmware install`` stores the stick's firmware:
    ``platformdirs.user_data_dir("coralrt")/firmware``."""
    import platformdirs  # only needed when asked

    return Path(platformdirs.user_data_dir("coralrt")) / "firmware"



# -- the compile service's answers (coralrt._compile.remote) -----------------------------

__all__ += ["COMPILER_URL_MAX_ANSWER", "DEFAULT_COMPILER_URL_MAX_ANSWER",
            "compiler_url_max_answer"]
COMPILER_URL_MAX_ANSWER = "CORALRT_COMPILER_URL_MAX_ANSWER"
DEFAULT_COMPILER_URL_MAX_ANSWER = 256 << 20   # a 64 MiB segment's answer is about 86 MiB


def compiler_url_max_answer() -> int:
    """Largest answer the ``remote`` compiler reads (``CORALRT_COMPILER_URL_MAX_ANSWER``)."""
    value = _get(COMPILER_URL_MAX_ANSWER)
    size = DEFAULT_COMPILER_URL_MAX_ANSWER if value is None else parse_size(value)
    if not size:
        raise ConfigError(f"{COMPILER_URL_MAX_ANSWER}={value!r} is not a size; give a number "
                          f"of bytes, optionally with a K, M or G suffix (for example 512M)")
    return size


# -- the compatibility layer without a stick ------------------------------------------

SIM_STICKS = "CORALRT_SIM_STICKS"
#: Simulated sticks presented under ``CORALRT_TARGET=sim``: enough for pycoral's
#: pipelined-model tests, which cut models in up to four segments.
DEFAULT_SIM_STICKS = 4
_MAX_SIM_STICKS = 64
PLAIN_MODELS = "CORALRT_PLAIN_MODELS"


def sim_sticks() -> int:
    """``CORALRT_SIM_STICKS``: how many simulated sticks the compatibility layer lists."""
    value = _get(SIM_STICKS)
    if value is None:
        return DEFAULT_SIM_STICKS
    if not value.isdigit() or not 1 <= int(value) <= _MAX_SIM_STICKS:
        raise ConfigError(f"{SIM_STICKS}={value!r} is not a number of sticks from 1 to "
                          f"{_MAX_SIM_STICKS}")
    return int(value)


def plain_model_dirs() -> list[Path]:
    """The folders of ``CORALRT_PLAIN_MODELS`` (``os.pathsep``-separated), in order;
    empty entries are skipped, and folders need not exist."""
    value = _get(PLAIN_MODELS)
    if value is None:
        return []
    return [Path(part).expanduser() for part in value.split(os.pathsep) if part.strip()]
