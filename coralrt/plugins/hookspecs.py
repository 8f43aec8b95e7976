"""The coralrt plugin contract: every hook a plugin can implement.

A plugin is a module or object with functions marked ``@coralrt.hookimpl``
whose names are hooks below.  Third-party plugins are found through the
entry-point group ``coralrt``::

    # pyproject.toml of the plugin package
    [project.entry-points.coralrt]
    sinh = "coralrt_sinh"

or registered explicitly with ``InferenceSession(..., plugins=[obj])``.
``CORALRT_DISABLE_PLUGIN_AUTOLOAD=1`` turns entry-point loading off.  A
function marked ``@hookimpl`` whose name is not a hook here is an error at
load time (a typo never fails silently).  coralrt's own compiler, devices and
step runner are registered through these same hooks
(``coralrt/plugins/builtins.py``).

See docs/plugins.md for a runnable example of each hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from coralrt.plugins.registry import CompilerRegistry, DeviceRegistry, OpRegistry

__all__ = ["PROJECT", "hookspec", "hookimpl"]

PROJECT = "coralrt"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Marker for plugin functions: ``@coralrt.hookimpl``.
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- registration hooks (called once when a plugin manager is set up) ----------------


@hookspec
def coralrt_register_ops(registry: OpRegistry) -> None:
    """Provide operators: CPU kernels and, optionally, Edge TPU support.

    :param registry: call ``registry.add_kernel(op_name, fn)`` to give the CPU a
        kernel for a custom operator (``op_name`` is its custom code, e.g.
        ``"Sinh"``) or for a builtin (``"ADD"``; used only when the session is
        created with ``override_builtins=True``).  ``fn(inputs, op)`` receives
        the list of input arrays (None for omitted optional inputs) and an
        :class:`~coralrt.plugins.registry.OpInfo` (``name``, ``options``,
        ``custom_options`` bytes, ``flex_options`` dict when the custom options
        are a FlexBuffer map, ``inputs`` and ``outputs`` as ``TensorInfo``) and
        returns a list of output arrays with the outputs' shapes and dtypes.

        Call ``registry.add_tpu_op(op_name, support, kernel_factory)`` to declare
        the operator Edge TPU-compatible for the simulated device: ``support``
        is a :class:`coralrt.compile.rules.OpSupport` (its checks decide, per
        operator, whether it maps), ``kernel_factory`` an integer kernel in the
        simulated Edge TPU's form (see ``coralrt/sim/kernels/__init__.py``).
    :returns: nothing; all results go through ``registry``.
    """


@hookspec
def coralrt_register_compilers(registry: CompilerRegistry) -> None:
    """Provide compilers that turn a TPU segment into a device program.

    :param registry: call ``registry.add(compiler)`` with an object that has
        ``id`` (str), ``version`` (str), ``runs_on`` (tuple of device kinds, e.g.
        ``("sim",)`` or ``("usb",)``) and ``compile_segment(piece) -> bytes``
        (``piece`` is the segment as a standalone :class:`coralrt.model.Model`).
        The id and version enter the compile cache key.
    :returns: nothing.
    """


@hookspec
def coralrt_register_devices(registry: DeviceRegistry) -> None:
    """Provide device kinds.

    :param registry: call ``registry.add(kind, factory)``; ``factory(**options)``
        returns an unopened :class:`coralrt.runtime.device.EdgeTpuDevice`.
    :returns: nothing.
    """


# -- observers ---------------------------------------------------------------------------


@hookspec
def coralrt_compile_event(event: dict) -> None:
    """Observe the just-in-time compiler.

    :param event: a dict with ``kind`` = ``"cache_hit"``, ``"cache_miss"`` or
        ``"segment_compiled"``, plus ``key`` (the cache key) and, for
        ``"segment_compiled"``, ``segment`` (index), ``operators`` (count),
        ``bytes`` and ``seconds``.  Called for every implementation; the return
        value is ignored.
    :returns: nothing.
    """


# -- execution ---------------------------------------------------------------------------


@hookspec(firstresult=True)
def coralrt_run_step(step, inputs: list) -> list | None:
    """Run one step of a program (a TPU segment, a CPU piece or a plugin kernel).

    coralrt's own implementation runs the step.  Plugins wrap it to time or
    trace steps with ``@coralrt.hookimpl(wrapper=True)``::

        @coralrt.hookimpl(wrapper=True)
        def coralrt_run_step(step, inputs):
            start = time.perf_counter()
            outputs = yield
            print(step.label, time.perf_counter() - start)
            return outputs

    :param step: a :class:`coralrt.runtime.executor.Step` (``kind`` is
        ``"tpu"``, ``"cpu"`` or ``"plugin"``; ``label``; ``ops``).
    :param inputs: the step's input arrays, in order.
    :returns: the step's output arrays (stops at the first non-None result).
    """
