"""What tests, examples and plugin authors need to exercise coralrt without a Coral stick.

* :class:`ModelBuilder` (with :func:`make_tensor` and :func:`make_operator`):
  builds a TFLite model in memory, operator by operator;
* :func:`build_demo_model` and :func:`demo_input`: the built-in demo model
  (a tiny uint8 image classifier, the one ``coralrt demo`` runs) and its inputs;
* :class:`SimulatedBackend`, :func:`simulated_stick` and
  :func:`open_simulated_sticks`: the simulated Coral USB Accelerator, a pyusb
  backend driven by coralrt's real USB driver; :class:`FaultPlan` and
  :class:`Fault` make it misbehave on purpose;
* :class:`LatencyModel`: the simulator's estimate of a real stick's timing.

This module is part of the public API (``docs/api.md``).  The simulated stick
is imported on first use, so ``import coralrt.testing`` stays cheap.

    from coralrt import InferenceSession
    from coralrt.testing import build_demo_model, demo_input

    session = InferenceSession(build_demo_model(), target="sim")
    outputs = session.run(demo_input())     # {output name: array}
"""

from __future__ import annotations

import importlib

from coralrt._cli.demo_model import build_demo_model, demo_input
from coralrt._model.builder import ModelBuilder, make_operator, make_tensor

__all__ = [
    "ModelBuilder", "make_tensor", "make_operator", "build_demo_model", "demo_input",
    "SimulatedBackend", "FaultPlan", "Fault", "simulated_stick", "open_simulated_sticks",
    "LatencyModel",
]

# name -> module that defines it; imported when first asked for (the USB driver).
_LAZY = {
    "SimulatedBackend": "coralrt._sim.stick",
    "FaultPlan": "coralrt._sim.stick",
    "Fault": "coralrt._sim.stick",
    "simulated_stick": "coralrt._sim.stick.device",
    "open_simulated_sticks": "coralrt._sim.stick",
    "LatencyModel": "coralrt._sim.latency",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coralrt.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
