"""What each target prepares when a session is created.

``prepare(target, source, options)`` returns the model the session describes,
the :class:`~coralrt.runtime.program.Program` it runs (a CPU backend program,
an executor program of TPU, CPU and plugin steps, or a pipelined program),
the device(s), and the compile information.  A list of sticks gets a
replicated or a pipelined program (``Options.strategy``).  The source model is parsed at
most once per session, and not at all on a compile-cache hit of ``sim``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from typing import TYPE_CHECKING

from coralrt.backends.base import CpuBackend
from coralrt import config
from coralrt.errors import CompilerUnavailableError, ConfigError, ModelError
from coralrt.model import Model, load_model
from coralrt.model.compiled import compiled_by, expected_plain, not_on_host, plain_sibling
from coralrt.model.fixups import with_explicit_biases
from coralrt.plugins.host import PluginHost
from coralrt.runtime.device import EdgeTpuDevice
from coralrt.runtime.executor import build_program
from coralrt.runtime.replicate import build_multi_stick_program
from coralrt.runtime.program import Program

if TYPE_CHECKING:
    from coralrt.compile.cache import CompileCache
    from coralrt.compile.jit import JitResult

# The compiler (jit) and the USB driver (pyusb) are imported when a target
# needs them: the cpu target never does, and they add about 100 ms to
# `import coralrt`.

__all__ = ["Prepared", "Options", "prepare", "choose_auto", "open_stick", "usb_compiler",
           "resolve_driver", "chosen_rewrites"]

log = logging.getLogger("coralrt.session")

#: What ``device=`` accepts: an open device, a path ("usb:0", a port path), or a list of those.
DeviceSpec = Union[EdgeTpuDevice, str, Sequence[Union[EdgeTpuDevice, str]], None]


@dataclass
class Options:
    backend: CpuBackend
    host: PluginHost
    num_threads: int | None = None
    cpu_kernels: str = "optimized"
    partition_mode: str = "multi"
    # Rewrites before partitioning: "exact" | "auto" | "none" | names; None: "exact"
    # in multi mode, "none" in compat mode (edgetpu_compiler rewrites nothing).
    rewrites: object = None
    cache: CompileCache | None = None
    device: DeviceSpec = None
    override_builtins: bool = False
    pipeline_depth: int = 2    # requests queued between pipeline stages (device lists)
    strategy: str | None = None   # device lists: "replicate" | "pipeline" | None (by segments)
    max_pending: int = 4       # requests the session queues for its workers (submit)
    compiler_url: str | None = None   # a compile service for coral (else the registry's)
    # How coral reaches the stick: "coralrt" (pyusb) or "libedgetpu" (a LiteRT delegate,
    # coralrt.backends.libedgetpu); resolved by the session, never chosen by "auto".
    driver: str = "coralrt"


@dataclass
class Prepared:
    model: Model
    program: Program
    devices: list[EdgeTpuDevice]
    compile_info: dict | None = None
    # What was compiled (JIT targets only): the source after the plain model
    # replaced a compiled one, and its parse when this load made one.
    source: object = None
    source_model: Model | None = None


def _program(model: Model, devices: list[EdgeTpuDevice], o: Options,
             pipelined: bool) -> Program:
    if pipelined:      # several sticks (or a list of one): replicate or pipeline
        return build_multi_stick_program(model, devices=devices, strategy=o.strategy,
                                         backend=o.backend, num_threads=o.num_threads,
                                         cpu_kernels=o.cpu_kernels, host=o.host,
                                         override_builtins=o.override_builtins,
                                         depth=o.pipeline_depth)
    return build_program(model, device=devices[0] if devices else None, backend=o.backend,
                         num_threads=o.num_threads, cpu_kernels=o.cpu_kernels, host=o.host,
                         override_builtins=o.override_builtins)


def _host_runnable(source, model: Model, target: str):
    """``(source, model)`` the host can run in place of a compiled ``model``: the
    plain ``X.tflite`` beside an ``X_edgetpu.tflite`` (said in the log), or a
    ModelError saying what runs it and where its plain model is expected."""
    by = compiled_by(model)
    if by is None or (by == "coralrt" and target == "sim"):
        return source, model
    plain = plain_sibling(source) if by == "edgetpu_compiler" else None
    if plain is None:
        raise ModelError(not_on_host(model, source))
    log.warning("%s was compiled by edgetpu_compiler and runs only on a Coral USB "
                "Accelerator; running the plain model beside it, %s, on target '%s'",
                source, plain, target)
    return plain, load_model(plain)


def prepare_cpu(source, o: Options, parsed: Model | None = None) -> Prepared:
    model = parsed or load_model(source)  # errors name the file when given a path
    source, model = _host_runnable(source, model, "cpu")
    kernels = o.host.ops.kernels
    if o.host.wraps_steps or any(op.name in kernels and (op.opcode.is_custom
                                                         or o.override_builtins)
                                 for op in model.main.operators):
        return Prepared(model, _program(model, [], o, False), [])
    # A Model given by the caller may have been edited since it was read; a model
    # the backend would crash on gets the rewrite that avoids it (model/fixups.py).
    fixed = with_explicit_biases(model)
    if fixed is not None:
        data = fixed.to_bytes()
    else:
        data = model.to_bytes() if isinstance(source, Model) else model.source
    program = o.backend.load(data, num_threads=o.num_threads, kernels=o.cpu_kernels)
    program.operators = len(model.main.operators)
    return Prepared(model, program, [])


def _jit(source, o: Options, compiler, parsed: Model | None = None) -> JitResult:
    from coralrt.compile.jit import jit_compile
    host = o.host
    return jit_compile(source, mode=o.partition_mode, cache=o.cache, compiler=compiler,
                       rules=host.ops.rules(), rules_fingerprint=host.ops.fingerprint(),
                       events=host.compile_event, parsed=parsed,
                       rewrites=chosen_rewrites(o))


def chosen_rewrites(o: Options) -> list:
    """The rewrites a JIT compile applies, in order (the cpu target applies none)."""
    from coralrt.compile.rewrite import select_rewrites
    spec = o.rewrites
    if spec is None:
        spec = "none" if o.partition_mode == "compat" else "exact"
    return select_rewrites(spec, o.host.rewrites.rewrites)


def _cached_for_usb(source, o: Options) -> JitResult | None:
    from coralrt.compile.jit import jit_lookup
    return jit_lookup(source, device_kind="usb", mode=o.partition_mode, cache=o.cache,
                      rules_fingerprint=o.host.ops.fingerprint(),
                      rewrites=chosen_rewrites(o))


def _devices(o: Options, default) -> tuple[list[EdgeTpuDevice], bool]:
    """The open sticks for ``o.device`` (``default()`` when None), and whether
    the user gave a list (which pipelines the segments)."""
    if o.device is None:
        return [default()], False
    if isinstance(o.device, (list, tuple)):
        return open_stick(o.device), True
    return [open_stick(o.device)], False


def _on_devices(model: Model, o: Options, default, compile_info) -> Prepared:
    """The program of ``model`` on its sticks; the sticks opened here are closed
    again if the program cannot be built (a device refusing the program)."""
    devices, pipelined = _devices(o, default)
    given = o.device if isinstance(o.device, (list, tuple)) else [o.device]
    try:
        program = _program(model, devices, o, pipelined)
    except BaseException:
        for device in devices:
            if not any(device is g for g in given):
                device.close()
        raise
    return Prepared(model, program, devices, compile_info)


def prepare_sim(source, o: Options, parsed: Model | None = None) -> Prepared:
    if parsed is None and expected_plain(source) is not None:
        parsed = load_model(source)  # named like an edgetpu_compiler output: look inside
    if parsed is not None:
        source, parsed = _host_runnable(source, parsed, "sim")
    jit = _jit(source, o, o.host.compilers.for_device("sim"), parsed)
    if compiled_by(jit.model) != "coralrt":  # no coralrt-segment: nothing for the stick
        log.warning("target 'sim': no operator of this model maps to the Edge TPU, so it "
                    "runs entirely on the CPU (%s); see 'coralrt partition' for each "
                    "operator's reason", no_segment_reason(jit.compile_info))

    def fresh_stick() -> EdgeTpuDevice:
        device = o.host.devices.create("sim", kernels=o.host.ops.sim_kernels())
        device.open()
        return device

    return dataclasses.replace(_on_devices(jit.model, o, fresh_stick, jit.compile_info),
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
        from coralrt.usb import open_device
        return open_device(device)  # DeviceNotFoundError when no stick is attached
    return device


def prepare_coral(source, o: Options, parsed: Model | None = None) -> Prepared:
    via = None
    if o.driver == "libedgetpu":   # probed in a child process before any compile
        from coralrt.backends import libedgetpu as via
        via.check_ready(o.backend, o.device)

    def on_libedgetpu(model: Model, data) -> Program:   # the whole model, one interpreter
        return via.load_program(model, data, backend=o.backend, device=o.device,
                                num_threads=o.num_threads, kernels=o.cpu_kernels, host=o.host,
                                override_builtins=o.override_builtins)

    model = parsed or load_model(source)
    if model.is_edgetpu_compiled:
        if via is not None:
            data = model.to_bytes() if isinstance(source, Model) else model.source
            return Prepared(model, on_libedgetpu(model, data), [])
        return _on_devices(model, o, lambda: open_stick(None), None)
    # A compile made for real sticks is used before any compiler is asked: a Pi
    # without one, or whose compile service is down, runs an imported entry.
    jit = _cached_for_usb(source, o)
    if jit is None:
        compiler = usb_compiler(o)
        if compiler is None:
            raise CompilerUnavailableError()
        jit = _jit(source, o, compiler, model)
    if via is not None:
        return Prepared(jit.model, on_libedgetpu(jit.model, None), [],
                        jit.compile_info, source=source, source_model=model)
    return dataclasses.replace(_on_devices(jit.model, o, lambda: open_stick(None),
                                           jit.compile_info),
                               source=source, source_model=model)


def usb_compiler(o: Options):
    """The compiler for a real stick: the session's compile service, else the
    plugins' (``CORALRT_COMPILER_URL``'s service, else a local edgetpu_compiler)."""
    if o.compiler_url:
        from coralrt.compile.remote import RemoteCompiler
        return RemoteCompiler(o.compiler_url)
    return o.host.compilers.for_device("usb")


def choose_auto(source, o: Options) -> tuple[str, Model | None]:
    """``("coral", model)`` when a stick is present and the model can run on it,
    else ``("cpu", model or None)``; the model is returned when it had to be
    parsed to decide, so that the session does not parse it again."""
    if o.device is not None:
        log.info("target 'auto': running on the Coral USB Accelerator given as device=")
        return "coral", None
    from coralrt.usb import list_devices
    # "auto" never chooses libedgetpu: only driver= or CORALRT_DRIVER do, for a stick.
    unused = "; driver 'libedgetpu' not used" if o.driver == "libedgetpu" else ""
    try:
        sticks, why = list_devices(), "no Coral USB Accelerator found"
    except Exception as e:  # no libusb, no permission to enumerate: not a reason to fail
        sticks, why = [], f"cannot list USB devices: {e}"
    model = load_model(source)
    if not sticks:
        if compiled_by(model) == "edgetpu_compiler" and plain_sibling(source) is None:
            raise ModelError(not_on_host(model, source, no_stick=True))
        log.info("target 'auto': running on the CPU (%s)%s", why, unused)
        return "cpu", model
    if not model.is_edgetpu_compiled and usb_compiler(o) is None \
            and _cached_for_usb(source, o) is None:
        log.info("target 'auto': running on the CPU (a stick is present but the model is not "
                 "compiled for the Edge TPU, its compiled form is not in the cache, and no "
                 "compiler for real sticks is available)%s", unused)
        return "cpu", model
    log.info("target 'auto': running on the Coral USB Accelerator %s", sticks[0].path)
    return "coral", model


_PREPARE = {"cpu": prepare_cpu, "sim": prepare_sim, "coral": prepare_coral}


def prepare(target: str, source, o: Options, parsed: Model | None = None) -> Prepared:
    """Everything a session on ``target`` needs (``parsed``: ``source`` already parsed)."""
    return _PREPARE[target](source, o, parsed)


def resolve_driver(driver: str | None, target: str) -> str:
    """The driver a session on ``target`` uses: ``driver=`` when given, else
    ``CORALRT_DRIVER``.  ``driver="libedgetpu"`` given to ``cpu`` or ``sim`` is a
    ConfigError; ``CORALRT_DRIVER=libedgetpu`` (process-wide) is not applied to
    them, with a log line."""
    if driver is None:
        chosen = config.driver()
        if chosen != config.DRIVERS[0] and target in ("cpu", "sim"):
            log.info("%s=%s does not apply to target %r (only to 'coral', and 'auto' on a "
                     "stick); not used", config.DRIVER, chosen, target)
            return config.DRIVERS[0]
        return chosen
    if not isinstance(driver, str) or driver not in config.DRIVERS:
        raise ConfigError(f"unknown driver {driver!r}; choose one of "
                          f"{', '.join(config.DRIVERS)}")
    if driver != config.DRIVERS[0] and target in ("cpu", "sim"):
        raise ConfigError(
            f"driver={driver!r} applies only to target='coral' (and 'auto' when it finds a "
            f"stick); target {target!r} does not reach a Coral stick: drop driver= or use "
            f"target='coral'")
    return driver
