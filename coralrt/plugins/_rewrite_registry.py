"""What plugins register for the rewrite stage: graph rewrites, by name.

Precedence is :mod:`coralrt.plugins._registry`'s rule: a third-party
plugin's rewrite wins over coralrt's own of the same name, and two
third-party plugins providing one name are a :class:`~coralrt.errors.ConfigError`.
The contract a rewrite meets is in :mod:`coralrt._compile.rewrite.base`.
"""

from __future__ import annotations

from dataclasses import dataclass

from coralrt.errors import ConfigError
from coralrt.plugins._registry import BUILTIN, UNNAMED, _check_name, _prefer, _Registration

__all__ = ["RewriteRegistry", "RewriteRegistration"]

_ATTRS = ("name", "version", "exact", "order", "description", "apply")


@dataclass(frozen=True)
class _Entry:
    rewrite: object
    plugin: str
    builtin: bool


class RewriteRegistry:
    """Rewrite name -> rewrite (see the module docstring for which one wins)."""

    CATEGORIES = ("rewrites",)

    def __init__(self) -> None:
        self._by_name: dict[str, _Entry] = {}

    def for_plugin(self, plugin: str) -> RewriteRegistration:
        """The view the ``coralrt_register_rewrites`` hook of ``plugin`` receives."""
        return RewriteRegistration(self, plugin)

    def add(self, rewrite, *, plugin: str = UNNAMED) -> None:
        """Register ``rewrite`` from ``plugin``."""
        for attr in _ATTRS:
            if not hasattr(rewrite, attr):
                raise ConfigError(f"rewrite {rewrite!r} has no {attr!r}")
        _check_name("rewrite name", rewrite.name)
        if not isinstance(rewrite.exact, bool):
            raise ConfigError(f"rewrite {rewrite.name!r}: exact must be a bool")
        for attr in ("version", "order"):
            if not isinstance(getattr(rewrite, attr), int) or isinstance(
                    getattr(rewrite, attr), bool):
                raise ConfigError(f"rewrite {rewrite.name!r}: {attr} must be an int")
        if not callable(rewrite.apply):
            raise ConfigError(f"rewrite {rewrite.name!r}: apply is not callable")
        self._by_name[rewrite.name] = _prefer(
            f"rewrite {rewrite.name!r}", self._by_name.get(rewrite.name),
            _Entry(rewrite, plugin, plugin == BUILTIN))

    @property
    def rewrites(self) -> dict[str, object]:
        """Name -> the rewrite that won it."""
        return {name: e.rewrite for name, e in self._by_name.items()}

    def plugin_for(self, name: str) -> str | None:
        entry = self._by_name.get(name)
        return entry.plugin if entry is not None else None

    def merge(self, other: RewriteRegistry) -> None:
        """Add every rewrite of ``other``, each as the plugin that registered it."""
        for entry in other._by_name.values():
            self.add(entry.rewrite, plugin=entry.plugin)

    def summary(self) -> dict[str, list[str]]:
        """``rewrites``: every name, approximations marked with ``~``."""
        return {"rewrites": sorted(n if e.rewrite.exact else f"{n}~"
                                   for n, e in self._by_name.items())}


class RewriteRegistration(_Registration):
    """What a plugin's ``coralrt_register_rewrites`` hook receives."""

    def add(self, rewrite) -> None:
        """Register ``rewrite`` (``name``, ``version``, ``exact``, ``order``,
        ``description``, ``apply(editor)``; see :mod:`coralrt._compile.rewrite.base`)."""
        self._registry.add(rewrite, plugin=self.plugin)
