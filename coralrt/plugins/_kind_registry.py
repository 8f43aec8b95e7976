"""What plugins register by device kind: compilers (by the kinds they run on) and
device factories.

The precedence rule, the name checks, the device-kind aliases and the
per-plugin views are those of :mod:`coralrt.plugins._registry`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from coralrt import _config as config
from coralrt.errors import ConfigError
from coralrt.plugins._registry import (
    BUILTIN, UNNAMED, _check_name, _kind, _prefer, _Registration,
)

__all__ = ["CompilerRegistry", "DeviceRegistry", "CompilerRegistration", "DeviceRegistration"]


# -- compilers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Compiler:
    compiler: object
    plugin: str
    builtin: bool


class CompilerRegistry:
    """Compilers from plugins, by device kind (see the module docstring for
    which one wins)."""

    CATEGORIES = ("compilers",)

    def __init__(self) -> None:
        self._by_id: dict[str, _Compiler] = {}
        self._by_kind: dict[str, _Compiler] = {}

    def for_plugin(self, plugin: str) -> CompilerRegistration:
        """The view the ``coralrt_register_compilers`` hook of ``plugin`` receives."""
        return CompilerRegistration(self, plugin)

    def add(self, compiler, *, plugin: str = UNNAMED) -> None:
        """Register ``compiler`` from ``plugin``."""
        _missing = object()
        for attr in ("id", "version", "runs_on", "compile_segment"):
            # getattr_static: looking must not run a property (see ``version`` below).
            if inspect.getattr_static(compiler, attr, _missing) is _missing:
                raise ConfigError(f"compiler {compiler!r} has no {attr!r}")
        _check_name("compiler id", compiler.id)
        # A version that is a property is asked when a compile first needs it (a
        # compile service's answers over the network): not at registration.
        lazy = isinstance(inspect.getattr_static(compiler, "version"), property)
        if not lazy and not isinstance(compiler.version, str):
            raise ConfigError(f"compiler {compiler.id!r}: version must be a str, not "
                              f"{type(compiler.version).__name__}")
        if not isinstance(compiler.runs_on, (tuple, list, set, frozenset)) or not all(
                isinstance(kind, str) for kind in compiler.runs_on):
            raise ConfigError(f"compiler {compiler.id!r}: runs_on must be a tuple of device "
                              f"kinds (str), not {compiler.runs_on!r}")
        if not callable(compiler.compile_segment):
            raise ConfigError(f"compiler {compiler.id!r}: compile_segment is not callable")
        entry = _Compiler(compiler, plugin, plugin == BUILTIN)
        kinds = [_kind(kind, f"compiler {compiler.id!r}") for kind in compiler.runs_on]
        # Check every conflict before changing anything.
        by_id = _prefer(f"compiler id {compiler.id!r}", self._by_id.get(compiler.id), entry)
        by_kind = {kind: _prefer(f"a compiler for {kind!r} devices", self._by_kind.get(kind),
                                 entry)
                   for kind in kinds}
        self._by_id[compiler.id] = by_id
        self._by_kind.update(by_kind)

    @property
    def compilers(self) -> dict[str, object]:
        """Compiler id -> compiler (the winning one when two share an id)."""
        return {cid: e.compiler for cid, e in self._by_id.items()}

    def for_device(self, kind: str):
        """The compiler whose programs run on ``kind`` devices, or None: a
        third-party plugin's when one provides it, else coralrt's own
        (``"usb"`` is taken as ``"coral"``)."""
        entry = self._by_kind.get(config.device_kind(kind))
        return entry.compiler if entry is not None else None

    def plugin_for(self, kind: str) -> str | None:
        """The name of the plugin whose compiler :meth:`for_device` returns for ``kind``."""
        entry = self._by_kind.get(config.device_kind(kind))
        return entry.plugin if entry is not None else None

    def merge(self, other: CompilerRegistry) -> None:
        """Add every compiler of ``other``, each as the plugin that registered it."""
        for entry in other._by_id.values():
            self.add(entry.compiler, plugin=entry.plugin)

    def summary(self) -> dict[str, list[str]]:
        """``compilers``: the id of every compiler."""
        return {"compilers": sorted(self._by_id)}


class CompilerRegistration(_Registration):
    """What a plugin's ``coralrt_register_compilers`` hook receives."""

    def add(self, compiler) -> None:
        """Register ``compiler`` (``id``, ``version``, ``runs_on``, ``compile_segment``)."""
        self._registry.add(compiler, plugin=self.plugin)


# -- devices ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Device:
    factory: Callable
    plugin: str
    builtin: bool


class DeviceRegistry:
    """Device kinds from plugins (see the module docstring for which one wins)."""

    CATEGORIES = ("devices",)

    def __init__(self) -> None:
        self._kinds: dict[str, _Device] = {}

    def for_plugin(self, plugin: str) -> DeviceRegistration:
        """The view the ``coralrt_register_devices`` hook of ``plugin`` receives."""
        return DeviceRegistration(self, plugin)

    def add(self, kind: str, factory: Callable, *, plugin: str = UNNAMED) -> None:
        """Register device kind ``kind`` from ``plugin`` (``"usb"``: ``"coral"``,
        with a DeprecationWarning)."""
        _check_name("device kind", kind)
        kind = _kind(kind, f"plugin {plugin}")
        if not callable(factory):
            raise ConfigError(f"factory of device kind {kind!r} is not callable")
        self._kinds[kind] = _prefer(f"device kind {kind!r}", self._kinds.get(kind),
                                    _Device(factory, plugin, plugin == BUILTIN))

    @property
    def factories(self) -> dict[str, Callable]:
        """Device kind -> the factory that won it."""
        return {kind: e.factory for kind, e in self._kinds.items()}

    def plugin_for(self, kind: str) -> str | None:
        """The name of the plugin whose factory :meth:`create` uses for ``kind``."""
        entry = self._kinds.get(config.device_kind(kind))
        return entry.plugin if entry is not None else None

    def merge(self, other: DeviceRegistry) -> None:
        """Add every device kind of ``other``, each as the plugin that registered it."""
        for kind, entry in other._kinds.items():
            self.add(kind, entry.factory, plugin=entry.plugin)

    def summary(self) -> dict[str, list[str]]:
        return {"devices": sorted(self._kinds)}

    def create(self, kind: str, **options):
        """A new, unopened device of ``kind`` (``"usb"`` is taken as ``"coral"``):
        the winning factory called with ``options``."""
        entry = self._kinds.get(config.device_kind(kind))
        if entry is None:
            raise ConfigError(f"no device kind {kind!r}; known: {sorted(self._kinds)}")
        return entry.factory(**options)


class DeviceRegistration(_Registration):
    """What a plugin's ``coralrt_register_devices`` hook receives."""

    def add(self, kind: str, factory: Callable) -> None:
        """Register device kind ``kind``; ``factory(**options)`` returns an unopened device."""
        self._registry.add(kind, factory, plugin=self.plugin)

