"""coralrt's own compiler, device and step runner, registered as a plugin."""

from __future__ import annotations

from coralrt.delegate.hookspecs import hookimpl


@hookimpl
def coralrt_register_compilers(registry) -> None:
    from coralrt.compile.native import NativeCompiler
    registry.add(NativeCompiler())


@hookimpl
def coralrt_register_devices(registry) -> None:
    from coralrt.sim.device import SimulatedEdgeTpu
    registry.add("sim", SimulatedEdgeTpu)


@hookimpl
def coralrt_run_step(step, inputs):
    return step.run(inputs)
