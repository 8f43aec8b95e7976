"""What each target prepares when a session is created.

``prepare(target, source, loading, parsed)`` (a registered
:class:`~coralrt._targets.registry.Target`'s ``prepare``) returns the model the
session describes, the :class:`~coralrt._runtime.program.Program` it runs (a CPU
backend program, an executor program of TPU, CPU and plugin steps, or a
pipelined program), the device(s), and the compile information.  A list of
sticks gets a replicated or a pipelined program (``SessionOptions.strategy``).
The source model is parsed at most once per session, and not at all on a
compile-cache hit of ``sim``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from typing import TYPE_CHECKING

from coralrt._backends.base import CpuBackend
from coralrt import _config as config
from coralrt.errors import CompilerUnavailableError, ConfigError, ModelError
from coralrt._model import Model, load_model
from coralrt._formats.opnames import DWN1
from coralrt._model.compiled import (
    AlreadyCompiled, compiled_by, expected_plain, host_model, not_on_host,
)
from coralrt._model.fixups import with_explicit_biases
from coralrt.plugins._host import PluginHost
from coralrt._runtime.device import EdgeTpuDevice
from coralrt._runtime.executor import build_program
from coralrt._runtime.replicate import build_multi_stick_program
from coralrt._runtime.program import Program
from coralrt._targets.options import SessionOptions
from coralrt._targets.registry import Target

if TYPE_CHECKING:
    from coralrt._compile.jit import JitResult

# The compiler (jit) and the USB driver (pyusb) are imported when a target
# needs them: the cpu target never does, and they add about 100 ms to
# `import coralrt`.

__all__ = ["Prepared", "Loading", "prepare_cpu", "prepare_on_device", "prepare_coral",
           "open_stick", "usb_compiler", "cached_for_coral", "chosen_rewrites",
           "no_segment_reason"]

log = logging.getLogger("coralrt.session")


@dataclass(frozen=True)
class Loading:
    """What the targets prepare a session from: its options (``driver``
    resolved) and what the session made of them, the CPU backend and the
    plugin host."""
    options: SessionOptions
    backend: CpuBackend
    host: PluginHost


@dataclass
class Prepared:
    model: Model
    program: Program
    devices: list[EdgeTpuDevice]
    compile_info: dict | None = None
    # What was compiled (JIT targets only): the source after the plain model
    # replaced a compiled one (a path, bytes or a Model), and its parse when
    # this load made one.
    source: str | bytes | Model | None = None
    source_model: Model | None = None


def _program(model: Model, devices: list[EdgeTpuDevice], o: Loading,
             pipelined: bool) -> Program:
    s = o.options
    if pipelined:      # several sticks (or a list of one): replicate or pipeline
        return build_multi_stick_program(model, devices=devices, strategy=s.strategy,
                                         backend=o.backend, num_threads=s.num_threads,
                                         cpu_kernels=s.cpu_kernels, host=o.host,
                                         override_builtins=s.override_builtins,
                                         depth=s.pipeline_depth)
    return build_program(model, device=devices[0] if devices else None, backend=o.backend,
                         num_threads=s.num_threads, cpu_kernels=s.cpu_kernels, host=o.host,
                         override_builtins=s.override_builtins)


def _host_runnable(source, model: Model, target: str):
    """``(source, model)`` the host can run in place of a compiled ``model``: the
    plain ``X.tflite`` beside an ``X_edgetpu.tflite`` (said in the log), or a
    ModelError saying what runs it and where its plain model is expected."""
    by = compiled_by(model)
    if by is None or (by == "coralrt" and target == "sim"):
        return source, model
    plain = host_model(source, model) if by == "edgetpu_compiler" else None
    if plain is None:
        raise ModelError(not_on_host(model, source))
    named = "the model given as bytes" if isinstance(source, (bytes, bytearray, memoryview)) \
        else source
    log.warning("%s was compiled by edgetpu_compiler and runs only on a Coral USB "
                "Accelerator; running its plain model, %s, on target '%s'", named,
                "the plain twin it carries" if isinstance(plain, bytes) else plain, target)
    return plain, load_model(plain)


def prepare_cpu(target: Target, source, o: Loading, parsed: Model | None = None) -> Prepared:
    """The whole model in the CPU backend (an executor program when plugin
    kernels or step observers take part)."""
    s = o.options
    model = parsed or load_model(source)  # errors name the file when given a path
    source, model = _host_runnable(source, model, target.name)
    kernels = o.host.ops.kernels
    if o.host.wraps_steps or any(op.name in kernels and (op.opcode.is_custom
                                                         or s.override_builtins)
                                 for op in model.main.operators):
        return Prepared(model, _program(model, [], o, False), [])
    # A Model given by the caller may have been edited since it was read; a model
    # the backend would crash on gets the rewrite that avoids it (model/fixups.py).
    fixed = with_explicit_biases(model)
    if fixed is not None:
        data = fixed.to_bytes()
    else:
        data = model.to_bytes() if isinstance(source, Model) else model.source
    program = o.backend.load(data, num_threads=s.num_threads, kernels=s.cpu_kernels)
    program.operators = len(model.main.operators)
    return Prepared(model, program, [])


def _jit(source, o: Loading, compiler, parsed: Model | None = None) -> JitResult:
    from coralrt._compile.jit import jit_compile
    host = o.host
    return jit_compile(source, mode=o.options.partition_mode, cache=o.options.cache,
                       compiler=compiler, rules=host.ops.rules(),
                       rules_fingerprint=host.ops.fingerprint(), events=host.compile_event,
                       parsed=parsed, rewrites=chosen_rewrites(o))


def chosen_rewrites(o: Loading) -> list:
    """The rewrites a JIT compile applies, in order (the cpu target applies none)."""
    from coralrt._compile.rewrite import select_rewrites
    spec = o.options.rewrites
    if spec is None:
        spec = "none" if o.options.partition_mode == "compat" else "exact"
    return select_rewrites(spec, o.host.rewrites.rewrites)


def cached_for_coral(source, o: Loading) -> JitResult | None:
    """A cached compile of ``source`` whose programs run on a Coral stick, or None."""
    from coralrt._compile.jit import jit_lookup
    return jit_lookup(source, device_kind=config.CORAL, mode=o.options.partition_mode,
                      cache=o.options.cache, rules_fingerprint=o.host.ops.fingerprint(),
                      rewrites=chosen_rewrites(o))


def _devices(o: Loading, default) -> tuple[list[EdgeTpuDevice], bool]:
    """The open sticks for ``device=`` (``default()`` when None), and whether
    the user gave a list (which pipelines the segments)."""
    device = o.options.device
    if device is None:
        return [default()], False
    if isinstance(device, (list, tuple)):
        return open_stick(device), True
    return [open_stick(device)], False


def _on_devices(model: Model, o: Loading, default, compile_info) -> Prepared:
    """The program of ``model`` on its sticks; the sticks opened here are closed
    again if the program cannot be built (a device refusing the program)."""
    devices, pipelined = _devices(o, default)
    device = o.options.device
    given = device if isinstance(device, (list, tuple)) else [device]
    try:
        program = _program(model, devices, o, pipelined)
    except BaseException:
        for device in devices:
            if not any(device is g for g in given):
                device.close()
        raise
    return Prepared(model, program, devices, compile_info)


def _created(o: Loading, kind: str, **options) -> EdgeTpuDevice:
    """A new device of ``kind`` from the device registry, opened."""
    device = o.host.devices.create(kind, **options)
    device.open()
    return device


def _names_edgetpu_op(source) -> bool:
    """Whether model bytes name edgetpu_compiler's operator (a fast byte search)."""
    return isinstance(source, (bytes, bytearray, memoryview)) and \
        DWN1.op_name.encode() in bytes(source)


