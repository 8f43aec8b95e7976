"""``load_delegate`` and the Edge TPU delegate object, as tflite_runtime has them.

No native library is loaded: the delegate only tells a
:class:`coralrt.tflite.Interpreter` to run through coralrt's Edge TPU path,
and on which stick.  The library names are libedgetpu's (what pycoral asks
for on each platform), alone or as a path; the ``device`` option takes
pycoral's device strings.

As libedgetpu's delegate does, loading fails when no stick can serve it
(``ValueError: Failed to load delegate from libedgetpu.so.1``): under
``CORALRT_TARGET`` ``auto`` (the default) or ``coral`` when no Coral USB
Accelerator, or not the one named, is connected; under ``sim`` when the
index names none of the ``CORALRT_SIM_STICKS`` simulated sticks.  Under
``cpu`` the delegate is not checked: the work runs on the CPU by request.
"""

from __future__ import annotations

import logging
import os
import re

from coralrt import _config as config

__all__ = ["EdgeTpuDelegate", "load_delegate", "EDGETPU_LIBRARIES"]

log = logging.getLogger("coralrt.tflite")

#: libedgetpu's names: Linux (both sonames), macOS, Windows.
EDGETPU_LIBRARIES = ("libedgetpu.so.1", "libedgetpu.so.1.0", "libedgetpu.1.dylib",
                     "edgetpu.dll")

_USB = re.compile(r"usb(?::(\d+))?")
_PCI = re.compile(r"pci(?::(\d+))?")
_ANY = re.compile(r":(\d+)")


class EdgeTpuDelegate:
    """What :func:`load_delegate` returns for libedgetpu.

    ``library`` and ``options`` are as given (option values as strings, as
    tflite_runtime passes them to the library); ``device`` is the stick as
    coralrt names it (``"usb:1"``, ``":0"``), or ``None`` for the first one.
    """

    def __init__(self, library: str, options: dict | None = None):
        self.library = library
        self.options = {str(k): str(v) for k, v in (options or {}).items()}
        self.device = _device(library, self.options.get("device"))

    def __repr__(self) -> str:
        return f"<EdgeTpuDelegate library={self.library!r} device={self.device!r} (coralrt)>"


def _failed(library, why: str) -> ValueError:
    # tflite_runtime's wording, then what coralrt has to say.
    return ValueError(f"Failed to load delegate from {library}\n{why}")


def _device(library, spec: str | None) -> str | None:
    """pycoral's device string as a coralrt device path; PCIe is refused."""
    if spec is None or spec == "":
        return None
    if _PCI.fullmatch(spec):
        raise _failed(library, f"device {spec!r} is a PCIe Edge TPU; coralrt drives only "
                               f"Coral USB Accelerators (use 'usb', 'usb:N' or ':N')")
    m = _USB.fullmatch(spec)
    if m:
        return f"usb:{m.group(1) or 0}"
    if _ANY.fullmatch(spec):
        return spec
    raise _failed(library, f"device {spec!r} is not understood; use 'usb' (the first Coral "
                           f"USB Accelerator), 'usb:N' (the Nth) or ':N' (the Nth Edge TPU)")


def load_delegate(library, options: dict | None = None) -> EdgeTpuDelegate:
    """tflite_runtime's ``load_delegate`` for libedgetpu (by name or path).

    Any other library raises ``ValueError`` ("Failed to load delegate from
    ..."), as tflite_runtime does for a library it cannot load: coralrt
    provides only the Edge TPU delegate.  ``options["device"]`` takes
    ``usb``, ``usb:N``, ``:N``; ``pci`` and ``pci:N`` raise ``ValueError``.
    """
    name = os.path.basename(os.fspath(library)) if isinstance(library, (str, os.PathLike)) \
        else None
    if name not in EDGETPU_LIBRARIES:
        raise _failed(library, f"coralrt provides only the Edge TPU delegate "
                               f"({', '.join(EDGETPU_LIBRARIES)}); other delegates are not "
                               f"available (run without experimental_delegates to use the CPU)")
    if options is not None and not hasattr(options, "items"):
        raise _failed(library, f"options must be a dict, got {type(options).__name__}")
    delegate = EdgeTpuDelegate(os.fspath(library), options)
    _check_served(delegate)
    log.debug("Edge TPU delegate: %r", delegate)
    return delegate


def _index(device: str | None) -> int:
    return 0 if device is None else int(device.rpartition(":")[2])


def _check_served(delegate: EdgeTpuDelegate) -> None:
    """Raise libedgetpu's ValueError when no stick of the target can serve ``delegate``."""
    target = config.compat_target()
    library, index = delegate.library, _index(delegate.device)
    if target == "cpu":
        return
    if target == "sim":
        n = config.sim_sticks()
        if index >= n:
            raise _failed(library, f"{_named(delegate)} is not one of the {n} simulated "
                                   f"sticks (CORALRT_TARGET=sim presents :0 to :{n - 1}; "
                                   f"set {config.SIM_STICKS} for more)")
        return
    from coralrt._usb import count_attached
    found = count_attached()
    if found is None or index < found:
        return              # present, or cannot tell: opening the stick will say
    hint = ("check that it is plugged in with a data cable (`lsusb` lists 1a6e:089a or "
            "18d1:9302, `coralrt devices`) and that you may open it (docs/install-raspberry-pi"
            ".md, udev rules); to run without a stick, set CORALRT_TARGET=sim (the simulated "
            "Edge TPU) or CORALRT_TARGET=cpu")
    if found == 0:
        raise _failed(library, f"no Coral USB Accelerator found; {hint}")
    raise _failed(library, f"{_named(delegate)}: found only {found} Coral USB "
                           f"Accelerator{'s' if found > 1 else ''}; {hint}")


def _named(delegate: EdgeTpuDelegate) -> str:
    return f"device {delegate.options.get('device')!r}" if delegate.device else "the first stick"
