"""``coralrt doctor [--json]``: is this machine ready to run models on a Coral stick?

Each check returns a :class:`Check` (status ``ok``, ``warn``, ``fail``, ``skip``
or ``info``, what was found, and the exact fix when it is not ``ok``).  The
checks are plain functions of their inputs (device list, folders, paths), so
every branch can be driven with temporary files and simulated sticks.  The
command exits 1 when any check fails, 0 otherwise.

The hidden option ``--simulated N`` takes the sticks from N simulated sticks
instead of the USB bus (a demonstration and test aid); the other checks look
at the real machine.

After the checks comes the "compile paths" section
(:mod:`coralrt._cli.doctor_compile`, ``compile_paths`` in the JSON): how this
machine can compile plain models (native, emulated, remote, or none).  It is
information only and never changes the exit status.
"""

from __future__ import annotations

import getpass
import os
import stat
import sys
from pathlib import Path

from coralrt._cli.devices_cmd import SIM_HINT, DEV_ROOT, add_simulated_option, device_node, \
    simulated_backend
from coralrt._cli.doctor_check import STATUSES, Check
from coralrt._cli.doctor_compile import (compile_paths_report, format_compile_paths,
                                        probe_service)
from coralrt._cli.doctor_software import check_cpu_backends, check_edgetpu_compiler, check_python
from coralrt.errors import CoralRTError, DeviceError
from coralrt._sim import compiled as compiled_kernels
from coralrt._usb import firmware
from coralrt._wheels import has_wheels, platform_name
from coralrt._usb.udev import (  # noqa: F401 - part of this command's API
    IDS, RULE_LINES, RULES_DIRS, install_rule_fix, rule_coverage, world_writable,
)

__all__ = ["Check", "STATUSES", "RULE_LINES", "RULES_DIRS", "add_parser", "command_doctor",
           "run_checks", "load_libusb", "check_libusb", "check_sticks", "check_permissions",
           "check_udev_rule", "check_firmware", "check_cpu_backends", "check_edgetpu_compiler",
           "check_python",
           "rule_coverage", "install_rule_fix", "format_checks"]

# -- 1. libusb ---------------------------------------------------------------------------

def libusb_package_has_wheels(sys_platform: str | None = None,
                              machine: str | None = None) -> bool:
    """Whether ``pip install libusb-package`` can find a wheel for this interpreter;
    elsewhere coralrt._usb uses the system's libusb-1.0 through pyusb."""
    return has_wheels("libusb-package", sys_platform, machine)


def load_libusb():
    """(pyusb backend, description) as coralrt._usb finds it; DeviceError when there is none."""
    import importlib.metadata as md
    reason = ""
    try:
        import libusb_package
        backend = libusb_package.get_libusb1_backend()
        if backend is not None:
            return backend, (f"libusb-1.0 from the libusb-package wheel "
                             f"{md.version('libusb-package')}: {libusb_package.get_library_path()}")
        reason = "libusb-package has no library for this platform"
    except ImportError:
        reason = "libusb-package is not installed"
        if not libusb_package_has_wheels():
            reason += f": it has no wheel for {platform_name()}"
    except Exception as e:  # noqa: BLE001 - reported, then pyusb's own search is tried
        reason = f"libusb-package failed: {e}"
    import usb
    import usb.backend.libusb1
    backend = usb.backend.libusb1.get_backend()
    if backend is None:
        raise DeviceError(f"no libusb-1.0 library could be loaded ({reason}; pyusb "
                          f"{usb.__version__} found none on the system)")
    lib = getattr(getattr(backend, "lib", None), "_name", "libusb-1.0")
    return backend, f"system libusb-1.0 through pyusb {usb.__version__}: {lib} ({reason})"


def check_libusb(load=load_libusb) -> tuple[Check, object]:
    """Check 1: the libusb shared library loads.  Returns the check and the backend (or None)."""
    try:
        backend, found = load()
    except (CoralRTError, OSError, ImportError) as e:
        system = "install the system library: sudo apt install libusb-1.0-0"
        fix = (f"pip install --force-reinstall libusb-package   (its wheel bundles "
               f"libusb-1.0)\nor {system}" if libusb_package_has_wheels() else system)
        return Check("libusb", "fail", str(e), fix), None
    return Check("libusb", "ok", found), backend


