"""What plugins register: operator specs, CPU kernels and Edge TPU rules, compilers, devices.

Every entry records the plugin that registered it.  Precedence is this
module's rule, not the order in which pluggy calls the plugins:

- an entry of a third-party plugin wins over one of coralrt's own plugin
  (:data:`BUILTIN`, ``coralrt/plugins/_builtins.py``), whichever came first;
- two entries of the same rank for the same thing (two third-party plugins,
  or one plugin twice) are a :class:`~coralrt.errors.ConfigError` naming
  both plugins.  "The same thing" is an operator name (operator spec, CPU
  kernel, Edge TPU operator), a device kind (device factory; a compiler's ``runs_on`` kinds)
  or a compiler id.

A registration hook receives a *view* of a registry (``registry.for_plugin(name)``),
whose ``add`` methods record that plugin's name; the host hands each plugin
its own view (``coralrt/plugins/_host.py``) of a registry of its own, and
``merge``s the registries of the plugins that registered without an error
into the session's: a plugin whose hook fails adds nothing.  ``add`` checks
the types of what it is given (a ``ConfigError`` otherwise), and
:meth:`OpRegistry.sim_kernels` wraps the plugins' Edge TPU kernels so that
what they raise names the operator and the plugin.  The compiler and device
registries, which follow the same rule, are in ``_kind_registry.py``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

from coralrt import _config as config
from coralrt._compile.rules import OpSupport, RuleRegistry, default_rules
from coralrt.errors import ConfigError, InferenceError, PluginError
from coralrt._ops import OpSpec, resolve
from coralrt._runtime.info import OpInfo

__all__ = ["BUILTIN", "UNNAMED", "OpInfo", "CpuKernel", "OpRegistry", "OpRegistration"]

log = logging.getLogger("coralrt.plugins")

#: The plugin name of coralrt's own plugin; every other plugin wins over it.
BUILTIN = "coralrt.builtins"
#: The plugin recorded for entries added without naming one (a registry used
#: directly rather than through a plugin's view); ranked as a third party.
UNNAMED = "?"

CpuKernel = Callable[[list, OpInfo], list]


def _prefer(what: str, old, new):
    """The entry that provides ``what``: ``old`` (None if nothing did) or
    ``new``.  A third-party entry wins over a built-in one; two of one rank
    are an error."""
    if old is None:
        return new
    if old.builtin != new.builtin:
        winner = new if old.builtin else old
        log.debug("%s: plugin %s wins over coralrt's own", what, winner.plugin)
        return winner
    if old.plugin == new.plugin:
        who = "a registry used without a plugin view" if new.plugin == UNNAMED \
            else f"plugin {new.plugin}"
        raise ConfigError(f"{who} provides {what} twice")
    raise ConfigError(f"two plugins provide {what} ({old.plugin} and {new.plugin}); "
                      f"uninstall or leave out one of them (CORALRT_DISABLE_PLUGIN_AUTOLOAD=1 "
                      f"skips the installed ones)")


def _check_name(what: str, value) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what} must be a non-empty str, not {value!r}")


_WARNED: set[tuple[str, str]] = set()


def _kind(kind: str, who: str) -> str:
    """The device kind a plugin registers ``kind`` as: a former word
    (``"usb"``) is taken as today's (``"coral"``) with a DeprecationWarning."""
    now = config.device_kind(kind)
    if now != kind and (who, kind) not in _WARNED:   # once per process, not per session
        _WARNED.add((who, kind))
        warnings.warn(f"{who}: device kind {kind!r} is now called {now!r}; registered as "
                      f"{now!r} (write {now!r}: {kind!r} will stop being accepted)",
                      DeprecationWarning, stacklevel=4)
    return now


def _guarded_factory(op_name: str, factory: Callable, plugin: str) -> Callable:
    """``factory`` whose errors, and its kernel's, name ``op_name`` and ``plugin``."""
    def prepare(ctx):
        try:
            run = factory(ctx)
        except Exception as e:
            raise PluginError(f"the Edge TPU kernel factory of plugin {plugin} for {op_name} "
                              f"raised {type(e).__name__}: {e}") from e
        if not callable(run):
            raise PluginError(f"the Edge TPU kernel factory of plugin {plugin} for {op_name} "
                              f"returned {type(run).__name__}, not a callable run(inputs)")

        def guarded(inputs):
            try:
                return run(inputs)
            except Exception as e:
                raise InferenceError(f"operator {op_name} (Edge TPU kernel of plugin "
                                     f"{plugin}) raised {type(e).__name__}: {e}") from e
        return guarded
    return prepare


