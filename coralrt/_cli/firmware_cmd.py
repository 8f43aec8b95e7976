"""``coralrt firmware install PATH_OR_URL|info``: the stick's firmware image.

The image is Google's ``apex_latest_single_ep.bin`` (libedgetpu repository,
Apache-2.0); coralrt does not ship it.  ``install`` checks the pinned sha256
and stores it in the user data directory; ``info`` says what is expected,
where it is (or would be) installed, and which sticks are connected.
"""

from __future__ import annotations

from coralrt._cli._text import dumps, table
from coralrt.errors import DeviceError
from coralrt._usb import firmware

__all__ = ["add_parser", "command_install", "command_info", "firmware_info"]


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "firmware", parents=parents, help="install or describe the USB stick's firmware",
        description="A Coral USB Accelerator starts in bootloader mode and needs Google's "
                    f"firmware image ({firmware.FIRMWARE_NAME}), which coralrt does not "
                    f"ship. {firmware.SOURCE_TEXT}.")
    actions = p.add_subparsers(dest="firmware_command", metavar="ACTION", title="actions")
    actions.required = True
    install = actions.add_parser(
        "install", parents=parents, help="check and install a firmware image",
        description="Read the image from a file or a URL, check its sha256 against "
                    f"{firmware.FIRMWARE_SHA256} and store it in the user data directory. "
                    f"For example: coralrt firmware install {firmware.FIRMWARE_URL}")
    install.add_argument("source", metavar="PATH_OR_URL",
                         help="a downloaded copy of the image, or an http(s) URL")
    install.set_defaults(func=command_install)
    info = actions.add_parser(
        "info", parents=parents, help="expected image, install location, connected sticks",
        description="Print the expected image name and sha256, where it is installed and "
                    "whether it is valid, and the sticks that are connected.")
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=command_info)


def command_install(args) -> int:
    path = firmware.install(args.source)
    print(f"installed {firmware.FIRMWARE_NAME} (sha256 {firmware.FIRMWARE_SHA256}) in {path}")
    return 0


def firmware_info(*, backend=None) -> dict:
    path = firmware.installed_path()
    state = "missing"
    if path.is_file():
        state = "valid" if firmware.sha256(path.read_bytes()) == firmware.FIRMWARE_SHA256 \
            else "checksum mismatch"
    info = {"name": firmware.FIRMWARE_NAME, "sha256": firmware.FIRMWARE_SHA256,
            "size": firmware.FIRMWARE_SIZE, "path": str(path), "installed": state,
            "source": firmware.FIRMWARE_URL, "devices": [], "devices_error": None}
    try:
        from coralrt._usb import list_devices
        info["devices"] = [d.to_dict() for d in list_devices(backend)]
    except DeviceError as e:
        info["devices_error"] = str(e)
    return info


def command_info(args, *, backend=None) -> int:
    info = firmware_info(backend=backend)
    if args.json:
        print(dumps(info))
        return 0
    rows = [["image", info["name"]], ["sha256", info["sha256"]],
            ["size", f"{info['size']:,} bytes"], ["installed", info["installed"]],
            ["path", info["path"]], ["source", info["source"]]]
    print(table(None, rows, indent=""))
    if info["installed"] != "valid":
        print(f"\nto install it: coralrt firmware install {firmware.FIRMWARE_URL}")
    if info["devices_error"]:
        print(f"\ndevices: {info['devices_error']}")
    elif not info["devices"]:
        print("\ndevices: no Coral USB Accelerator connected")
    else:
        print()
        print(table(["path", "mode", "port", "speed"],
                    [[d["path"], d["mode"], d["port_path"] or "-", d["usb_speed"]]
                     for d in info["devices"]], indent=""))
    return 0