# -- 2. sticks ---------------------------------------------------------------------------

def check_sticks(devices, *, error: Exception | None = None, simulated: bool = False) -> Check:
    """Check 2: at least one stick, each on a USB 3 link.  ``devices``: DeviceInfo list."""
    if isinstance(error, ImportError):
        return Check("sticks", "skip", "not listed: no libusb library", "fix the libusb check")
    if error is not None:
        return Check("sticks", "fail", f"could not list USB devices: {error}",
                     "run `coralrt --debug devices` to see the full error")
    if not devices:
        return Check("sticks", "fail",
                     "no Coral USB Accelerator found (looked for 1a6e:089a, bootloader mode, "
                     "and 18d1:9302, running mode)",
                     "plug the stick in with a data cable (the bundled one) and check that "
                     "`lsusb` lists 1a6e:089a or 18d1:9302;\nit draws up to 900 mA: if it "
                     "does not appear or drops off, use a powered USB hub;\nin a VM or "
                     "container pass the whole USB bus or both IDs through (the stick changes "
                     "ID after its firmware loads)")
    kind = "simulated " if simulated else ""
    found = "; ".join(f"{d.path} {kind}{d.mode} {d.usb_speed} at "
                      f"{d.port_path or f'bus {d.bus} address {d.address}'}" for d in devices)
    slow = [d.path for d in devices if d.usb_speed in ("usb1", "usb2")]
    if slow:
        return Check("sticks", "warn", f"{len(devices)} found: {found}",
                     f"{', '.join(slow)} run(s) on a USB 2 link, several times slower than "
                     "USB 3 (MobileNet v2: 58.1 ms on USB 2, 18.2 ms on USB 3 in a published "
                     "measurement): plug into a USB 3 port (blue on a Raspberry Pi 4/5) with "
                     "the bundled cable")
    return Check("sticks", "ok", f"{len(devices)} found: {found}")


# -- 3. permissions ----------------------------------------------------------------------

def _mode_allows_rw(st: os.stat_result, uid: int, groups: set[int]) -> bool:
    if uid == 0:
        return True
    mode = st.st_mode
    if st.st_uid == uid:
        return bool(mode & stat.S_IRUSR and mode & stat.S_IWUSR)
    if st.st_gid in groups:
        return bool(mode & stat.S_IRGRP and mode & stat.S_IWGRP)
    return bool(mode & stat.S_IROTH and mode & stat.S_IWOTH)


def _group_name(gid: int) -> str:
    try:
        import grp
        return grp.getgrgid(gid).gr_name
    except (ImportError, KeyError):
        return str(gid)


def _plugdev_state(groups: set[int]) -> str:
    """"member", "pending" (in /etc/group but not in this login) or "no"."""
    try:
        import grp
        entry = grp.getgrnam("plugdev")
    except (ImportError, KeyError):
        return "no"
    if entry.gr_gid in groups:
        return "member"
    return "pending" if getpass.getuser() in entry.gr_mem else "no"


