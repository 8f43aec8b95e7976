"""``target="auto"``: the first registered target whose probe accepts the model.

The targets are probed in :func:`coralrt._targets.registry.auto_order`
(``coral``, then ``cpu``, which always accepts); the log says where the
session runs and why the targets before it were passed over.  The first time
in a process that ``auto`` settles for a target other than the first (the CPU
instead of a stick) it says so at WARNING, later times at INFO: the user asked
for that fallback, and one line is enough to learn that it happened.
"""

from __future__ import annotations

import logging

from coralrt import _config as config
from coralrt.errors import ConfigError, ModelError
from coralrt._model import Model, load_model
from coralrt._model.compiled import compiled_by, host_model, not_on_host
from coralrt._targets.prepare import Loading, cached_for_coral, usb_compiler
from coralrt._targets.registry import Probe, Target, auto_order, reaches_stick

__all__ = ["choose_auto", "probe_coral", "probe_cpu", "resolve_driver"]

log = logging.getLogger("coralrt.session")

# Whether a fallback was already logged at WARNING in this process.
_warned = False


def choose_auto(source, o: Loading) -> tuple[str, Model | None]:
    """``(target name, model)``: the first target of the ``auto`` order whose
    probe accepts; the model is returned when it had to be parsed to decide,
    so that the session does not parse it again."""
    # "auto" never chooses libedgetpu: only driver= or CORALRT_DRIVER do, for a stick.
    unused = "; driver 'libedgetpu' not used" if o.options.driver == "libedgetpu" else ""
    model, passed = None, []
    for target in auto_order():
        found = target.probe(target, source, o, model)
        model = found.model if found.model is not None else model
        if found.ok:
            if passed:
                _log_fallback("target 'auto': running on %s (%s)%s", target.title,
                              "; ".join(passed), unused)
            return target.name, model
        passed.append(found.reason)
    raise ConfigError("target 'auto': no registered target accepts this model")


def _log_fallback(message: str, *args) -> None:
    global _warned
    level = logging.INFO if _warned else logging.WARNING
    _warned = True
    log.log(level, message, *args)


def probe_coral(target: Target, source, o: Loading, parsed: Model | None = None) -> Probe:
    """A stick is given or present and the model can run on it: compiled by
    edgetpu_compiler, its compile for real sticks cached, or a compiler for
    real sticks available."""
    if o.options.device is not None:
        log.info("target 'auto': running on the Coral USB Accelerator given as device=")
        return Probe(True)
    from coralrt._usb import list_devices
    try:
        sticks, why = list_devices(), "no Coral USB Accelerator found"
    except Exception as e:  # no libusb, no permission to enumerate: not a reason to fail
        sticks, why = [], f"cannot list USB devices: {e}"
    model = parsed or load_model(source)
    if not sticks:
        if compiled_by(model) == "edgetpu_compiler" and host_model(source, model) is None:
            raise ModelError(not_on_host(model, source, no_stick=True))
        return Probe(False, model, why)
    if not model.is_edgetpu_compiled and usb_compiler(o) is None \
            and cached_for_coral(source, o) is None:
        return Probe(False, model, "a stick is present but the model is not compiled for "
                     "the Edge TPU, its compiled form is not in the cache, and no compiler "
                     "for real sticks is available")
    log.info("target 'auto': running on the Coral USB Accelerator %s", sticks[0].path)
    return Probe(True, model)


def probe_cpu(target: Target, source, o: Loading, parsed: Model | None = None) -> Probe:
    """The CPU runs every model."""
    return Probe(True, parsed)


def resolve_driver(driver: str | None, target: str) -> str:
    """The driver a session on ``target`` uses: ``driver=`` when given, else
    ``CORALRT_DRIVER``.  ``driver="libedgetpu"`` given to a target that reaches
    no Coral stick (``cpu``, ``sim``) is a ConfigError; ``CORALRT_DRIVER=libedgetpu``
    (process-wide) is not applied to them, with a log line."""
    if driver is None:
        chosen = config.driver()
        if chosen != config.DRIVERS[0] and not reaches_stick(target):
            log.info("%s=%s does not apply to target %r (only to 'coral', and 'auto' on a "
                     "stick); not used", config.DRIVER, chosen, target)
            return config.DRIVERS[0]
        return chosen
    if not isinstance(driver, str) or driver not in config.DRIVERS:
        raise ConfigError(f"unknown driver {driver!r}; choose one of "
                          f"{', '.join(config.DRIVERS)}")
    if driver != config.DRIVERS[0] and not reaches_stick(target):
        raise ConfigError(
            f"driver={driver!r} applies only to target='coral' (and 'auto' when it finds a "
            f"stick); target {target!r} does not reach a Coral stick: drop driver= or use "
            f"target='coral'")
    return driver
