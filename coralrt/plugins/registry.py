"""What plugins register: operator kernels and Edge TPU rules, compilers, devices."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from coralrt.compile.rules import OpSupport, RuleRegistry, default_rules
from coralrt.errors import ConfigError
from coralrt.runtime.info import OpInfo

__all__ = ["OpInfo", "CpuKernel", "OpRegistry", "CompilerRegistry", "DeviceRegistry"]


CpuKernel = Callable[[list, OpInfo], list]


@dataclass
class _Kernel:
    fn: CpuKernel
    plugin: str


class OpRegistry:
    """Operators from plugins: CPU kernels and Edge TPU-compatible operators."""

    def __init__(self) -> None:
        self.kernels: dict[str, _Kernel] = {}
        self.tpu_ops: dict[str, tuple[OpSupport, Callable]] = {}
        self._current = "?"

    def add_kernel(self, op_name: str, fn: CpuKernel) -> None:
        """A CPU kernel ``fn(inputs, op) -> outputs`` for ``op_name``."""
        if not callable(fn):
            raise ConfigError(f"kernel for {op_name!r} is not callable")
        if op_name in self.kernels:
            raise ConfigError(f"two plugins provide a CPU kernel for {op_name!r} "
                              f"({self.kernels[op_name].plugin} and {self._current})")
        self.kernels[op_name] = _Kernel(fn, self._current)

    def add_tpu_op(self, op_name: str, support: OpSupport, kernel_factory: Callable) -> None:
        """Declare ``op_name`` Edge TPU-compatible (simulated device) with its integer kernel."""
        if not isinstance(support, OpSupport):
            raise ConfigError(f"support for {op_name!r} must be an OpSupport")
        self.tpu_ops[op_name] = (support, kernel_factory)

    def rules(self) -> RuleRegistry:
        """The Edge TPU rules with the plugins' operators added."""
        rules = default_rules()
        for name, (support, _) in self.tpu_ops.items():
            rules.add_op(name, support)
        return rules

    def sim_kernels(self) -> dict[str, Callable]:
        return {name: factory for name, (_, factory) in self.tpu_ops.items()}

    def fingerprint(self) -> list:
        """What changes the partition: plugin TPU operators (part of the cache key)."""
        return sorted([name, self._describe(s)] for name, (s, _) in self.tpu_ops.items())

    @staticmethod
    def _describe(support: OpSupport) -> str:
        checks = ",".join(getattr(c, "__qualname__", repr(c)) for c in support.checks)
        return f"v{support.max_version}:{sorted(support.activations)}:{checks}"


@dataclass
class CompilerRegistry:
    compilers: dict[str, object] = field(default_factory=dict)

    def add(self, compiler) -> None:
        """Register ``compiler``; plugins are asked before the built-ins, so a
        plugin's compiler for a device kind is preferred to coralrt's own."""
        for attr in ("id", "version", "runs_on", "compile_segment"):
            if not hasattr(compiler, attr):
                raise ConfigError(f"compiler {compiler!r} has no {attr!r}")
        self.compilers.setdefault(compiler.id, compiler)

    def for_device(self, kind: str):
        """The first registered compiler whose programs run on ``kind`` devices."""
        for compiler in self.compilers.values():
            if kind in compiler.runs_on:
                return compiler
        return None


@dataclass
class DeviceRegistry:
    factories: dict[str, Callable] = field(default_factory=dict)

    def add(self, kind: str, factory: Callable) -> None:
        """Register a device kind; the first registration of a kind wins (plugins
        are asked before the built-ins)."""
        self.factories.setdefault(kind, factory)

    def create(self, kind: str, **options):
        factory = self.factories.get(kind)
        if factory is None:
            raise ConfigError(f"no device kind {kind!r}; known: {sorted(self.factories)}")
        return factory(**options)
