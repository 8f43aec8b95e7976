"""The coralrt plugin contract: every hook a plugin can implement.

A plugin is a module or object with functions marked ``@coralrt.hookimpl``
whose names are hooks below.  Third-party plugins are found through the
entry-point group ``coralrt``::

    # pyproject.toml of the plugin package
    [project.entry-points.coralrt]
    sinh = "coralrt_sinh"

or registered explicitly with ``InferenceSession(..., plugins=[obj])``; a
plugin object must be hashable (pluggy keeps plugins in sets: a ``@dataclass``
plugin needs ``eq=False``).  ``CORALRT_DISABLE_PLUGIN_AUTOLOAD=1`` turns
entry-point loading off.  An installed plugin is named by its entry point
(``sinh`` above), a plugin object by its class (``module.QualName``, then
``#2``, ``#3`` ... for more objects of one class).
coralrt's own compilers, device kind and step runner are a plugin like any
other, registered under the name ``coralrt.builtins`` through these same
hooks (``coralrt/plugins/_builtins.py``).

A broken plugin does not take coralrt down.  An installed plugin whose entry
point cannot be loaded (its package fails to import, say), that has a
function marked ``@hookimpl`` whose name is not a hook here, or whose
registration hook raises, returns a value or adds something of the wrong
type, is skipped with one logged warning naming it, its distribution and the
error; ``CORALRT_PLUGINS_STRICT=1`` makes that a
:class:`coralrt.errors.PluginError` instead.  A broken explicit plugin always
raises ``PluginError`` (a typo never fails silently).  Whatever a plugin's
CPU kernel raises during ``run`` becomes a :class:`coralrt.errors.InferenceError`
naming the operator (index and name) and the plugin, with the original as its
``__cause__`` (coralrt's own typed errors included); a plugin's simulated
Edge TPU kernel fails the segment's run with an ``InferenceError`` whose
message names the operator and the plugin.

Every hook is called through the plugin manager, so ``wrapper=True``
implementations and pluggy's tracing see every call.  Each registration hook
(``coralrt_register_*``) is called once per plugin implementing it, with a
registry view that records that plugin's name; wrappers see each of those
calls, and ``registry.plugin`` says whose it is.

Which plugin wins (the same for every registry, whatever the order plugins
are registered or called in):

- a third-party plugin's CPU kernel, Edge TPU operator, compiler or device
  kind wins over one from ``coralrt.builtins``; a plugin's Edge TPU support
  rule for an operator coralrt's rule table already has replaces the table's
  rule;
- two third-party plugins (or one plugin twice) providing the same thing is a
  :class:`coralrt.errors.ConfigError` naming both, raised when the plugins are
  set up: the same CPU kernel or Edge TPU operator name, the same device kind,
  or compilers with the same id or a device kind in common in ``runs_on``.
  Uninstall or leave out one of them (``CORALRT_DISABLE_PLUGIN_AUTOLOAD=1``
  skips the installed ones).

See docs/plugins.md for a runnable example of each hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from coralrt.plugins._kind_registry import CompilerRegistration, DeviceRegistration
    from coralrt.plugins._registry import OpRegistration
    from coralrt._runtime.info import StepInfo

__all__ = ["PROJECT", "hookspec", "hookimpl"]

PROJECT = "coralrt"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Marker for plugin functions: ``@coralrt.hookimpl``.
hookimpl = pluggy.HookimplMarker(PROJECT)


# -- registration hooks (called once per plugin when a plugin manager is set up) -------


@hookspec
def coralrt_register_ops(registry: OpRegistration) -> None:
    """Provide operators: operator specs, CPU kernels and, optionally, Edge TPU support.

    :param registry: this plugin's view of the operator registry
        (:class:`coralrt.plugins._registry.OpRegistration`; ``registry.plugin``
        is the plugin's name).

        ``registry.add_kernel(op_name, fn)`` gives the CPU a kernel for a
        custom operator (``op_name`` is its custom code, e.g. ``"Sinh"``) or
        for a builtin (``"ADD"``; used only when the session is created with
        ``override_builtins=True``).  ``fn(inputs, op)`` receives the list of
        input arrays (None for omitted optional inputs) and a
        :class:`coralrt._runtime.info.OpInfo`: ``name``, ``options`` (dict of
        the builtin options), ``custom_options`` (bytes), ``flex_options``
        (dict when the custom options are a FlexBuffer map, else None),
        ``inputs`` (``TensorInfo`` or None per input) and ``outputs``
        (``TensorInfo``), and ``index`` (the operator's index in the compiled
        model).  It returns a list of output arrays with the outputs' shapes
        and dtypes (coralrt checks, and raises ``PluginError`` otherwise).

        ``registry.add_tpu_op(op_name, support, kernel_factory)`` declares the
        operator Edge TPU-compatible for the simulated device: ``support`` is
        a :class:`coralrt._compile.rules.OpSupport` (its checks decide, per
        operator, whether it maps; for an operator coralrt's table already
        has, it replaces coralrt's rule), ``kernel_factory`` a *sim kernel*:
        an integer kernel factory ``factory(OpContext) -> run(inputs)`` in the
        simulated Edge TPU's form (see ``coralrt/_sim/kernels/__init__.py``),
        not a CPU kernel ``fn(inputs, OpInfo)``.

        ``registry.add_spec(spec)`` registers a whole
        :class:`coralrt._ops.OpSpec` (its ``tpu`` rule and ``sim`` kernel);
        coralrt's own operators come through this hook this way
        (``coralrt/plugins/_builtins.py``).

        An operator spec, kernel or Edge TPU operator wins over one from
        ``coralrt.builtins``; two other plugins providing the same name raise
        ``ConfigError``.
    :returns: nothing; all results go through ``registry``.
    """


@hookspec
def coralrt_register_compilers(registry: CompilerRegistration) -> None:
    """Provide compilers that turn a TPU segment into a device program.

    :param registry: this plugin's view of the compiler registry
        (:class:`coralrt.plugins._registry.CompilerRegistration`;
        ``registry.plugin`` is the plugin's name).  Call
        ``registry.add(compiler)`` with an object that has ``id`` (str),
        ``version`` (str), ``runs_on`` (tuple of device kinds, e.g.
        ``("sim",)`` or ``("coral",)``; ``"usb"`` is read as ``"coral"``) and
        ``compile_segment(piece) -> bytes``
        (``piece`` is the segment as a standalone :class:`coralrt._model.Model`).
        The id and version enter the compile cache key; ``version`` may be a
        ``property``, read only when a compile first needs it (the ``remote``
        compiler asks its compile service then, not at registration).  For a device kind,
        a plugin's compiler wins over coralrt's own (``coralrt-native`` for
        ``sim``, ``edgetpu_compiler`` for ``coral``); two other plugins with the
        same id or a device kind in common raise ``ConfigError``.
    :returns: nothing.
    """


@hookspec
def coralrt_register_devices(registry: DeviceRegistration) -> None:
    """Provide device kinds.

    :param registry: this plugin's view of the device registry
        (:class:`coralrt.plugins._registry.DeviceRegistration`;
        ``registry.plugin`` is the plugin's name).  Call
        ``registry.add(kind, factory)``; ``factory(**options)`` returns an
        unopened :class:`coralrt._runtime.device.EdgeTpuDevice`.  A plugin's
        factory for a kind wins over coralrt's own (``sim``); two other
        plugins adding the same kind raise ``ConfigError``.
    :returns: nothing.
    """


@hookspec
def coralrt_register_rewrites(registry) -> None:
    """Provide graph rewrites for the rewrite stage (docs/rewrites.md).

    :param registry: this plugin's view of the rewrite registry
        (:class:`coralrt.plugins._rewrite_registry.RewriteRegistration`).  Call
        ``registry.add(rewrite)`` with an object that has ``name`` (str),
        ``version`` (int, part of the compile-cache key), ``exact`` (bool: the
        same integer results, or an approximation), ``order`` (int: rewrites
        run in ascending order; coralrt's own use 100-310), ``description``
        (str) and ``apply(editor) -> list[RewriteRecord]`` (see
        :mod:`coralrt._compile.rewrite.base`).  Sessions choose which run with
        ``rewrites=`` (``"exact"``, ``"auto"``, ``"none"`` or names).  A
        plugin's rewrite wins over coralrt's own of the same name; two other
        plugins with one name raise ``ConfigError``.
    :returns: nothing.
    """


# -- observers ---------------------------------------------------------------------------


@hookspec
def coralrt_compile_event(event: dict) -> None:
    """Observe the just-in-time compiler.

    :param event: a dict with ``kind`` and ``key`` (the cache key).  Kinds,
        in the order a compile reports them:

        - ``"cache_miss"``: no usable cached build; the model is compiled now;
        - ``"segments_planned"``: the partition is made; ``segments`` (count)
          and ``operators`` (Edge TPU operators to compile in them: a
          progress bar's total);
        - ``"segment_compiled"``: ``segment`` (index), ``operators`` (count),
          ``bytes`` and ``seconds``; a segment the compiler does not map whole
          is compiled again in pieces, so there may be more of these than
          planned segments, and fewer operators;
        - ``"compiled"``: the compile is done; ``segments``, ``operators``
          (the final counts) and ``seconds``;
        - ``"cache_hit"``: the compiled model came from the cache (no compile).

        Called for every implementation; the return value is ignored.
    :returns: nothing.
    """


# -- execution ---------------------------------------------------------------------------


@hookspec(firstresult=True)
def coralrt_run_step(step: StepInfo, inputs: list) -> list | None:
    """Run one step of a program (a TPU segment, a CPU piece or a plugin kernel).

    coralrt's own implementation runs the step (``step.run(inputs)``).  Plugins
    wrap it to time or trace steps with ``@coralrt.hookimpl(wrapper=True)``::

        @coralrt.hookimpl(wrapper=True)
        def coralrt_run_step(step, inputs):
            start = time.perf_counter()
            outputs = yield
            print(step.label, time.perf_counter() - start)
            return outputs

    The hook is called for every step of every inference only while a plugin
    other than ``coralrt.builtins`` implements it; otherwise coralrt runs the
    steps directly and the hook costs nothing.

    :param step: a read-only :class:`coralrt._runtime.info.StepInfo`, built
        once per program: ``index`` (the step's position in its program),
        ``kind`` (``"tpu"``, ``"cpu"`` or ``"plugin"``), ``label`` (e.g.
        ``"tpu: segment 0 on sim:0"``), ``operators`` (tuple of the operator
        indices it runs in the compiled model), ``device`` (the stick's path,
        e.g. ``"usb:0"``, for ``"tpu"`` steps, else None) and ``run(inputs)``
        (executes the step and returns its outputs).
    :param inputs: the step's input arrays, in order (None for omitted
        optional inputs).
    :returns: the step's output arrays (stops at the first non-None result).
    """
