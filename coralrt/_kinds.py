"""The session's target names (a live view of the target registry) and the words
for the Edge TPU device kinds, with the former words still accepted.

They sit in the lowest layers because configuration (``CORALRT_TARGET``) and
the compile cache read them; :mod:`coralrt._targets` fills the names.  Also
reachable as ``coralrt._config.TARGETS``, ``coralrt._config.device_kind`` ...
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["TargetNames", "TARGETS", "COMPAT_TARGETS", "CORAL", "SIM", "KIND_ALIASES",
           "device_kind"]


class TargetNames(Sequence):
    """The session's target names, in order: a read-only, live view of the
    target registry (:mod:`coralrt._targets`, which fills it; this layer is
    below it).  Compares equal to the tuple of the same names."""

    def __init__(self) -> None:
        self._names: tuple[str, ...] = ()

    def __getitem__(self, index):
        return self._names[index]

    def __len__(self) -> int:
        return len(self._names)

    def __eq__(self, other) -> bool:
        return isinstance(other, (tuple, list, TargetNames)) and self._names == tuple(other)

    __hash__ = None  # live: its value changes when a target is registered

    def __repr__(self) -> str:
        return repr(self._names)


#: The session's targets; also what ``CORALRT_TARGET`` accepts (``COMPAT_TARGETS``).
TARGETS = COMPAT_TARGETS = TargetNames()

#: The Edge TPU device kinds (device registry, compilers' ``runs_on``): a Coral
#: USB Accelerator, and the simulated stick.
CORAL, SIM = "coral", "sim"
#: Former device-kind words still accepted from plugins, and the kind each names now.
KIND_ALIASES = {"usb": CORAL}


def device_kind(kind: str) -> str:
    """``kind`` with a former word replaced by today's (``"usb"`` -> ``"coral"``)."""
    return KIND_ALIASES.get(kind, kind)
