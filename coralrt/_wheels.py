"""Which platform pip installs for, and which of coralrt's binary dependencies
publish wheels for it.

``ai-edge-litert`` and ``libusb-package`` are dependencies only where they
have wheels: pyproject.toml says so with environment markers on
``sys_platform`` and ``platform_machine``, and the two sets below are the same
pairs.  Where they have none, coralrt uses its NumPy CPU backend and the
system's libusb-1.0 (docs/backends.md, docs/install-raspberry-pi.md).

:func:`pip_machine` is the machine name pip looks for wheels under.  It
differs from ``platform.machine()`` (the kernel's name) for a 32-bit Python
on a 64-bit kernel, which is the default of the 32-bit Raspberry Pi OS on a
Pi 4 or 5: the kernel says ``aarch64``, pip's tag rules map that to
``armv8l`` for a 32-bit interpreter and find armv7l wheels.  Environment
markers cannot see the interpreter's width, so ``platform_machine ==
'aarch64'`` still holds there and pip asks for wheels that do not exist; the
Pi guide's fix runs pip under ``linux32``, whose kernel name is ``armv8l``.
"""

from __future__ import annotations

import platform
import struct
import sys

__all__ = ["LITERT_WHEEL_PLATFORMS", "LIBUSB_PACKAGE_WHEEL_PLATFORMS", "pip_machine",
           "python_bits", "has_wheels", "platform_name"]

#: (sys.platform, machine) pairs ai-edge-litert publishes wheels for.
LITERT_WHEEL_PLATFORMS = frozenset({
    ("linux", "x86_64"), ("linux", "aarch64"), ("darwin", "arm64"), ("win32", "AMD64"),
})

#: (sys.platform, machine) pairs libusb-package publishes wheels for.
LIBUSB_PACKAGE_WHEEL_PLATFORMS = frozenset({
    ("linux", "x86_64"), ("linux", "aarch64"), ("darwin", "x86_64"), ("darwin", "arm64"),
    ("win32", "AMD64"), ("win32", "x86"),
})

_WHEELS = {"ai-edge-litert": LITERT_WHEEL_PLATFORMS,
           "libusb-package": LIBUSB_PACKAGE_WHEEL_PLATFORMS}

# A 64-bit kernel's machine name -> the name of its 32-bit personality, which is
# also what pip's tag rules use for a 32-bit interpreter there.
_PERSONALITY_32 = {"aarch64": "armv8l", "arm64": "armv8l", "x86_64": "i686",
                   "AMD64": "x86"}


def python_bits() -> int:
    """The running interpreter's pointer width: 32 or 64."""
    return struct.calcsize("P") * 8


def pip_machine(machine: str | None = None, bits: int | None = None) -> str:
    """The machine name wheels are chosen for: ``platform.machine()``, except
    a 32-bit interpreter on a 64-bit kernel gets the 32-bit name."""
    machine = platform.machine() if machine is None else machine
    bits = python_bits() if bits is None else bits
    return _PERSONALITY_32.get(machine, machine) if bits == 32 else machine


def has_wheels(package: str, sys_platform: str | None = None,
               machine: str | None = None) -> bool:
    """Whether ``pip install <package>`` finds a wheel for this interpreter
    (``package`` is ``"ai-edge-litert"`` or ``"libusb-package"``)."""
    return ((sys_platform or sys.platform), (machine or pip_machine())) in _WHEELS[package]


def platform_name() -> str:
    """``"Linux armv8l (32-bit Python on an aarch64 kernel)"`` and the like, for messages."""
    system = platform.system() or sys.platform
    kernel, machine = platform.machine() or "unknown", pip_machine()
    if machine != kernel:
        return f"{system} {machine} (32-bit Python on an {kernel} kernel)"
    return f"{system} {machine}"
