"""The self-test's report: the versions and host it ran on, and its checks, as
plain text for a person and as JSON to attach to an issue."""

from __future__ import annotations

import ctypes
import platform
import sys
from dataclasses import dataclass, field

from coralrt._selftest.checks import Check

__all__ = ["Report", "environment", "libusb_version", "REPORT_KEYS"]

#: The top-level keys of :meth:`Report.to_dict` (docs/hardware-validation.md).
REPORT_KEYS = ("coralrt", "simulated", "stick_found", "versions", "host", "usb", "checks",
               "counts", "ok")


class _LibusbVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint16), ("minor", ctypes.c_uint16),
                ("micro", ctypes.c_uint16), ("nano", ctypes.c_uint16),
                ("rc", ctypes.c_char_p), ("describe", ctypes.c_char_p)]


def libusb_version(backend) -> str | None:
    """libusb's own version through a pyusb libusb1 backend (None when unknown)."""
    lib = getattr(backend, "lib", None)
    fn = getattr(lib, "libusb_get_version", None)
    if fn is None:
        return None
    try:
        fn.restype = ctypes.POINTER(_LibusbVersion)
        v = fn().contents
        rc = (v.rc or b"").decode("ascii", "replace")
        return f"{v.major}.{v.minor}.{v.micro}.{v.nano}{rc}"
    except (OSError, ValueError, AttributeError):
        return None


def environment(backend=None, *, simulated: bool = False) -> dict:
    """Versions and host: what a maintainer needs to read a report from elsewhere."""
    import numpy
    import usb

    from coralrt._version import version
    if simulated:
        libusb = "none (simulated USB backend)"
    else:
        libusb = libusb_version(backend) or "unknown"
    return {
        "versions": {"coralrt": version(), "python": platform.python_version(),
                     "python_implementation": platform.python_implementation(),
                     "numpy": numpy.__version__, "pyusb": getattr(usb, "__version__", "unknown"),
                     "libusb": libusb},
        "host": {"os": platform.system(), "release": platform.release(),
                 "platform": platform.platform(), "machine": platform.machine(),
                 "python_executable": sys.executable},
    }


@dataclass
class Report:
    simulated: bool
    checks: list[Check] = field(default_factory=list)
    usb: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    def counts(self) -> dict:
        return {s: sum(c.status == s for c in self.checks) for s in ("ok", "fail", "skipped")}

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    @property
    def exit_status(self) -> int:
        return 1 if self.failed else 0

    def to_dict(self) -> dict:
        return {"coralrt": "selftest", "simulated": self.simulated, "stick_found": True,
                "versions": self.env.get("versions", {}), "host": self.env.get("host", {}),
                "usb": self.usb, "checks": [c.to_dict() for c in self.checks],
                "counts": self.counts(), "ok": not self.failed}

    def summary(self) -> str:
        lines = []
        if self.simulated:
            lines.append("coralrt selftest on a simulated Coral USB Accelerator (--simulated: "
                         "no real stick was used; checks that need the chip are skipped)")
        else:
            lines.append("coralrt selftest on the Coral USB Accelerator at "
                         f"{self.usb.get('port_path') or self.usb.get('path', '?')}")
        width = max((len(c.name) for c in self.checks), default=0)
        for c in self.checks:
            lines.append(f"{c.status:<7} {c.name:<{width}}  {c.summary}")
        n = self.counts()
        verdict = ("no check failed" if not self.failed else
                   f"{n['fail']} check{'s' if n['fail'] != 1 else ''} failed")
        lines.append("")
        lines.append(f"{n['ok']} ok, {n['fail']} failed, {n['skipped']} skipped: {verdict}")
        return "\n".join(lines)