def prepare_on_device(target: Target, source, o: Loading,
                      parsed: Model | None = None) -> Prepared:
    """Compile just in time with the compiler for ``target.compiler_kind`` and
    run on a new device of ``target.device_kind`` from the device registry
    (``sim``: the simulated stick), or on ``device=``.  The device factory is
    given ``kernels=``, the plugins' Edge TPU kernel factories."""
    name = target.name
    if parsed is None and (expected_plain(source) is not None or _names_edgetpu_op(source)):
        parsed = load_model(source)  # maybe an edgetpu_compiler output: look inside
    if parsed is not None:
        source, parsed = _host_runnable(source, parsed, name)
    compiler = o.host.compilers.for_device(target.compiler_kind)
    if compiler is None:
        raise ConfigError(f"target {name!r}: no compiler for {target.compiler_kind!r} "
                          f"devices is registered")
    try:
        jit = _jit(source, o, compiler, parsed)
    except AlreadyCompiled as e:
        # Compiled, though its name does not say so: what runs it, or its plain
        # model, as the cpu target says and does.
        source, parsed = _host_runnable(source, e.model, name)
        jit = _jit(source, o, compiler, parsed)
    if compiled_by(jit.model) != "coralrt":  # no coralrt-segment: nothing for the stick
        log.warning("target '%s': no operator of this model maps to the Edge TPU, so it "
                    "runs entirely on the CPU (%s); see 'coralrt partition' for each "
                    "operator's reason", name, no_segment_reason(jit.compile_info))

    def fresh_device() -> EdgeTpuDevice:
        return _created(o, target.device_kind, kernels=o.host.ops.sim_kernels())

    return dataclasses.replace(_on_devices(jit.model, o, fresh_device, jit.compile_info),
                               source=source, source_model=parsed)


