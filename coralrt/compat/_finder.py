"""The import hook: ``tflite_runtime`` and ``pycoral`` resolve to coralrt's modules.

A :class:`CompatFinder` placed first on :data:`sys.meta_path` answers for
``tflite_runtime``, ``pycoral`` and every submodule of either, and the import
returns coralrt's module itself (the same object)::

    import tflite_runtime.interpreter as tfl    # tfl is coralrt.tflite.interpreter

It also answers for the one module ``ai_edge_litert.interpreter`` (LiteRT's
own, the successor of tflite_runtime), with :mod:`coralrt.compat._litert`:
LiteRT itself except where a program loads libedgetpu's delegate, which then
runs on coralrt.  The rest of the ``ai_edge_litert`` package is LiteRT's.

Nothing of coralrt is imported until a mapped name is: this module uses the
standard library only, so the start-up hook (``CORALRT_COMPAT=1``) can load
it on its own, before any other package, without importing coralrt or NumPy.

The finder carries the attribute ``coralrt_compat = True``: coralrt's own
``tflite_runtime`` CPU backend sets such finders (and the aliases they put
in :data:`sys.modules`) aside while it imports the real package, so it never
gets coralrt's stand-in (``coralrt/_backends/litert.py``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

__all__ = ["ALIASES", "MODULES", "ENV", "CompatFinder", "install", "uninstall", "installed",
           "target_of", "env_enabled"]

#: Names an unmodified program imports -> the coralrt package that provides them.
ALIASES = {"tflite_runtime": "coralrt.tflite", "pycoral": "coralrt.pycoral"}
#: Single modules (not their packages) -> the coralrt module that stands in for them.
MODULES = {"ai_edge_litert.interpreter": "coralrt.compat._litert"}

#: The variable the start-up hook reads.
ENV = "CORALRT_COMPAT"

_OFF = ("", "0", "false", "no", "off")


def env_enabled(environ=None) -> bool:
    """Whether ``CORALRT_COMPAT`` asks for the hook: anything but unset, empty, 0,
    false, no or off (case-insensitive). Never raises."""
    value = (os.environ if environ is None else environ).get(ENV, "")
    return value.strip().lower() not in _OFF


def target_of(fullname: str) -> str | None:
    """The coralrt module that provides ``fullname``, or None when it is not mapped."""
    if fullname in MODULES:
        return MODULES[fullname]
    top, dot, rest = fullname.partition(".")
    base = ALIASES.get(top)
    if base is None:
        return None
    return base + dot + rest


class CompatFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``tflite_runtime[.*]`` and ``pycoral[.*]``; loading one puts coralrt's
    module in :data:`sys.modules` under the asked-for name."""

    coralrt_compat = True

    @staticmethod
    def coralrt_maps(fullname: str) -> bool:
        """Whether this finder answers for ``fullname`` (coralrt's CPU backends set
        such names aside while they import the installed package)."""
        return target_of(fullname) is not None

    def find_spec(self, fullname, path=None, target=None):
        name = target_of(fullname)
        if name is None:
            return None
        if fullname.partition(".")[2] and fullname not in MODULES:
            # A submodule: only when coralrt has it, so that a missing one fails as
            # "No module named 'pycoral.x'" (the parent is coralrt's, already imported).
            try:
                if importlib.util.find_spec(name) is None:
                    return None
            except (ImportError, ValueError):
                return None
        # The spec's own module is a throwaway: exec_module swaps in coralrt's, which
        # the import system then returns, so coralrt's __spec__ and __name__ stay intact.
        return importlib.machinery.ModuleSpec(fullname, self, origin=f"alias of {name}",
                                              is_package=True)

    def create_module(self, spec):
        return None     # the default (throwaway) module

    def exec_module(self, module) -> None:
        fullname = module.__spec__.name
        real = importlib.import_module(target_of(fullname))
        sys.modules[fullname] = real

    def __repr__(self) -> str:
        return ("<coralrt.compat.CompatFinder: tflite_runtime, pycoral, "
                "ai_edge_litert.interpreter -> coralrt>")


# Real modules install() took out of sys.modules, for uninstall() to put back.
_set_aside: dict = {}


def _finders() -> list:
    return [f for f in sys.meta_path if getattr(f, "coralrt_compat", False)]


def installed() -> bool:
    """Whether a coralrt compat finder is on :data:`sys.meta_path`."""
    return bool(_finders())


def _mapped_entries() -> list[str]:
    return [k for k in list(sys.modules) if target_of(k) is not None]


def install() -> CompatFinder:
    """Put the finder first on :data:`sys.meta_path` (once; a second call only moves it
    back to the front). Modules of a real ``tflite_runtime`` or ``pycoral`` already
    imported leave :data:`sys.modules` (their objects live on where referenced), so
    the next import of either name gets coralrt's."""
    finders = _finders()
    finder = finders[0] if finders else CompatFinder()
    for f in finders:
        sys.meta_path.remove(f)
    sys.meta_path.insert(0, finder)
    for key in _mapped_entries():
        module = sys.modules.get(key)
        if getattr(module, "__name__", key) == key:     # a real module, not an alias
            _set_aside.setdefault(key, module)
            del sys.modules[key]
    return finder


def uninstall() -> None:
    """Remove the finder and the aliases it put in :data:`sys.modules`."""
    for f in _finders():
        sys.meta_path.remove(f)
    for key in _mapped_entries():
        module = sys.modules.get(key)
        if getattr(module, "__name__", key) != key:     # an alias of a coralrt module
            del sys.modules[key]
    # The real modules install() took out come back, so that the next import gets the
    # same module objects as before (a second copy of a native package would not mix
    # with the first: its enums and classes would be other objects).
    for key, module in _set_aside.items():
        sys.modules.setdefault(key, module)
        parent, _, child = key.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, sys.modules[key])
    _set_aside.clear()