def check_permissions(devices, *, dev_root: str = DEV_ROOT, platform_name: str = sys.platform,
                      uid: int | None = None, groups=None, simulated: bool = False) -> Check:
    """Check 3: the user can read and write each stick's ``/dev/bus/usb/BBB/DDD``.

    ``uid``/``groups`` None: ask the kernel for this process (``os.access``, which
    also honours the ACL that ``TAG+="uaccess"`` adds); given: judge by the mode bits.
    """
    if not platform_name.startswith("linux"):
        return Check("permissions", "skip", f"not checked on {platform_name}")
    if simulated:
        return Check("permissions", "skip", "simulated sticks have no device node")
    if not devices:
        return Check("permissions", "skip", "no stick to check")
    gids = set(os.getgroups()) | {os.getgid()} if groups is None else set(groups)
    denied, missing, fine = [], [], []
    for d in devices:
        node = device_node(d.bus, d.address, dev_root)
        try:
            st = os.stat(node)
        except FileNotFoundError:
            missing.append(f"{d.path}: {node} does not exist")
            continue
        ok = os.access(node, os.R_OK | os.W_OK) if uid is None else \
            _mode_allows_rw(st, uid, gids)
        owner = f"{_group_name(st.st_gid)} {stat.filemode(st.st_mode)}"
        (fine if ok else denied).append((d.path, node, owner, _group_name(st.st_gid)))
    if missing:
        return Check("permissions", "fail", "; ".join(missing),
                     "the USB device nodes are not visible: in a container pass the bus "
                     "through (docker run --device /dev/bus/usb ...), outside one check that "
                     "udev is running; the node changes when the stick re-enumerates")
    if denied:
        found = "; ".join(f"{p}: {n} (group {o}) is not readable and writable by this user"
                          for p, n, o, _ in denied)
        if all(g == "plugdev" for *_, g in denied):
            state = _plugdev_state(gids)
            if state == "pending":
                return Check("permissions", "fail", found,
                             "you are in the plugdev group but this login started before: "
                             "log out and back in (or run `newgrp plugdev`)")
            if state == "no":
                return Check("permissions", "fail", found,
                             'join the plugdev group: sudo usermod -aG plugdev "$USER", then '
                             "log out and back in")
            # A plugdev member without access: the mode is wrong, another rule overrides.
        return Check("permissions", "fail", found, install_rule_fix())
    return Check("permissions", "ok", "; ".join(f"{p}: {n} ({o}) is readable and writable"
                                                for p, n, o, _ in fine))


# -- 4. udev rule ------------------------------------------------------------------------

def check_udev_rule(rules_dirs=RULES_DIRS, *, platform_name: str = sys.platform) -> Check:
    """Check 4: a rules file in ``rules_dirs`` covers both 1a6e:089a and 18d1:9302."""
    if not platform_name.startswith("linux"):
        return Check("udev rule", "skip", f"udev is Linux only; not checked on {platform_name}")
    seen: set[str] = set()
    files: dict[str, dict[str, list[str]]] = {}
    for folder in rules_dirs:
        try:
            names = sorted(p.name for p in Path(folder).glob("*.rules"))
        except OSError:
            continue
        for name in names:
            if name in seen:
                continue  # shadowed by the file of the same name in an earlier folder
            seen.add(name)
            try:
                text = (Path(folder) / name).read_text(errors="replace")
            except OSError:
                continue
            cov = rule_coverage(text)
            if cov:
                files[str(Path(folder) / name)] = cov
    covered = {i for cov in files.values() for i in cov}
    if covered != set(IDS):
        missing = ", ".join(f"{i} ({IDS[i]} mode)" for i in IDS if i not in covered)
        where = (f"{', '.join(files)} cover(s) only {', '.join(sorted(covered))}" if files else
                 f"no rules file in {', '.join(map(str, rules_dirs))} mentions the stick")
        return Check("udev rule", "fail", f"{where}; missing: {missing}", install_rule_fix())
    chosen = list(files)
    found = f"{', '.join(chosen)} cover(s) 1a6e:089a and 18d1:9302"
    loose = [f for f in chosen for lines in files[f].values() for ln in lines
             if world_writable(ln)]
    if loose:
        return Check("udev rule", "warn", found + f"; {loose[0]} makes the stick "
                     "world-writable (any local user can use it)",
                     "replace it with coralrt's rule, which uses the plugdev group and "
                     "uaccess instead:\n" + install_rule_fix().split(":\n", 1)[1])
    return Check("udev rule", "ok", found)


# -- 5. firmware -------------------------------------------------------------------------

def check_firmware(devices, *, path: str | os.PathLike | None = None) -> Check:
    """Check 5: the firmware image is installed, or every stick already runs."""
    path = Path(firmware.installed_path() if path is None else path)
    how = (f"{firmware.SOURCE_TEXT}. Install it with:\n  coralrt firmware install "
           f"{firmware.FIRMWARE_URL}\n(or give the path of a downloaded copy instead of the URL)")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = None
    except OSError as e:
        return Check("firmware", "fail", f"cannot read {path}: {e.strerror or e}", how)
    if data is not None:
        digest = firmware.sha256(data)
        if digest == firmware.FIRMWARE_SHA256:
            return Check("firmware", "ok", f"{firmware.FIRMWARE_NAME} installed in {path} "
                                           "(sha256 matches)")
        return Check("firmware", "fail", f"{path} is not {firmware.FIRMWARE_NAME}: sha256 "
                                         f"{digest}, expected {firmware.FIRMWARE_SHA256}", how)
    found = f"{firmware.FIRMWARE_NAME} is not installed ({path} is missing)"
    if devices and all(d.mode == "running" for d in devices):
        return Check("firmware", "warn",
                     found + "; not needed now, every stick is running, but a stick starts "
                     "in bootloader mode again after it is unplugged or the host restarts",
                     how)
    boot = [d.path for d in devices if d.mode == "bootloader"]
    if boot:
        found += f"; {', '.join(boot)} in bootloader mode cannot be opened without it"
    return Check("firmware", "fail", found, how)


