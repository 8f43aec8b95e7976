"""The target registry: every name ``InferenceSession(target=...)`` accepts.

A :class:`Target` says which device kind runs its Edge TPU steps, which
compiler kind builds them, how a session on it is prepared, and how ``auto``
probes it.  The session's target check, ``coralrt.TARGETS``,
``CORALRT_TARGET``, the command line's ``--target`` choices and the order
in which ``auto`` tries targets are all read from here: registering a target
(:func:`register`) adds it to each of them.  ``auto`` itself is not a
registered target; it is always the last name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from coralrt import _config as config
from coralrt.errors import ConfigError

if TYPE_CHECKING:
    from coralrt._model import Model

__all__ = ["Target", "Probe", "AUTO", "register", "unregister", "get", "registered",
           "names", "auto_order", "reaches_stick"]

#: The name of the target that chooses among the others (:func:`auto_order`).
AUTO = "auto"


class Probe(NamedTuple):
    """What a target's probe found: whether ``auto`` may choose it, the model
    if the probe had to parse it (so that it is not parsed again), and, when
    not, why (said in the log line of the target ``auto`` chooses)."""
    ok: bool
    model: Model | None = None
    reason: str = ""


@dataclass(frozen=True)
class Target:
    """A session target.

    :param name: the word users write (``target="sim"``).
    :param device_kind: the device kind (device registry, compilers'
        ``runs_on``) of its Edge TPU steps; None when it has none (``cpu``).
    :param compiler_kind: the device kind whose compiler builds its
        segments (``host.compilers.for_device``); None when it compiles nothing.
    :param prepare: ``prepare(target, source, loading, parsed) -> Prepared``
        (:mod:`coralrt._targets.prepare`).
    :param probe: ``probe(target, source, loading, parsed) -> Probe``: whether
        ``auto`` may run the model here; None: ``auto`` never chooses it.
    :param auto_rank: the order in which ``auto`` probes (lower first); None
        for a target without a probe.
    :param title: where it runs, as the ``auto`` log line says it ("the CPU").
    :param hardware: whether it needs a device attached to this machine (the
        commands that must run anywhere, ``bench`` and ``demo``, offer only
        targets without).
    """

    name: str
    device_kind: str | None
    compiler_kind: str | None
    prepare: Callable
    probe: Callable | None = None
    auto_rank: int | None = None
    title: str = ""
    hardware: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or self.name == AUTO:
            raise ConfigError(f"a target name must be a non-empty str other than {AUTO!r}, "
                              f"not {self.name!r}")
        if (self.probe is None) != (self.auto_rank is None):
            raise ConfigError(f"target {self.name!r}: probe and auto_rank go together")
        for kind in ("device_kind", "compiler_kind"):
            value = getattr(self, kind)
            if value is not None:
                object.__setattr__(self, kind, config.device_kind(value))


_TARGETS: dict[str, Target] = {}


def _publish() -> None:
    config.TARGETS._names = (*_TARGETS, AUTO)


def register(target: Target) -> None:
    """Add ``target``; a name already registered is a ConfigError."""
    if not isinstance(target, Target):
        raise ConfigError(f"register() takes a coralrt._targets.Target, not "
                          f"{type(target).__name__}")
    if target.name in _TARGETS:
        raise ConfigError(f"target {target.name!r} is already registered")
    _TARGETS[target.name] = target
    _publish()


def unregister(name: str) -> None:
    """Remove the target ``name`` (a KeyError if there is none)."""
    del _TARGETS[name]
    _publish()


def get(name: str) -> Target:
    """The registered target ``name`` (a KeyError for ``auto`` or an unknown name)."""
    return _TARGETS[name]


def registered() -> tuple[Target, ...]:
    """The registered targets, in registration order (``auto`` is not one)."""
    return tuple(_TARGETS.values())


def names(*, hardware: bool | None = None, first: str | None = None) -> tuple[str, ...]:
    """Target names in registry order, ``auto`` last.  ``hardware=False``: only
    the targets that need no device attached (and not ``auto``); ``first``: that
    name moved to the front (a command's default)."""
    if hardware is None:
        found = [*_TARGETS, AUTO]
    else:
        found = [t.name for t in _TARGETS.values() if t.hardware == hardware]
    if first in found:
        found.remove(first)
        found.insert(0, first)
    return tuple(found)


def auto_order() -> list[Target]:
    """The targets ``auto`` probes, in order: those with a probe, by ``auto_rank``
    (registration order among equal ranks)."""
    return sorted((t for t in _TARGETS.values() if t.probe is not None),
                  key=lambda t: t.auto_rank)


def reaches_stick(name: str) -> bool:
    """Whether a session on ``name`` may reach a Coral stick (``driver=`` applies):
    a target whose device kind is ``coral``, and ``auto``."""
    target = _TARGETS.get(name)
    return name == AUTO or (target is not None and target.device_kind == config.CORAL)
