"""The stick's firmware: Google's image, pinned by checksum, installed by the user.

A Coral USB Accelerator starts in bootloader mode (1a6e:089a) and needs a
firmware download before it runs (18d1:9302).  The image is Google's
``apex_latest_single_ep.bin`` from the libedgetpu repository
(``driver/usb/``, Apache-2.0); coralrt does not ship it.  ``coralrt firmware
install PATH_OR_URL`` checks its sha256 against the pinned value and stores it
in the user data directory, where :func:`load_installed` finds it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.parse
import urllib.request
from pathlib import Path

from coralrt import _config as config
from coralrt.errors import FirmwareError
from coralrt._fileio import atomic_write

__all__ = ["FIRMWARE_NAME", "FIRMWARE_SHA256", "FIRMWARE_SIZE", "FIRMWARE_URL", "SOURCE_TEXT",
           "firmware_dir", "installed_path", "install", "load_installed", "load_image",
           "missing_message", "sha256"]

log = logging.getLogger("coralrt.usb")

FIRMWARE_NAME = "apex_latest_single_ep.bin"
FIRMWARE_SHA256 = "3b07311b174b81fd14fd2c887f40d646c0ebf2f140cc5ee5cf8befa0f3e3dc7f"
FIRMWARE_SIZE = 10783
FIRMWARE_URL = ("https://raw.githubusercontent.com/google-coral/libedgetpu/master/"
                "driver/usb/apex_latest_single_ep.bin")
SOURCE_TEXT = ("Google publishes it in the libedgetpu repository "
               "(https://github.com/google-coral/libedgetpu, file driver/usb/" + FIRMWARE_NAME
               + ", Apache-2.0)")
_MAX_DOWNLOAD = 1 << 20


def sha256(data) -> str:
    return hashlib.sha256(data).hexdigest()


def firmware_dir() -> Path:
    """``platformdirs.user_data_dir("coralrt")/firmware`` (:func:`coralrt._config.firmware_dir`)."""
    return config.firmware_dir()


def installed_path() -> Path:
    return firmware_dir() / FIRMWARE_NAME


def missing_message() -> str:
    return (f"the stick is in bootloader mode (1a6e:089a) and needs its firmware, "
            f"{FIRMWARE_NAME} (sha256 {FIRMWARE_SHA256}), which coralrt does not ship and "
            f"which is not installed ({installed_path()} is missing). {SOURCE_TEXT}. "
            f"Install it with: coralrt firmware install {FIRMWARE_URL} "
            f"(or give the path of a downloaded copy instead of the URL)")


def _read_source(source: str | os.PathLike) -> bytes:
    text = os.fspath(source)
    scheme = urllib.parse.urlparse(text).scheme if isinstance(text, str) else ""
    if scheme in ("http", "https", "file", "ftp"):
        try:
            with urllib.request.urlopen(text, timeout=30) as resp:  # noqa: S310 - user's URL
                data = resp.read(_MAX_DOWNLOAD + 1)
        except OSError as e:
            raise FirmwareError(f"could not download the firmware from {text}: {e}") from e
        if len(data) > _MAX_DOWNLOAD:
            raise FirmwareError(f"{text} is larger than {_MAX_DOWNLOAD} bytes: not the "
                                f"{FIRMWARE_NAME} image")
        return data
    try:
        return Path(text).read_bytes()
    except OSError as e:
        raise FirmwareError(f"could not read the firmware file {text}: "
                            f"{e.strerror or e}") from e


def verify(data: bytes, *, what: str) -> None:
    digest = sha256(data)
    if digest != FIRMWARE_SHA256:
        raise FirmwareError(
            f"{what} is not {FIRMWARE_NAME}: its sha256 is {digest} ({len(data)} bytes) but "
            f"coralrt expects {FIRMWARE_SHA256} ({FIRMWARE_SIZE} bytes). {SOURCE_TEXT}")


def install(source: str | os.PathLike) -> Path:
    """Read ``source`` (a path or URL), check the pinned sha256, store it; the stored path."""
    data = _read_source(source)
    verify(data, what=os.fspath(source))
    target = installed_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, data)
    log.info("firmware %s installed in %s", FIRMWARE_NAME, target)
    return target


def load_installed() -> bytes:
    """The installed image, verified; FirmwareError saying how to get it when absent."""
    path = installed_path()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FirmwareError(missing_message()) from None
    except OSError as e:
        raise FirmwareError(f"cannot read the installed firmware {path}: {e}") from e
    verify(data, what=str(path))
    return data


def load_image(firmware) -> bytes:
    """Firmware for a download: ``None`` the installed image; bytes or a path as given.

    An image given explicitly is used even when its checksum differs from the pinned
    one (as libedgetpu's ``dfu_firmware`` option allows), with a warning.
    """
    if firmware is None:
        return load_installed()
    if isinstance(firmware, (bytes, bytearray, memoryview)):
        data = bytes(firmware)
    else:
        data = _read_source(firmware)
    if not data:
        raise FirmwareError("the firmware image is empty")
    if sha256(data) != FIRMWARE_SHA256:
        log.warning("firmware image (%d bytes, sha256 %s) is not the pinned %s", len(data),
                    sha256(data), FIRMWARE_NAME)
    return data