# -- operators -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Kernel:
    fn: CpuKernel
    plugin: str
    builtin: bool


@dataclass(frozen=True)
class _Spec:
    spec: OpSpec
    plugin: str
    builtin: bool


@dataclass(frozen=True)
class _TpuOp:
    support: OpSupport
    kernel_factory: Callable
    plugin: str
    builtin: bool


class OpRegistry:
    """Operators from plugins: CPU kernels and Edge TPU-compatible operators.

    ``kernels`` and ``tpu_ops`` map an operator name to the entry that won it
    (see the module docstring); treat them as read-only.
    """

    #: What :meth:`summary` reports, in order (columns of ``coralrt plugins``).
    CATEGORIES = ("operators", "rules")

    def __init__(self) -> None:
        self.kernels: dict[str, _Kernel] = {}
        self.tpu_ops: dict[str, _TpuOp] = {}
        self.specs: dict[str, _Spec] = {}

    def for_plugin(self, plugin: str) -> OpRegistration:
        """The view the ``coralrt_register_ops`` hook of ``plugin`` receives."""
        return OpRegistration(self, plugin)

    def add_kernel(self, op_name: str, fn: CpuKernel, *, plugin: str = UNNAMED) -> None:
        """A CPU kernel ``fn(inputs, op) -> outputs`` for ``op_name``, from ``plugin``."""
        _check_name("operator name", op_name)
        if not callable(fn):
            raise ConfigError(f"kernel for {op_name!r} is not callable")
        what = f"a CPU kernel for {op_name!r}"
        self.kernels[op_name] = _prefer(what, self.kernels.get(op_name),
                                        _Kernel(fn, plugin, plugin == BUILTIN))

    def add_tpu_op(self, op_name: str, support: OpSupport, kernel_factory: Callable, *,
                   plugin: str = UNNAMED) -> None:
        """Declare ``op_name`` Edge TPU-compatible (simulated device) with its integer kernel."""
        _check_name("operator name", op_name)
        if not isinstance(support, OpSupport):
            raise ConfigError(f"support for {op_name!r} must be an OpSupport, not "
                              f"{type(support).__name__}")
        if not callable(kernel_factory):
            raise ConfigError(f"Edge TPU kernel factory for {op_name!r} is not callable")
        what = f"Edge TPU support for {op_name!r}"
        self.tpu_ops[op_name] = _prefer(what, self.tpu_ops.get(op_name),
                                        _TpuOp(support, kernel_factory, plugin,
                                               plugin == BUILTIN))

    def add_spec(self, spec: OpSpec, *, plugin: str = UNNAMED) -> None:
        """An operator spec (:class:`coralrt._ops.OpSpec`) from ``plugin``: its Edge
        TPU rule (``tpu``) and sim kernel (``sim``).  coralrt's own operators
        come this way too (``coralrt/plugins/_builtins.py``)."""
        if not isinstance(spec, OpSpec):
            raise ConfigError(f"an operator spec must be an OpSpec, not {type(spec).__name__}")
        _check_name("operator name", spec.name)
        if spec.tpu is not None and not isinstance(spec.tpu, OpSupport):
            raise ConfigError(f"support for {spec.name!r} must be an OpSupport, not "
                              f"{type(spec.tpu).__name__}")
        self.specs[spec.name] = _prefer(f"an operator spec for {spec.name!r}",
                                        self.specs.get(spec.name),
                                        _Spec(spec, plugin, plugin == BUILTIN))

    def _plugin_specs(self) -> dict[str, _Spec]:
        return {name: e for name, e in self.specs.items() if not e.builtin}

    def rules(self) -> RuleRegistry:
        """The Edge TPU rules of the registered specs (on top of coralrt's own,
        ``default_rules()``, when coralrt's plugin registered none: a registry
        used without the plugin host) with the plugins' operators: a plugin's
        support rule for an operator coralrt has replaces coralrt's rule."""
        builtins_registered = any(e.builtin for e in self.specs.values())
        rules = RuleRegistry() if builtins_registered else default_rules()
        for name, entry in self.specs.items():
            if entry.spec.tpu is not None:
                rules.add_op(name, replace(entry.spec.tpu))
        for name, op in self.tpu_ops.items():
            if name in rules:
                log.debug("plugin %s replaces coralrt's Edge TPU rule for %s", op.plugin, name)
            rules.add_op(name, op.support)  # add_op overwrites the table's entry
        return rules

    def sim_kernels(self) -> dict[str, Callable]:
        """Operator name -> kernel factory for the simulated Edge TPU.  A third-party
        factory is wrapped: what it raises becomes a ``PluginError``, what its
        kernel raises an ``InferenceError``, each naming the operator and the
        plugin (the simulated stick reports the message; the original
        exception stays on the host side of its USB boundary)."""
        kernels = {name: _guarded_factory(name, resolve(e.spec.sim), e.plugin)
                   for name, e in self._plugin_specs().items() if e.spec.sim is not None}
        kernels.update({name: op.kernel_factory if op.builtin else
                        _guarded_factory(name, op.kernel_factory, op.plugin)
                        for name, op in self.tpu_ops.items()})
        return kernels

    def merge(self, other: OpRegistry) -> None:
        """Add every entry of ``other``, each as the plugin that registered it."""
        for name, k in other.kernels.items():
            self.add_kernel(name, k.fn, plugin=k.plugin)
        for name, op in other.tpu_ops.items():
            self.add_tpu_op(name, op.support, op.kernel_factory, plugin=op.plugin)
        for entry in other.specs.values():
            self.add_spec(entry.spec, plugin=entry.plugin)

    def summary(self) -> dict[str, list[str]]:
        """``operators``: names with a CPU kernel; ``rules``: names declared
        Edge TPU-compatible (a support rule and a simulated Edge TPU kernel)."""
        rules = set(self.tpu_ops) | {name for name, e in self._plugin_specs().items()
                                     if e.spec.tpu is not None}
        return {"operators": sorted(self.kernels), "rules": sorted(rules)}

    def fingerprint(self) -> list:
        """What changes the partition: plugin TPU operators and the Edge TPU rules of
        plugin specs (part of the cache key; coralrt's own are RULES_VERSION's)."""
        described = {name: self._describe(e.spec.tpu) for name, e in self._plugin_specs().items()
                     if e.spec.tpu is not None}
        described.update({name: self._describe(op.support) for name, op in self.tpu_ops.items()})
        return sorted([name, d] for name, d in described.items())

    @staticmethod
    def _describe(support: OpSupport) -> str:
        checks = ",".join(getattr(c, "__qualname__", repr(c)) for c in support.checks)
        return f"v{support.max_version}:{sorted(support.activations)}:{checks}"


