"""coralrt's udev rule for the Coral USB Accelerator, as data, and a parser that
tells which stick IDs a rules file covers (used by ``coralrt doctor``)."""

from __future__ import annotations

import re

__all__ = ["RULE_LINES", "RULES_DIRS", "IDS", "install_rule_fix", "rule_coverage",
           "world_writable"]

# udev/99-coralrt.rules without its comments (a test keeps the two identical): the fixes
# print it so that a user who installed coralrt with pip can create the file.
RULE_LINES = (
    'SUBSYSTEM=="usb", ATTRS{idVendor}=="1a6e", ATTRS{idProduct}=="089a", MODE="0660", '
    'GROUP="plugdev", TAG+="uaccess"',
    'SUBSYSTEM=="usb", ATTRS{idVendor}=="18d1", ATTRS{idProduct}=="9302", MODE="0660", '
    'GROUP="plugdev", TAG+="uaccess"',
)
# Earlier folders win: udev ignores a file in /lib when /etc has one of the same name.
RULES_DIRS = ("/etc/udev/rules.d", "/run/udev/rules.d", "/lib/udev/rules.d",
              "/usr/lib/udev/rules.d")
IDS = {"1a6e:089a": "bootloader", "18d1:9302": "running"}


def install_rule_fix() -> str:
    """Shell lines that install coralrt's udev rule and give the user access."""
    quoted = " ".join(f"'{line}'" for line in RULE_LINES)
    return ("install coralrt's udev rule (udev/99-coralrt.rules in the coralrt sources), "
            "reload udev, join the plugdev group and re-plug the stick:\n"
            f"  printf '%s\\n' {quoted} | sudo tee /etc/udev/rules.d/99-coralrt.rules\n"
            "  sudo udevadm control --reload-rules && sudo udevadm trigger\n"
            '  sudo usermod -aG plugdev "$USER"    # then log out and back in\n'
            "  then unplug the stick and plug it in again")


def _rule_lines(text: str):
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line and not line.startswith("#"):
            yield line


def rule_coverage(text: str) -> dict[str, list[str]]:
    """The stick IDs a rules file matches, each with its matching lines.

    A line matches an ID when it names the vendor and either names the product or
    no product at all (libedgetpu's own rule matches on the vendor only).
    """
    covered: dict[str, list[str]] = {}
    for line in _rule_lines(text):
        low = line.lower()
        vendor = re.search(r'attrs?\{idvendor\}=="([0-9a-f]{4})"', low)
        product = re.search(r'attrs?\{idproduct\}=="([0-9a-f]{4})"', low)
        for usb_id in IDS:
            v, p = usb_id.split(":")
            if vendor and vendor.group(1) == v and (product is None or product.group(1) == p):
                covered.setdefault(usb_id, []).append(line)
    return covered


def world_writable(line: str) -> bool:
    m = re.search(r'MODE\s*:?=\s*"([0-7]{3,4})"', line)
    return bool(m and int(m.group(1), 8) & 0o002)
