"""What each target prepares when a session is created.

``prepare(target, model, options)`` returns the model the session describes,
the program it runs (a CPU backend program, or an executor program of TPU,
CPU and plugin steps), the device, and the compile information.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from coralrt.errors import ConfigError, ModelError
from coralrt.model import Model, load_model

__all__ = ["Prepared", "Options", "prepare", "choose_auto"]

log = logging.getLogger("coralrt.session")

COMPILED_ELSEWHERE = ("this model was compiled by edgetpu_compiler (it contains "
                      "edgetpu-custom-op) and only runs on an Edge TPU")


@dataclass
class Options:
    backend: object           # a CpuBackend
    host: object              # the PluginHost
    num_threads: int | None = None
    cpu_kernels: str = "optimized"
    partition_mode: str = "multi"
    cache: object = None
    device: object = None      # a device, a device path ("usb:0"), a list of those, or None
    override_builtins: bool = False
    pipeline_depth: int = 2    # requests queued between pipeline stages (device lists)


@dataclass
class Prepared:
    model: Model
    program: object
    device: object = None
    compile_info: dict | None = None


def _program(model: Model, device, o: Options):
    if isinstance(device, list):      # several sticks: pipeline the segments over them
        from coralrt.runtime.pipeline import build_pipelined_program
        return build_pipelined_program(model, devices=device, backend=o.backend,
                                       num_threads=o.num_threads, cpu_kernels=o.cpu_kernels,
                                       host=o.host, override_builtins=o.override_builtins,
                                       depth=o.pipeline_depth)
    from coralrt.runtime.executor import build_program
    return build_program(model, device=device, backend=o.backend, num_threads=o.num_threads,
                         cpu_kernels=o.cpu_kernels, host=o.host,
                         override_builtins=o.override_builtins)


def prepare_cpu(source, o: Options) -> Prepared:
    model = load_model(source)  # errors name the file when given a path
    data = model.to_bytes() if isinstance(source, Model) else model.source
    if model.is_edgetpu_compiled:
        raise ModelError(COMPILED_ELSEWHERE + "; use the plain, uncompiled .tflite with "
                         "target='cpu'")
    kernels = o.host.ops.kernels
    if o.host.wraps_steps or any(op.name in kernels and (op.opcode.is_custom
                                                         or o.override_builtins)
                                 for op in model.main.operators):
        return Prepared(model, _program(model, None, o))
    return Prepared(model, o.backend.load(data, num_threads=o.num_threads,
                                          kernels=o.cpu_kernels))


def _jit(source, o: Options, compiler):
    from coralrt.compile.jit import jit_compile
    host = o.host
    return jit_compile(source, mode=o.partition_mode, cache=o.cache, compiler=compiler,
                       rules=host.ops.rules(), rules_fingerprint=host.ops.fingerprint(),
                       events=host.compile_event)


def prepare_sim(source, o: Options) -> Prepared:
    jit = _jit(source, o, o.host.compilers.for_device("sim"))
    device = o.device
    if isinstance(device, (list, tuple)):
        device = open_stick(device)
    elif device is None:
        device = o.host.devices.create("sim", kernels=o.host.ops.sim_kernels())
        device.open()
    return Prepared(jit.model, _program(jit.model, device, o), device, jit.compile_info)


def open_stick(device):
    """``device`` as an open stick: an opened device object as is, a path opened;
    a list or tuple of those as a list of open sticks (closing the ones it
    opened if a later one fails)."""
    from coralrt.usb import open_device
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
        return open_device(device)  # DeviceNotFoundError when no stick is attached
    return device


def prepare_coral(source, o: Options) -> Prepared:
    model = load_model(source)
    compile_info = None
    if not model.is_edgetpu_compiled:
        compiler = o.host.compilers.for_device("usb")
        if compiler is None:
            raise _compiler_unavailable()
        jit = _jit(source if not isinstance(source, Model) else model, o, compiler)
        model, compile_info = jit.model, jit.compile_info
    device = open_stick(o.device)
    return Prepared(model, _program(model, device, o), device, compile_info)


def _compiler_unavailable():
    from coralrt.errors import CompilerUnavailableError
    return CompilerUnavailableError()


def choose_auto(source, o: Options) -> str:
    """``coral`` when a stick is present and the model can run on it, else ``cpu``."""
    from coralrt.usb import list_devices
    if o.device is not None:
        log.info("target 'auto': running on the Coral USB Accelerator given as device=")
        return "coral"
    try:
        sticks = list_devices()
    except Exception as e:  # no libusb, no permission to enumerate: not a reason to fail
        log.info("target 'auto': running on the CPU (cannot list USB devices: %s)", e)
        return "cpu"
    if not sticks:
        log.info("target 'auto': running on the CPU (no Coral USB Accelerator found)")
        return "cpu"
    model = load_model(source)
    if not model.is_edgetpu_compiled and o.host.compilers.for_device("usb") is None:
        log.info("target 'auto': running on the CPU (a stick is present but the model is not "
                 "compiled for the Edge TPU and edgetpu_compiler is not available)")
        return "cpu"
    log.info("target 'auto': running on the Coral USB Accelerator %s", sticks[0].path)
    return "coral"


def prepare(target: str, source, o: Options) -> Prepared:
    return {"cpu": prepare_cpu, "sim": prepare_sim, "coral": prepare_coral}[target](source, o)
