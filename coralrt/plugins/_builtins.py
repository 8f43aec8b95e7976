"""coralrt's own operators, compiler, device, rewrites and step runner, registered as a plugin.

Registered under the name ``coralrt.builtins``
(:data:`coralrt.plugins._registry.BUILTIN`): any other plugin's compiler,
device kind, kernel or Edge TPU rule wins over what this one registers.
"""

from __future__ import annotations

import logging

from coralrt.errors import CoralRTError
from coralrt.plugins._hookspecs import hookimpl

# The compilers and the simulated stick are imported when the hooks run, not
# with this module: `import coralrt` must not load the compiler or the USB
# driver (about 100 ms), which the cpu target never uses.

log = logging.getLogger("coralrt.plugins")


@hookimpl
def coralrt_register_ops(registry) -> None:
    # The operator specs (coralrt/_ops); their kernels are imported when a
    # table that runs them is built, not here.
    from coralrt._ops import builtin_specs
    for spec in builtin_specs().values():
        registry.add_spec(spec)


@hookimpl
def coralrt_register_rewrites(registry) -> None:
    from coralrt._compile.rewrite.fc_conv import FC_AS_CONV
    from coralrt._compile.rewrite.gelu import GELU_REWRITE
    from coralrt._compile.rewrite.split import SPLIT_EMBEDDING, SPLIT_WIDE
    for rewrite in (GELU_REWRITE, FC_AS_CONV, SPLIT_WIDE, SPLIT_EMBEDDING):
        registry.add(rewrite)


@hookimpl
def coralrt_register_compilers(registry) -> None:
    from coralrt._compile.native import NativeCompiler
    registry.add(NativeCompiler())
    if not _register_remote_compiler(registry):
        _register_edgetpu_compiler(registry)


def _register_remote_compiler(registry) -> bool:
    """The ``remote`` compiler for ``usb`` sticks when ``CORALRT_COMPILER_URL`` is set
    (it replaces a local edgetpu_compiler).  Nothing goes over the network here."""
    from coralrt import _config as config
    url = config.compiler_url()
    if url is None:
        return False
    from coralrt._compile.remote import RemoteCompiler
    from coralrt.errors import ConfigError
    try:
        compiler = RemoteCompiler(url)
    except ConfigError as e:
        raise ConfigError(f"{config.COMPILER_URL}: {e}") from None
    log.debug("compile service %s registered for usb sticks", url)
    registry.add(compiler)
    return True


def _register_edgetpu_compiler(registry) -> None:
    """edgetpu_compiler, for ``usb`` sticks, when a binary is installed and answers
    (an x86-64 binary on another machine: under an emulator, when one is installed)."""
    from coralrt._compile.edgetpu_compiler import EdgeTpuCompiler, find_compiler
    from coralrt.errors import COMPILER_HELP
    try:
        path = find_compiler()
    except CoralRTError as e:  # CORALRT_EDGETPU_COMPILER names no executable
        log.warning("edgetpu_compiler not registered: %s", e)
        return
    if path is None:
        log.debug("edgetpu_compiler not found (PATH, CORALRT_EDGETPU_COMPILER)")
        return
    compiler = EdgeTpuCompiler(path)
    try:
        prefix = compiler.command_prefix  # the emulator an x86-64 binary needs on ARM
    except CoralRTError as e:
        # An x86-64 binary with no emulator here (its reason, without the generic
        # install text CompilerUnavailableError appends), or a bad CORALRT_X86_* value.
        log.warning("edgetpu_compiler at %s not registered: %s", path,
                    str(e).replace(COMPILER_HELP, "").strip())
        return
    try:
        version = compiler.version  # also part of every compile-cache key
    except CoralRTError as e:
        log.warning("edgetpu_compiler at %s not registered: %s", path, e)
        return
    if log.isEnabledFor(logging.DEBUG):
        from coralrt._compile.emulation import compile_paths
        local = compile_paths(path)[0]  # says whether binfmt_misc runs it (prefix [])
        how = "" if local["path"] != "emulated" else \
            f", emulated through {local['via']} ({' '.join(prefix) or 'the kernel starts it'})"
        log.debug("edgetpu_compiler %s at %s%s registered for usb sticks", version, path, how)
    registry.add(compiler)


@hookimpl
def coralrt_register_devices(registry) -> None:
    registry.add("sim", _simulated_stick)


def _simulated_stick(*args, **options):
    """The ``sim`` kind: :func:`coralrt._sim.stick.device.simulated_stick`, imported
    when a stick is made (``import coralrt`` must not load the USB driver)."""
    from coralrt._sim.stick.device import simulated_stick
    return simulated_stick(*args, **options)


@hookimpl
def coralrt_run_step(step, inputs):
    # step: a coralrt._runtime.info.StepInfo
    return step.run(inputs)
