"""``coralrt selftest``: check a Coral USB Accelerator end to end (docs/hardware-validation.md).

Exit status: 0 when no check failed, 1 when one failed, 2 when no stick was
found (one line on stdout says so).  ``--simulated`` runs the sequence
against a simulated stick in bootloader mode: the USB checks run for real,
and every check that needs the chip to execute Google's Edge TPU programs is
skipped with that reason.
"""

from __future__ import annotations

from pathlib import Path

from coralrt._cli._text import dumps
from coralrt._cli.run_cmd import count_type
from coralrt.errors import DeviceNotFoundError
from coralrt._fileio import atomic_write

__all__ = ["add_parser", "command_selftest", "EXIT_NO_STICK"]

EXIT_NO_STICK = 2


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "selftest", parents=parents, help="check a Coral USB Accelerator end to end",
        description="Check a Coral USB Accelerator: enumeration in both modes, firmware "
                    "download, re-enumeration at the same port, bring-up, register "
                    "read-back against libedgetpu's open trace, USB speed, parameter "
                    "caching, Coral's compiled test models (first-run and warm latency) and, "
                    "when libedgetpu is installed, the same models through LiteRT with the "
                    "Edge TPU delegate, compared bit for bit. Exits 0 when no check failed, "
                    "1 when one did, 2 when no stick is connected.")
    p.add_argument("--device", metavar="PATH", default=None,
                   help="the stick to test: usb:N or a port path (default: the first one)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--models", metavar="DIR", type=Path, default=None,
                     help="take the test models from DIR (or DIR/edgetpu)")
    src.add_argument("--download", action="store_true",
                     help="download the missing test models from google-coral/test_data into "
                          "the user cache folder (checked against pinned SHA-256 values)")
    p.add_argument("--repeat", type=count_type(1), default=10, metavar="N",
                   help="warm runs per model; the median is reported (default 10)")
    p.add_argument("--json", metavar="FILE", type=Path, default=None,
                   help="also write the full report (versions, host, USB topology, every "
                        "check and its measurements) to FILE")
    p.add_argument("--simulated", action="store_true",
                   help="run against a simulated stick (a demonstration: checks that need "
                        "the chip are skipped)")
    p.set_defaults(func=command_selftest)


def _write(path: Path, obj: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, dumps(obj) + "\n")


def command_selftest(args, **overrides) -> int:
    from coralrt._selftest import run_selftest
    try:
        report = run_selftest(device=args.device, simulated=args.simulated,
                              models_dir=args.models, download=args.download,
                              repeat=args.repeat, **overrides)
    except DeviceNotFoundError as e:
        print(" ".join(str(e).split()))
        if args.json is not None:
            _write(args.json, {"coralrt": "selftest", "simulated": args.simulated,
                               "stick_found": False, "error": str(e), "checks": []})
        return EXIT_NO_STICK
    print(report.summary())
    if args.json is not None:
        _write(args.json, report.to_dict())
        print(f"report written to {args.json}")
    return report.exit_status
