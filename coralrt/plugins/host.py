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
in), with that plugin's view of the registry, so each entry records its
plugin.  Which entry wins is the registries' rule (``registry.py``), not the
order of the calls.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable

import pluggy

from coralrt import config
from coralrt.plugins import builtins, hookspecs
from coralrt.plugins.registry import BUILTIN, CompilerRegistry, DeviceRegistry, OpRegistry
from coralrt.errors import PluginError

__all__ = ["PluginHost", "plugin_host", "ENTRY_POINT_GROUP"]

log = logging.getLogger("coralrt.plugins")

ENTRY_POINT_GROUP = "coralrt"

_default: PluginHost | None = None
_lock = threading.Lock()


class PluginHost:
    def __init__(self, extra=()):
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        pm.register(builtins, BUILTIN)
        if config.plugin_autoload():
            try:
                n = pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
            except Exception as e:  # a broken third-party package must say who it is
                raise PluginError(f"loading plugins of entry-point group "
                                  f"{ENTRY_POINT_GROUP!r} failed: {e}") from e
            if n:
                log.info("loaded %d plugin(s) from entry points: %s", n,
                         ", ".join(name for name, _ in pm.list_name_plugin()
                                   if name != BUILTIN))
        for plugin in extra:
            try:
                pm.register(plugin)
            except (ValueError, pluggy.PluginValidationError) as e:
                raise PluginError(f"cannot register plugin {plugin!r}: {e}") from e
        try:
            pm.check_pending()
        except pluggy.PluginValidationError as e:
            raise PluginError(f"{e} (a @coralrt.hookimpl function must be named after a "
                              f"hook in coralrt/plugins/hookspecs.py)") from e
        self.pm = pm
        self.ops = OpRegistry()
        self.compilers = CompilerRegistry()
        self.devices = DeviceRegistry()
        self._fill()
        # Only route steps through pluggy when someone wraps them: the hook
        # call costs microseconds on the per-inference path.
        impls = pm.hook.coralrt_run_step.get_hookimpls()
        self.wraps_steps = any(i.plugin_name != BUILTIN for i in impls)
        self._run_step = pm.hook.coralrt_run_step

    def _fill(self) -> None:
        self._register("coralrt_register_ops", self.ops)
        self._register("coralrt_register_compilers", self.compilers)
        self._register("coralrt_register_devices", self.devices)

    def _register(self, hook: str, registry) -> None:
        """Call registration hook ``hook`` through pluggy once per plugin that
        implements it, each time with ``registry.for_plugin(name)``."""
        caller = getattr(self.pm.hook, hook)
        impls = caller.get_hookimpls()
        providers = [(name, plugin) for name, plugin in self.pm.list_name_plugin()
                     if any(i.plugin is plugin and not (i.wrapper or i.hookwrapper)
                            for i in impls)]  # in registration order
        if len(providers) > 1:
            for i in impls:  # pluggy keeps the plugins of a subset call in a set
                if not isinstance(i.plugin, Hashable):
                    raise PluginError(f"plugin {i.plugin_name} is not hashable; a plugin "
                                      f"object must be (a @dataclass plugin: eq=False)")
        for name, plugin in providers:
            call = caller
            if len(providers) > 1:
                # Without the other implementers; the wrappers of every plugin
                # stay in (a plugin that also implements the hook, through
                # ``specname``, wraps only its own call).
                call = self.pm.subset_hook_caller(
                    hook, remove_plugins=[p for _, p in providers if p is not plugin])
            call(registry=registry.for_plugin(name))

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.pm.list_name_plugin()]

    def compile_event(self, **event) -> None:
        self.pm.hook.coralrt_compile_event(event=event)

    def run_step(self, step, inputs):
        """Run one step through the ``coralrt_run_step`` hook; ``step`` is its
        :class:`~coralrt.runtime.info.StepInfo`.  The executor calls this only
        when :attr:`wraps_steps` (a plugin implements the hook)."""
        return self._run_step(step=step, inputs=inputs)


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
    """Forget the process-wide host (tests that install or remove plugins)."""
    global _default
    with _lock:
        _default = None
