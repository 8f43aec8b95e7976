"""The plugin manager: built-ins, entry points, explicit plugins.

``plugin_host(extra)`` returns a :class:`PluginHost` holding a pluggy manager
with coralrt's built-ins, the plugins of the ``coralrt`` entry-point group
(unless ``CORALRT_DISABLE_PLUGIN_AUTOLOAD=1``) and ``extra`` plugin objects,
and the registries they filled.  The host without extras is built once per
process; sessions with their own plugins get their own host.

Every hook is called through pluggy, so hook wrappers and pluggy's tracing
(``pm.add_hookcall_monitoring``, ``pm.enable_tracing``) see every call.  A
registration hook is called once per plugin implementing it (a
``pm.subset_hook_caller`` without the other implementers; every wrapper stays
in), with that plugin's view of a registry of its own; once every plugin has
registered, the registries of those that did so without an error are merged
into the host's, so each entry records its plugin and a plugin that fails
half-way adds nothing.  Which entry wins is the registries' rule
(``registry.py``), not the order of the calls.

A broken installed plugin (its entry point does not import, it breaks the
contract, or a registration hook raises or returns something) is
unregistered and skipped with one warning per process, or raises
:class:`~coralrt.errors.PluginError` when ``CORALRT_PLUGINS_STRICT=1``.  A
broken explicit plugin always raises ``PluginError``; a failure of coralrt's
own plugin propagates unchanged.  Two working plugins providing the same
thing stay a :class:`~coralrt.errors.ConfigError`.
"""

from __future__ import annotations

import logging
import threading

import pluggy

from coralrt import _config as config
from coralrt.errors import ConfigError, PluginError
from coralrt.plugins import _builtins as builtins, _hookspecs as hookspecs
from coralrt.plugins._loader import (
    REGISTRATION_PREFIX, PluginRecord, hook_names, hooks_of, load_installed, object_name,
    one_line, register,
)
from coralrt.plugins._kind_registry import CompilerRegistry, DeviceRegistry
from coralrt.plugins._registry import BUILTIN, OpRegistry
from coralrt.plugins._rewrite_registry import RewriteRegistry
from coralrt._version import version as coralrt_version

__all__ = ["PluginHost", "plugin_host", "ENTRY_POINT_GROUP", "REGISTRIES", "columns"]

log = logging.getLogger("coralrt.plugins")

ENTRY_POINT_GROUP = "coralrt"

#: Registration hook -> (host attribute, registry class).  A registry class
#: names what it holds in ``CATEGORIES`` and reports it with ``summary()``.
REGISTRIES = {
    "coralrt_register_ops": ("ops", OpRegistry),
    "coralrt_register_compilers": ("compilers", CompilerRegistry),
    "coralrt_register_devices": ("devices", DeviceRegistry),
    "coralrt_register_rewrites": ("rewrites", RewriteRegistry),
}

_default: PluginHost | None = None
_lock = threading.Lock()
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def columns() -> list[str]:
    """What plugins can provide, in the contract's order: each registration
    hook's registry categories (``operators``, ``rules``, ``compilers``,
    ``devices``), or the hook's own short name for a hook this host does not
    fill yet."""
    cols: list[str] = []
    for hook in hook_names():
        if hook.startswith(REGISTRATION_PREFIX):
            entry = REGISTRIES.get(hook)
            cols += entry[1].CATEGORIES if entry else [hook[len(REGISTRATION_PREFIX):]]
    return cols


