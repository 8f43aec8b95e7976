"""Session targets: the registry, their options, and the load-time wiring of each.

* :mod:`~coralrt._targets.registry`: :class:`Target` and the registry every
  list of target names is read from (``coralrt.TARGETS``, ``CORALRT_TARGET``,
  the command line's ``--target``, the ``auto`` order).
* :mod:`~coralrt._targets.options`: :class:`SessionOptions`.
* :mod:`~coralrt._targets.prepare`: what ``cpu``, ``sim`` (and any target of a
  plugin's device kind) and ``coral`` prepare; :mod:`~coralrt._targets.auto`:
  how ``auto`` chooses, and the ``driver=`` rule.

coralrt's own targets are registered here, in the order of ``coralrt.TARGETS``:

==========  ===========  =============  ==========================================
target      device kind  compiler kind  auto
==========  ===========  =============  ==========================================
``cpu``     (none)       (none)         last: always accepts
``sim``     ``sim``      ``sim``        never
``coral``   ``coral``    ``coral``      first: a stick is given or present and the
                                        model can run on it
==========  ===========  =============  ==========================================
"""

from __future__ import annotations

from coralrt import _config as config
from coralrt._model import Model
from coralrt._targets.auto import choose_auto, probe_coral, probe_cpu, resolve_driver
from coralrt._targets.options import DeviceSpec, SessionOptions, with_overrides
from coralrt._targets.prepare import (Loading, Prepared, chosen_rewrites, no_segment_reason,
                                     open_stick, prepare_coral, prepare_cpu,
                                     prepare_on_device, usb_compiler)
from coralrt._targets.registry import (AUTO, Probe, Target, auto_order, get, names,
                                      register, registered, unregister)

__all__ = ["Target", "Probe", "AUTO", "register", "unregister", "get", "registered", "names",
           "auto_order", "SessionOptions", "DeviceSpec", "with_overrides", "Loading",
           "Prepared", "prepare", "choose_auto", "open_stick", "usb_compiler",
           "resolve_driver", "chosen_rewrites", "no_segment_reason", "prepare_on_device"]

register(Target("cpu", None, None, prepare_cpu, probe=probe_cpu, auto_rank=100,
                title="the CPU"))
register(Target(config.SIM, config.SIM, config.SIM, prepare_on_device,
                title="the simulated Edge TPU"))
register(Target("coral", config.CORAL, config.CORAL, prepare_coral, probe=probe_coral,
                auto_rank=10, title="the Coral USB Accelerator", hardware=True))


def prepare(target: str, source, o: Loading, parsed: Model | None = None) -> Prepared:
    """Everything a session on the registered ``target`` needs (``parsed``:
    ``source`` already parsed)."""
    t = get(target)
    return t.prepare(t, source, o, parsed)