class _Registration:
    """A registry as one plugin's registration hook sees it: what it adds is
    recorded as that plugin's (``plugin``)."""

    def __init__(self, registry, plugin: str) -> None:
        self._registry = registry
        self.plugin = plugin

    def __repr__(self) -> str:
        return f"<{type(self).__name__} for {self.plugin}>"


class OpRegistration(_Registration):
    """What a plugin's ``coralrt_register_ops`` hook receives: the registry's
    ``add`` methods, each entry recorded as ``plugin``'s."""

    def add_kernel(self, op_name: str, fn: CpuKernel) -> None:
        """A CPU kernel ``fn(inputs, op) -> outputs`` for ``op_name``."""
        self._registry.add_kernel(op_name, fn, plugin=self.plugin)

    def add_tpu_op(self, op_name: str, support: OpSupport, kernel_factory: Callable) -> None:
        """Declare ``op_name`` Edge TPU-compatible (simulated device) with its integer kernel."""
        self._registry.add_tpu_op(op_name, support, kernel_factory, plugin=self.plugin)

    def add_spec(self, spec: OpSpec) -> None:
        """An operator spec (:class:`coralrt._ops.OpSpec`): Edge TPU rule and sim kernel."""
        self._registry.add_spec(spec, plugin=self.plugin)