class PluginHost:
    """``strict``: a broken installed plugin raises instead of being skipped
    (default: ``CORALRT_PLUGINS_STRICT``).  ``survey``: for listing only
    (``coralrt plugins``): installed plugins are listed even when autoload is
    off, nothing is warned, and conflicts are recorded instead of raised.

    ``records`` lists every plugin seen (:class:`~coralrt.plugins._loader.PluginRecord`),
    ``ops``, ``compilers``, ``devices`` and ``rewrites`` are the registries (:data:`REGISTRIES`).
    """

    ops: OpRegistry
    compilers: CompilerRegistry
    devices: DeviceRegistry
    rewrites: RewriteRegistry

    def __init__(self, extra=(), *, strict: bool | None = None, survey: bool = False):
        self.strict = config.plugins_strict() if strict is None else bool(strict)
        self._survey = survey
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        self.pm = pm
        pm.register(builtins, BUILTIN)
        self.records: list[PluginRecord] = [PluginRecord(
            BUILTIN, "builtin", "coralrt", coralrt_version(), plugin=builtins,
            hooks=hooks_of(pm, builtins))]
        autoload = config.plugin_autoload()
        if autoload or survey:
            for record, error in load_installed(pm, ENTRY_POINT_GROUP, load=autoload):
                self.records.append(record)
                if error is not None:
                    self._broken(record, record.error, error)
        for plugin in extra:
            name = object_name(plugin, lambda n: pm.has_plugin(n) or pm.is_blocked(n))
            record = PluginRecord(name, "explicit", plugin=plugin)
            self.records.append(record)
            try:
                register(pm, plugin, name)
            except Exception as e:  # noqa: BLE001 - said in the PluginError
                record.status, record.error = "skipped", one_line(e)
                raise PluginError(f"cannot register plugin {name}: {one_line(e)}") from e
            record.hooks = hooks_of(pm, plugin)
        for attr, cls in REGISTRIES.values():
            setattr(self, attr, cls())
        self._fill()
        loaded = [r.name for r in self.records if r.source == "installed"
                  and r.status == "loaded"]
        if loaded and not survey:
            log.info("loaded %d plugin(s) from entry points: %s", len(loaded),
                     ", ".join(loaded))
        # Only route steps through pluggy when someone wraps them: the hook
        # call costs microseconds on the per-inference path.
        impls = pm.hook.coralrt_run_step.get_hookimpls()
        self.wraps_steps = any(i.plugin_name != BUILTIN for i in impls)
        self._run_step = pm.hook.coralrt_run_step

    # -- registration ---------------------------------------------------------------------

    def _fill(self) -> None:
        staged: dict[str, dict[str, object]] = {}
        for hook, (attr, cls) in REGISTRIES.items():
            for record, call in self._callers(hook):
                registry = staged.setdefault(record.name, {}).setdefault(attr, cls())
                try:
                    results = call(registry=registry.for_plugin(record.name))
                except Exception as e:
                    if record.source == "builtin":
                        raise
                    self._broken(record, f"{hook} raised {one_line(e)}", e)
                    continue
                if results:  # pluggy collects the non-None return values
                    error = PluginError(f"{hook} returned {type(results[0]).__name__} "
                                        f"{_short(results[0])}; a registration hook returns "
                                        f"nothing and adds through its registry")
                    if record.source == "builtin":
                        raise error
                    self._broken(record, str(error), error)
        for record in self.records:
            mine = staged.get(record.name, {}) if record.status == "loaded" else {}
            for attr, _ in REGISTRIES.values():
                if attr not in mine:
                    continue
                try:
                    getattr(self, attr).merge(mine[attr])
                except ConfigError as e:
                    if not self._survey:
                        raise
                    record.status, record.error = "conflict", str(e)
            record.provides = self._provides(record, mine)

    def _callers(self, hook: str):
        """``(record, caller)`` per loaded plugin implementing ``hook``, in
        registration order; each caller calls that plugin's implementation only."""
        caller = getattr(self.pm.hook, hook)
        impls = caller.get_hookimpls()
        providers = [(name, plugin) for name, plugin in self.pm.list_name_plugin()
                     if any(i.plugin is plugin and not (i.wrapper or i.hookwrapper)
                            for i in impls)]
        by_name = {r.name: r for r in self.records}
        for name, plugin in providers:
            record = by_name[name]
            if record.status != "loaded":      # broken by an earlier hook
                continue
            call = caller
            if len(providers) > 1:
                # Without the other implementers; the wrappers of every plugin
                # stay in (a plugin that also implements the hook, through
                # ``specname``, wraps only its own call).
                call = self.pm.subset_hook_caller(
                    hook, remove_plugins=[p for _, p in providers if p is not plugin])
            yield record, call

    def _provides(self, record: PluginRecord, mine: dict) -> dict[str, list[str]]:
        provides: dict[str, list[str]] = {}
        for hook in hook_names():
            if not hook.startswith(REGISTRATION_PREFIX):
                continue
            entry = REGISTRIES.get(hook)
            if entry is None:   # a hook this host does not fill: say who implements it
                provides[hook[len(REGISTRATION_PREFIX):]] = \
                    ["yes"] if hook in record.hooks else []
                continue
            attr, cls = entry
            summary = mine[attr].summary() if attr in mine else {}
            for category in cls.CATEGORIES:
                provides[category] = list(summary.get(category, []))
        return provides

    def _broken(self, record: PluginRecord, message: str, error: Exception) -> None:
        """``record``'s plugin is broken (``message`` says how): unregister it, then
        raise (explicit plugins, strict mode) or warn once and go on without it."""
        record.status, record.error = "skipped", message
        if record.plugin is not None and self.pm.is_registered(record.plugin):
            self.pm.unregister(record.plugin)
        if self._survey:
            return
        if record.source == "explicit":
            raise PluginError(f"plugin {record.name}: {message}") from error
        if self.strict:
            raise PluginError(
                f"plugin {record.name!r} ({record.origin}) is broken: {message} "
                f"[strict mode ({config.PLUGINS_STRICT}=1); unset it to skip a broken "
                f"installed plugin with a warning, or set "
                f"{config.DISABLE_PLUGIN_AUTOLOAD}=1 to load no installed plugins]"
            ) from error
        self._warn_once(record, message, "is skipped, coralrt runs without it")

    @staticmethod
    def _warn_once(record: PluginRecord, message: str, outcome: str) -> None:
        """One WARNING per plugin and message per process; DEBUG after that."""
        key = (record.name, message)
        with _warned_lock:
            first = key not in _warned
            _warned.add(key)
        log.log(logging.WARNING if first else logging.DEBUG,
                "plugin %r (%s) %s: %s. Set %s=1 to load no installed plugins, or %s=1 to "
                "make this an error", record.name, record.origin, outcome, message,
                config.DISABLE_PLUGIN_AUTOLOAD, config.PLUGINS_STRICT)

    # -- what the host holds --------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.pm.list_name_plugin()]

    def describe(self) -> list[dict]:
        """Every plugin the host saw, loaded or not, as :meth:`PluginRecord.to_dict`."""
        return [r.to_dict() for r in self.records]

    def compile_event(self, **event) -> None:
        """Tell every observer; one that raises does not stop the compile or the
        other observers (it is warned about once; an explicit plugin's error
        and strict mode raise ``PluginError``)."""
        hook = "coralrt_compile_event"
        for record, call in self._callers(hook):
            try:
                call(event=event)
            except Exception as e:
                if record.source == "builtin":
                    raise
                message = f"{hook} raised {one_line(e)}"
                if record.source == "explicit" or self.strict:
                    raise PluginError(f"plugin {record.name!r} ({record.origin}): "
                                      f"{message}") from e
                self._warn_once(record, message, "failed, the compile goes on without it")

    def run_step(self, step, inputs):
        """Run one step through the ``coralrt_run_step`` hook; ``step`` is its
        :class:`~coralrt._runtime.info.StepInfo`.  The executor calls this only
        when :attr:`wraps_steps` (a plugin implements the hook)."""
        return self._run_step(step=step, inputs=inputs)


def _short(value) -> str:
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a plugin's object
        return "(unprintable)"
    return text if len(text) <= 60 else text[:57] + "..."


def plugin_host(extra=()) -> PluginHost:
    """The host with built-ins and entry points, plus ``extra`` plugins if any."""
    global _default
    if extra:
        return PluginHost(extra)
    with _lock:
        if _default is None:
            _default = PluginHost()
        return _default


def reset() -> None:
    """Forget the process-wide host and the warnings given (tests that install or
    remove plugins)."""
    global _default
    with _lock:
        _default = None
    with _warned_lock:
        _warned.clear()