def no_segment_reason(compile_info: dict) -> str:
    """The commonest reason the compiler gave for keeping operators on the CPU."""
    reasons = [row[2] for row in compile_info.get("placement") or () if row and row[0] == "cpu"]
    if not reasons:
        return "the model has no operators"
    top = max(set(reasons), key=reasons.count)
    return f"{reasons.count(top)} of {len(reasons)} operators: {top}"


def open_stick(device):
    """``device`` as an open stick: an opened device object as is, a path opened;
    a list or tuple of those as a list of open sticks (closing the ones it
    opened if a later one fails)."""
    if isinstance(device, (list, tuple)):
        if not device:
            raise ConfigError("device=[] names no stick; give one or more, e.g. "
                              "['usb:0', 'usb:1']")
        opened, sticks = [], []
        try:
            for d in device:
                stick = open_stick(d)
                if stick is not d:
                    opened.append(stick)
                sticks.append(stick)
        except BaseException:
            for stick in opened:
                stick.close()
            raise
        return sticks
    if device is None or isinstance(device, str):
        from coralrt._usb import open_device
        return open_device(device)  # DeviceNotFoundError when no stick is attached
    return device


def _first_stick(o: Loading, kind: str) -> EdgeTpuDevice:
    """The default device of a ``coral`` session: a new one of a plugin's device
    kind ``coral`` when a plugin provides one, else the first stick the USB
    driver finds (coralrt registers no ``coral`` factory of its own)."""
    if o.host.devices.plugin_for(kind) is not None:
        return _created(o, kind)
    return open_stick(None)


def prepare_coral(target: Target, source, o: Loading, parsed: Model | None = None) -> Prepared:
    """A model compiled by edgetpu_compiler as is, a plain one compiled just in
    time (the cache first, then the compiler for real sticks), on a Coral stick
    through coralrt's driver or libedgetpu."""
    s = o.options
    via = None
    if s.driver == "libedgetpu":   # probed in a child process before any compile
        from coralrt._backends import libedgetpu as via
        via.check_ready(o.backend, s.device)

    def on_libedgetpu(model: Model, data) -> Program:   # the whole model, one interpreter
        return via.load_program(model, data, backend=o.backend, device=s.device,
                                num_threads=s.num_threads, kernels=s.cpu_kernels, host=o.host,
                                override_builtins=s.override_builtins)

    def default() -> EdgeTpuDevice:
        return _first_stick(o, target.device_kind)

    model = parsed or load_model(source)
    if via is None and compiled_by(model) is None:   # coralrt's own output: refused below
        _stick_before_compiler(o, target)
    if model.is_edgetpu_compiled:
        if via is not None:
            data = model.to_bytes() if isinstance(source, Model) else model.source
            return Prepared(model, on_libedgetpu(model, data), [])
        return _on_devices(model, o, default, None)
    # A compile made for real sticks is used before any compiler is asked: a Pi
    # without one, or whose compile service is down, runs an imported entry.
    jit = cached_for_coral(source, o)
    if jit is None:
        compiler = usb_compiler(o)
        if compiler is None:
            raise CompilerUnavailableError()
        jit = _jit(source, o, compiler, model)
    if via is not None:
        return Prepared(jit.model, on_libedgetpu(jit.model, None), [],
                        jit.compile_info, source=source, source_model=model)
    return dataclasses.replace(_on_devices(jit.model, o, default, jit.compile_info),
                               source=source, source_model=model)


def _stick_before_compiler(o: Loading, target: Target) -> None:
    """A plain model on ``coral`` with no stick attached fails with that, before
    any word about compilers: the compile is for a stick, and the stick is
    what the user can fix first.  Device objects and plugin devices are not
    USB sticks to look for; when USB cannot be listed, opening says why."""
    device = o.options.device
    if device is not None and not isinstance(device, str):
        return
    if device is None and o.host.devices.plugin_for(target.device_kind) is not None:
        return
    from coralrt._usb import count_attached
    from coralrt._usb.discovery import no_stick
    if count_attached() == 0:
        raise no_stick(device, extra=" (`coralrt devices` lists what is attached). Without "
                       "a stick, target 'sim' runs the model on the simulated Edge TPU")


def usb_compiler(o: Loading):
    """The compiler for a real stick: the session's compile service, else the
    plugins' (``CORALRT_COMPILER_URL``'s service, else a local edgetpu_compiler)."""
    if o.options.compiler_url:
        from coralrt._compile.remote import RemoteCompiler
        return RemoteCompiler(o.options.compiler_url)
    return o.host.compilers.for_device(config.CORAL)
