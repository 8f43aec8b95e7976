"""The plugin system: the contract, the host, the registries and coralrt's built-ins.

``_hookspecs.py`` is THE documented plugin contract.  ``_host.py`` builds a
pluggy manager with the built-ins, the ``coralrt`` entry points and a
session's explicit plugins, and fills the registries (``_registry.py``, ``_kind_registry.py``) by
calling every registration hook through pluggy; a broken installed plugin is
skipped with a warning (``CORALRT_PLUGINS_STRICT=1``: an error).
``_loader.py`` finds, names and registers plugins one at a time and keeps a
record of each (what ``coralrt plugins`` lists).  ``_builtins.py`` is
coralrt's own plugin: the native and edgetpu_compiler compilers and the
``sim`` device kind.

This package is also the plugin author's public API: the marker, the operator
spec, the compiler contract, the rewrite and device classes (``__all__``).
"""

from __future__ import annotations

from coralrt.plugins._hookspecs import hookimpl

# The plugin author's API (docs/api.md, docs/plugins.md).  Everything but the
# marker is imported on first use: ``import coralrt`` imports this package and
# must not load the compilers, the simulator or the USB driver.
__all__ = [
    "hookimpl", "OpSpec", "OpSupport", "KernelRef", "OpInfo", "StepInfo", "OpContext",
    "Compiler", "SegmentNotMapped", "NativeCompiler", "Rewrite", "RewriteRecord",
    "RewriteResult", "GraphEditor", "EdgeTpuDevice", "UsbEdgeTpu",
]


def _lazy(name: str):
    # Real import statements (not module-name strings), so that the layer check
    # sees each of them.
    if name in ("OpSpec", "OpSupport", "KernelRef"):
        from coralrt._ops import spec as module
    elif name in ("OpInfo", "StepInfo"):
        from coralrt._runtime import info as module
    elif name == "OpContext":
        from coralrt._sim import kernels as module
    elif name in ("Compiler", "SegmentNotMapped"):
        from coralrt._compile import base as module
    elif name == "NativeCompiler":
        from coralrt._compile import native as module
    elif name in ("Rewrite", "RewriteRecord", "RewriteResult", "GraphEditor"):
        from coralrt._compile import rewrite as module
    elif name == "EdgeTpuDevice":
        from coralrt._runtime import device as module
    elif name == "UsbEdgeTpu":
        from coralrt._usb import driver as module
    else:
        raise AttributeError(f"module 'coralrt.plugins' has no attribute {name!r}")
    return getattr(module, name)


def __getattr__(name: str):
    value = _lazy(name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
