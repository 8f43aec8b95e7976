"""The plugin manager: built-ins, entry points, explicit plugins.

``plugin_host(extra)`` returns a :class:`PluginHost` holding a pluggy manager
with coralrt's built-ins, the plugins of the ``coralrt`` entry-point group
(unless ``CORALRT_DISABLE_PLUGIN_AUTOLOAD=1``) and ``extra`` plugin objects,
and the registries they filled.  The host without extras is built once per
process; sessions with their own plugins get their own host.
"""

from __future__ import annotations

import logging
import threading

import pluggy

from coralrt import config
from coralrt.plugins import builtins, hookspecs
from coralrt.plugins.registry import CompilerRegistry, DeviceRegistry, OpRegistry
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
        pm.register(builtins, "coralrt.builtins")
        if config.plugin_autoload():
            try:
                n = pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
            except Exception as e:  # a broken third-party package must say who it is
                raise PluginError(f"loading plugins of entry-point group "
                                  f"{ENTRY_POINT_GROUP!r} failed: {e}") from e
            if n:
                log.info("loaded %d plugin(s) from entry points: %s", n,
                         ", ".join(name for name, _ in pm.list_name_plugin()
                                   if name != "coralrt.builtins"))
        for plugin in extra:
            try:
                pm.register(plugin)
            except ValueError as e:
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
        self.wraps_steps = any(i.plugin_name != "coralrt.builtins" for i in impls)

    def _fill(self) -> None:
        for impl in self.pm.hook.coralrt_register_ops.get_hookimpls():
            self.ops._current = impl.plugin_name
            impl.function(registry=self.ops)
        self.ops._current = "?"
        self.pm.hook.coralrt_register_compilers(registry=self.compilers)
        self.pm.hook.coralrt_register_devices(registry=self.devices)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.pm.list_name_plugin()]

    def compile_event(self, **event) -> None:
        self.pm.hook.coralrt_compile_event(event=event)

    def run_step(self, step, inputs):
        return self.pm.hook.coralrt_run_step(step=step, inputs=inputs)


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
