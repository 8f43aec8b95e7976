"""Finding, naming and registering plugins, each on its own.

Every plugin gets a :class:`PluginRecord`: where it comes from, its name in
the plugin manager, and, when it is broken, why.  Installed plugins are
loaded one entry point at a time (:func:`load_installed`), so one that fails
to import or to register leaves the others loaded; the host decides what a
failure means (``host.py``: skipped with a warning, or an error in strict
mode and for explicit plugins).

Names: an installed plugin is registered under its entry-point name (the
name before ``=`` in ``[project.entry-points.coralrt]``), a plugin object
under its class (``module.QualName``, a module under its own name), with
``#2``, ``#3`` ... for further objects of the same class.
"""

from __future__ import annotations

import importlib.metadata
import types
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field

import pluggy

from coralrt.plugins import _hookspecs as hookspecs

__all__ = ["PluginRecord", "REGISTRATION_PREFIX", "hook_names", "object_name", "entry_points",
           "load_installed", "register", "hooks_of", "one_line"]

REGISTRATION_PREFIX = "coralrt_register_"


def hook_names() -> list[str]:
    """Every hook of the contract, in the order ``hookspecs.py`` defines them."""
    return [name for name, fn in vars(hookspecs).items()
            if name.startswith("coralrt_") and callable(fn)]

_HOOK_HELP = "a @coralrt.hookimpl function must be named after a hook in " \
             "coralrt/plugins/_hookspecs.py"


@dataclass
class PluginRecord:
    """One plugin as the host saw it.

    ``source`` is ``"builtin"``, ``"installed"`` (an entry point) or
    ``"explicit"`` (passed to the session); ``distribution`` and ``version``
    name the installed package (coralrt itself for the built-ins);
    ``entry_point`` is the entry point's target (``module:attr``).
    ``status`` is ``"loaded"``, ``"skipped"`` (broken: ``error`` says why),
    ``"conflict"`` (``coralrt plugins`` only: ``error`` names the other
    plugin) or ``"disabled"`` (found, not loaded: autoload is off).
    ``provides`` maps each column of ``coralrt plugins`` (operators, rules,
    compilers, devices ...) to what the plugin registered; ``hooks`` lists
    the hooks it implements.
    """

    name: str
    source: str
    distribution: str | None = None
    version: str | None = None
    entry_point: str | None = None
    status: str = "loaded"
    error: str | None = None
    provides: dict[str, list[str]] = field(default_factory=dict)
    hooks: list[str] = field(default_factory=list)
    plugin: object = field(default=None, repr=False, compare=False)

    @property
    def origin(self) -> str:
        """Where it comes from, for messages: ``entry point x = m:a in dist 1.0``."""
        if self.source == "installed":
            dist = f" in {self.distribution} {self.version}" if self.distribution else ""
            return f"entry point {self.name} = {self.entry_point}{dist}"
        if self.source == "builtin":
            return "coralrt's own plugin"
        return "passed to the session"

    def to_dict(self) -> dict:
        return {"name": self.name, "source": self.source, "distribution": self.distribution,
                "version": self.version, "entry_point": self.entry_point,
                "status": self.status, "error": self.error,
                "provides": {k: list(v) for k, v in self.provides.items()},
                "hooks": list(self.hooks)}


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (pluggy's validation messages span several)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def object_name(plugin, taken) -> str:
    """The name of a plugin object: ``module.QualName`` of its class (a module's
    own name), with ``#2``, ``#3`` ... when ``taken(name)`` says it is in use."""
    if isinstance(plugin, types.ModuleType):
        base = plugin.__name__
    else:
        cls = plugin if isinstance(plugin, type) else type(plugin)
        base = f"{cls.__module__}.{cls.__qualname__}"
    name, n = base, 1
    while taken(name):
        n += 1
        name = f"{base}#{n}"
    return name


def entry_points(group: str) -> Iterator[tuple[importlib.metadata.EntryPoint, str | None,
                                               str | None]]:
    """``(entry point, distribution name, version)`` of every entry point in
    ``group``, in the order of the distributions on ``sys.path``."""
    for dist in list(importlib.metadata.distributions()):
        try:
            eps = [ep for ep in dist.entry_points if ep.group == group]
        except Exception:  # noqa: BLE001 - unreadable metadata of an unrelated package
            continue
        if not eps:
            continue
        try:
            name, version = dist.metadata["Name"], dist.version
        except Exception:  # noqa: BLE001
            name = version = None
        for ep in eps:
            yield ep, name, version


def register(pm: pluggy.PluginManager, plugin, name: str) -> None:
    """Register ``plugin`` as ``name`` and check it against the contract; on any
    defect it is not (or no longer) registered and the exception says why."""
    pm.register(plugin, name)
    try:
        unknown = sorted({c.name for c in pm.get_hookcallers(plugin) or ()
                          if not c.has_spec() and any(
                              i.plugin is plugin and not i.optionalhook
                              for i in c.get_hookimpls())})
        if unknown:
            raise pluggy.PluginValidationError(
                plugin, f"unknown hook {', '.join(map(repr, unknown))} in plugin {name} "
                        f"({_HOOK_HELP})")
        if not isinstance(plugin, Hashable):   # pluggy keeps the plugins of a subset call in a set
            raise pluggy.PluginValidationError(
                plugin, f"plugin {name} is not hashable; a plugin object must be "
                        f"(a @dataclass plugin: eq=False)")
    except BaseException:
        pm.unregister(plugin)
        raise


def hooks_of(pm: pluggy.PluginManager, plugin) -> list[str]:
    """The hooks ``plugin`` implements, in the contract's order."""
    names = {c.name for c in pm.get_hookcallers(plugin) or ()}
    known = hook_names()
    return [h for h in known if h in names] + sorted(names - set(known))


def load_installed(pm: pluggy.PluginManager, group: str, *, load: bool = True
                   ) -> Iterator[tuple[PluginRecord, Exception | None]]:
    """Load and register the plugins of entry-point group ``group``, one by one.

    Yields each one's record with None, or with the exception that broke it
    (then ``record.status`` is ``"skipped"`` and ``record.error`` says why;
    the plugin is not registered).  An entry point whose name is already
    registered from the same distribution (a package found twice on
    ``sys.path``) is passed over.  ``load=False`` lists them without importing
    anything (status ``"disabled"``).
    """
    seen: dict[str, str | None] = {}
    for ep, dist, version in entry_points(group):
        if ep.name in seen and seen[ep.name] == dist:
            continue
        record = PluginRecord(ep.name, "installed", dist, version, ep.value)
        if not load:
            seen[ep.name] = dist
            record.status = "disabled"
            yield record, None
            continue
        if pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
            other = f" (from {seen[ep.name]})" if seen.get(ep.name) else ""
            error = ValueError(f"another plugin is already registered as {ep.name!r}{other}; "
                               f"rename one of the entry points")
            record.status, record.error = "skipped", one_line(error)
            yield record, error
            continue
        seen[ep.name] = dist
        try:
            plugin = ep.load()
            record.plugin = plugin
            register(pm, plugin, ep.name)
        except Exception as e:  # noqa: BLE001 - any defect of a third-party package
            stage = "registering" if record.plugin is not None else "loading"
            record.status = "skipped"
            record.error = f"{stage} it failed: {one_line(e)}"
            yield record, e
            continue
        record.hooks = hooks_of(pm, plugin)
        yield record, None