# -- the command -------------------------------------------------------------------------

def run_checks(*, backend=None, simulated: bool = False, load=load_libusb,
               rules_dirs=RULES_DIRS, dev_root: str = DEV_ROOT, firmware_path=None,
               cpu_backends=None, find_compiler=None,
               platform_name: str = sys.platform) -> list[Check]:
    """Every check in order.  ``backend``: a pyusb backend to list sticks on (None:
    libusb); ``cpu_backends`` and ``find_compiler`` replace the software lookups."""
    from coralrt._usb import list_devices
    lib_check, lib_backend = check_libusb(load)
    devices, error = [], None
    usb_backend = backend if backend is not None else lib_backend
    if usb_backend is None:
        error = ImportError("no libusb library")
    else:
        try:
            devices = list_devices(usb_backend)
        except (CoralRTError, OSError) as e:
            error = e
    return [lib_check,
            check_sticks(devices, error=error, simulated=simulated),
            check_permissions(devices, dev_root=dev_root, platform_name=platform_name,
                              simulated=simulated),
            check_udev_rule(rules_dirs, platform_name=platform_name),
            check_firmware(devices, path=firmware_path),
            *check_cpu_backends(cpu_backends),
            check_edgetpu_compiler(find_compiler),
            check_python(),
            Check("kernels", "info", compiled_kernels.summary())]


def format_checks(checks: list[Check]) -> str:
    width = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status:<5} {c.name:<{width}}  {c.found}")
        if c.fix:
            pad = " " * (6 + width + 2)
            fix_lines = c.fix.splitlines()
            lines.append(f"{pad}fix: {fix_lines[0]}")
            lines.extend(f"{pad}     {ln}" for ln in fix_lines[1:])
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    lines.append("")
    lines.append(f"{failed} check{'s' if failed != 1 else ''} failed, {warned} "
                 f"warning{'s' if warned != 1 else ''}")
    return "\n".join(lines)


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "doctor", parents=parents, help="check that this machine can use a Coral stick",
        description="Check the libusb library, the connected sticks, their device "
                    "permissions, the udev rule, the firmware, the CPU backends (which are "
                    "installed and usable, and why not), edgetpu_compiler and the Python "
                    "and NumPy versions, and print the fix for each problem; then list the "
                    "ways this machine can compile plain models (native, under an x86-64 "
                    "emulator, a compile service, or none: information only). Exits 1 when "
                    "a check fails.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_simulated_option(p)
    p.set_defaults(func=command_doctor)


def command_doctor(args, **overrides) -> int:
    simulated = args.simulated is not None
    if simulated:
        overrides.setdefault("backend", simulated_backend(args.simulated))
    checks = run_checks(simulated=simulated, **overrides)
    failed = any(c.status == "fail" for c in checks)
    # Information only: no compile path is not a failure (compiled models need none).
    paths = compile_paths_report(overrides.get("find_compiler"), probe=probe_service)
    if args.json:
        from coralrt._cli._text import dumps
        print(dumps({"ok": not failed, "simulated": simulated,
                     "checks": [c.to_dict() for c in checks], "compile_paths": paths}))
    else:
        if simulated:
            print(f"sticks from a simulated USB bus with {args.simulated} stick(s) "
                  "(--simulated); the other checks look at this machine\n")
        print(format_checks(checks))
        if any(c.name == "sticks" and c.status != "ok" and "found:" not in c.found
               for c in checks):
            print(SIM_HINT)
        print()
        print(format_compile_paths(paths))
    return 1 if failed else 0
