"""Finding Coral USB Accelerators in both modes and naming them stably.

Sticks are listed in bootloader mode (1a6e:089a, firmware not loaded yet)
and in running mode (18d1:9302).  They are sorted by bus and port path and
numbered ``usb:0``, ``usb:1`` ... like pycoral's device strings; each also has
its port path ``/sys/bus/usb/devices/<bus>-<port>[.<port>...]`` (libedgetpu's
device path), which survives the re-enumeration after firmware download.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import usb.core

from coralrt.errors import DeviceError, DeviceNotFoundError
from coralrt._usb import constants as C
from coralrt._usb.transport import translate_error

__all__ = ["DeviceInfo", "default_backend", "list_devices", "find_devices", "select",
           "port_path_of", "speed_name", "find_at_port"]

log = logging.getLogger("coralrt.usb")

SYSFS_PREFIX = "/sys/bus/usb/devices/"
_SPEEDS = {1: "usb1", 2: "usb1", 3: "usb2", 4: "usb3", 5: "usb3"}


@dataclass(frozen=True)
class DeviceInfo:
    path: str            # "usb:N"
    mode: str            # "bootloader" | "running"
    bus: int
    address: int
    port_path: str       # "/sys/bus/usb/devices/B-P[.P...]" ("" when the port is unknown)
    usb_speed: str       # "usb3" | "usb2" | "usb1" | "unknown"

    def to_dict(self) -> dict:
        return {"path": self.path, "mode": self.mode, "bus": self.bus,
                "address": self.address, "port_path": self.port_path,
                "usb_speed": self.usb_speed}


def default_backend():
    """libusb-1.0 through the libusb-package wheel (falls back to pyusb's own search)."""
    try:
        import libusb_package
        backend = libusb_package.get_libusb1_backend()
    except Exception as e:  # noqa: BLE001 - any failure: let pyusb search the system
        log.debug("libusb-package backend unavailable: %s", e)
        backend = None
    if backend is None:
        import usb.backend.libusb1
        backend = usb.backend.libusb1.get_backend()
    if backend is None:
        raise DeviceNotFoundError(
            "no libusb backend is available: install the libusb-package Python package "
            "or the system libusb-1.0 library")
    return backend


def port_numbers_of(dev) -> tuple[int, ...]:
    try:
        ports = dev.port_numbers
    except (usb.core.USBError, NotImplementedError, AttributeError):
        ports = None
    return tuple(ports) if ports else ()


def port_path_of(dev) -> str:
    ports = port_numbers_of(dev)
    if not ports:
        return ""
    return f"{SYSFS_PREFIX}{dev.bus}-{'.'.join(str(p) for p in ports)}"


def speed_name(dev) -> str:
    return _SPEEDS.get(getattr(dev, "speed", None) or 0, "unknown")


def _sort_key(dev):
    return (dev.bus or 0, port_numbers_of(dev), dev.address or 0)


def find_devices(backend) -> list[tuple[object, str]]:
    """Every stick on ``backend`` as (pyusb device, mode), in stable order."""
    found = []
    try:
        for ids, mode in ((C.BOOTLOADER_ID, "bootloader"), (C.APP_ID, "running")):
            for dev in usb.core.find(find_all=True, idVendor=ids[0], idProduct=ids[1],
                                     backend=backend):
                found.append((dev, mode))
    except (usb.core.USBError, OSError, usb.core.NoBackendError) as e:
        raise translate_error(e, "listing USB devices") from e
    found.sort(key=lambda item: _sort_key(item[0]))
    return found


def _info(index: int, dev, mode: str) -> DeviceInfo:
    return DeviceInfo(f"usb:{index}", mode, dev.bus or 0, dev.address or 0, port_path_of(dev),
                      speed_name(dev))


def list_devices(backend=None) -> list[DeviceInfo]:
    """Every connected stick (both modes), sorted by bus and port path."""
    backend = default_backend() if backend is None else backend
    return [_info(i, dev, mode) for i, (dev, mode) in enumerate(find_devices(backend))]


def _parse_port(path: str) -> str:
    return path if path.startswith(SYSFS_PREFIX) else SYSFS_PREFIX + path


def no_stick(path: str | None = None, *, extra: str = "") -> DeviceNotFoundError:
    """The error for "no stick is attached at all" (``extra`` is appended)."""
    return DeviceNotFoundError(
        "no Coral USB Accelerator found (looked for 1a6e:089a and 18d1:9302); plug the "
        "stick in, use a data cable, and check `lsusb`" + extra, path=path)


def select(backend, path: str | None) -> tuple[object, str, DeviceInfo]:
    """The (pyusb device, mode, info) named by ``path``.

    ``path``: None, ``"usb"`` (the first stick), ``"usb:N"`` or ``":N"`` (the
    N-th), or a port path (``"/sys/bus/usb/devices/2-1.4"`` or ``"2-1.4"``).
    """
    found = find_devices(backend)
    listed = [f"usb:{i} {port_path_of(d) or '(port unknown)'} ({m})"
              for i, (d, m) in enumerate(found)]
    if not found:
        raise no_stick(path)
    if path in (None, "", "usb"):
        index = 0
    elif path.startswith("usb:") or path.startswith(":"):
        try:
            index = int(path.split(":", 1)[1])
        except ValueError:
            raise DeviceError(f"invalid device path {path!r}; use usb:N or a port path "
                              f"such as /sys/bus/usb/devices/2-1", path=path) from None
        if not 0 <= index < len(found):
            raise DeviceNotFoundError(f"no stick {path}: found {len(found)} "
                                      f"({'; '.join(listed)})", path=path)
    else:
        wanted = _parse_port(path)
        matches = [i for i, (d, _) in enumerate(found) if port_path_of(d) == wanted]
        if not matches:
            raise DeviceNotFoundError(f"no stick at {wanted}: found {'; '.join(listed)}",
                                      path=path)
        index = matches[0]
    dev, mode = found[index]
    return dev, mode, _info(index, dev, mode)


def find_at_port(backend, info: DeviceInfo, ids: tuple[int, int]):
    """The device with ``ids`` at the port of ``info`` (or the only one when ports are
    unknown); None when it is not there."""
    try:
        devs = list(usb.core.find(find_all=True, idVendor=ids[0], idProduct=ids[1],
                                  backend=backend))
    except (usb.core.USBError, OSError) as e:
        raise translate_error(e, "listing USB devices", path=info.path) from e
    if info.port_path:
        devs = [d for d in devs if port_path_of(d) == info.port_path]
    elif len(devs) > 1:
        devs = [d for d in devs if d.bus == info.bus] or devs
    devs.sort(key=_sort_key)
    return devs[0] if devs else None
