"""``coralrt devices [--json]``: the Coral USB Accelerators that are connected.

Each stick is listed with its device path (``usb:N``, what
``InferenceSession(..., device=...)`` and ``coralrt._usb.open_device`` take),
its mode (``bootloader``: the firmware is not loaded yet, coralrt loads it when
the stick is opened; ``running``: the firmware is loaded), the USB link speed,
the bus and address, and the port path (which stays the same when the stick
re-enumerates after the firmware download).

The hidden option ``--simulated N`` lists N sticks of coralrt's simulated
backend instead of the real USB bus; it exists to demonstrate and test the
output on machines without a stick, and says so in its output.
"""

from __future__ import annotations

import argparse

from coralrt._cli._text import dumps, table, whole_number

__all__ = ["add_parser", "command_devices", "simulated_count", "list_sticks", "device_node",
           "format_devices", "MODE_TEXT", "SIM_HINT"]

MODE_TEXT = {
    "bootloader": "firmware not loaded yet (coralrt loads it when the stick is opened)",
    "running": "firmware loaded",
}
DEV_ROOT = "/dev/bus/usb"


#: argparse type of ``--simulated``: a count of sticks, 0 or more.
simulated_count = whole_number(0)


def add_simulated_option(parser) -> None:
    # Hidden from --help: it is a demonstration and test aid, not a way to use a stick.
    parser.add_argument("--simulated", type=simulated_count, default=None, metavar="N",
                        help=argparse.SUPPRESS)


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "devices", parents=parents, help="list the connected Coral USB Accelerators",
        description="List the Coral USB Accelerators on the USB bus (1a6e:089a before the "
                    "firmware is loaded, 18d1:9302 after) with their device path (usb:N), "
                    "mode, USB speed, bus, address and port path. Exits 0 when none is "
                    "connected.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_simulated_option(p)
    p.set_defaults(func=command_devices)


def simulated_backend(n: int):
    """A simulated USB bus with ``n`` sticks in bootloader mode, as real sticks are plugged in."""
    from coralrt._sim.stick import SimulatedBackend
    return SimulatedBackend(n_devices=n)


def device_node(bus: int, address: int, root: str = DEV_ROOT) -> str:
    """The usbfs node libusb opens on Linux: ``/dev/bus/usb/BBB/DDD``."""
    return f"{root}/{bus:03d}/{address:03d}"


def list_sticks(backend=None) -> list[dict]:
    """:func:`coralrt._usb.list_devices` as dicts with ``device_node`` added."""
    from coralrt._usb import list_devices
    sticks = []
    for info in list_devices(backend):
        d = info.to_dict()
        d["device_node"] = device_node(info.bus, info.address)
        sticks.append(d)
    return sticks


#: Said to someone without a stick: what runs anyway.
SIM_HINT = ("no stick? --target sim (target='sim' in Python) runs models on coralrt's "
            "simulated Edge TPU, with the stick's integer arithmetic and an estimated "
            "latency: coralrt run MODEL --target sim")


def format_devices(sticks: list[dict], *, simulated: bool = False) -> str:
    lines = []
    if simulated:
        lines.append(f"simulated USB bus with {len(sticks)} stick(s) "
                     "(--simulated: no real device was looked for)")
    if not sticks:
        lines.append("no Coral USB Accelerator found (looked for 1a6e:089a and 18d1:9302); "
                     "`coralrt doctor` says what to check")
        lines.append(SIM_HINT)
        return "\n".join(lines)
    rows = [[d["path"], d["mode"], d["usb_speed"], d["bus"], d["address"],
             d["port_path"] or "(unknown)"] for d in sticks]
    lines.append(table(["path", "mode", "speed", "bus", "address", "port"], rows, indent="",
                       right={3, 4}))
    notes = [f"{mode}: {MODE_TEXT[mode]}" for mode in MODE_TEXT
             if any(d["mode"] == mode for d in sticks)]
    if any(d["usb_speed"] in ("usb1", "usb2") for d in sticks):
        notes.append("usb2: a USB 2 link; inference is several times slower than on a USB 3 "
                     "port")
    lines.append("")
    lines.extend(notes)
    return "\n".join(lines)


def command_devices(args, *, backend=None) -> int:
    simulated = args.simulated is not None
    if simulated:
        backend = simulated_backend(args.simulated)
    sticks = list_sticks(backend)
    if args.json:
        print(dumps({"simulated": simulated, "devices": sticks}))
    else:
        print(format_devices(sticks, simulated=simulated))
    return 0
