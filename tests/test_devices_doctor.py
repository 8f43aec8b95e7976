"""``coralrt devices`` and ``coralrt doctor``, and the udev rule they recommend.

No real stick is attached here: sticks come from the simulated USB backend, the
device nodes, rules folders and firmware file are temporary files.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re

import pytest
from conftest import REPO_ROOT

from coralrt._cli import doctor_cmd as D
from coralrt._cli.devices_cmd import device_node
from coralrt._cli.main import main
from coralrt.errors import BackendUnavailableError, DeviceError
from coralrt._usb import firmware, list_devices
from coralrt._usb.discovery import DeviceInfo
from coralrt.testing import SimulatedBackend

RULES_FILE = REPO_ROOT / "udev" / "99-coralrt.rules"
IMAGE = b"\x5a" * 4096  # stands in for the firmware image; tests pin its sha256


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def stick(path="usb:0", mode="running", bus=2, address=4, speed="usb3"):
    return DeviceInfo(path, mode, bus, address, f"/sys/bus/usb/devices/{bus}-1", speed)


def rules_dir(tmp_path, name="99-coralrt.rules", text=None, folder="etc"):
    d = tmp_path / folder
    d.mkdir(exist_ok=True)
    (d / name).write_text(RULES_FILE.read_text() if text is None else text)
    return d


# -- the rule shipped in udev/ -------------------------------------------------------------

def _rule_fields(line: str) -> dict[str, str]:
    return {k: v for k, v in re.findall(r'([A-Za-z_]+(?:\{[A-Za-z_]+\})?\+?)=?="([^"]*)"', line)}


def test_repo_rule_covers_both_ids_with_plugdev_uaccess_and_no_world_write():
    lines = [ln.strip() for ln in RULES_FILE.read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    seen = set()
    for line in lines:
        f = _rule_fields(line)
        assert f["SUBSYSTEM"] == "usb", line
        assert f["GROUP"] == "plugdev", line
        assert f["TAG+"] == "uaccess", line
        if "MODE" in f:
            assert int(f["MODE"], 8) & 0o002 == 0, f"{line}: MODE lets others write"
        seen.add(f"{f['ATTRS{idVendor}']}:{f['ATTRS{idProduct}']}")
    assert seen == {"1a6e:089a", "18d1:9302"}


def test_printed_rule_is_the_shipped_rule():
    lines = [ln for ln in RULES_FILE.read_text().splitlines() if ln and not ln.startswith("#")]
    assert list(D.RULE_LINES) == lines
    assert all(line in D.install_rule_fix() for line in lines)


# -- rule parsing and check 4 ----------------------------------------------------------------

def test_rule_coverage_product_vendor_only_comments_and_continuations():
    text = ('# SUBSYSTEM=="usb", ATTRS{idVendor}=="18d1", ATTRS{idProduct}=="9302"\n'
            'SUBSYSTEM=="usb",ATTRS{idVendor}=="1a6e",GROUP="plugdev"\n'
            'SUBSYSTEM=="usb", ATTRS{idVendor}=="18d1", \\\n  ATTRS{idProduct}=="4ee7"\n')
    assert set(D.rule_coverage(text)) == {"1a6e:089a"}  # vendor only: any product
    text += 'SUBSYSTEM=="usb", ATTRS{idVendor}=="18d1", \\\n  ATTRS{idProduct}=="9302"\n'
    assert set(D.rule_coverage(text)) == {"1a6e:089a", "18d1:9302"}


def test_udev_rule_ok_with_the_shipped_rule(tmp_path):
    c = D.check_udev_rule([rules_dir(tmp_path)], platform_name="linux")
    assert c.status == "ok" and "99-coralrt.rules" in c.found and not c.fix


def test_udev_rule_missing_fails_with_the_install_commands(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "50-other.rules").write_text('SUBSYSTEM=="usb", ATTRS{idVendor}=="046d"\n')
    c = D.check_udev_rule([tmp_path / "etc", tmp_path / "absent"], platform_name="linux")
    assert c.status == "fail" and "1a6e:089a" in c.found and "18d1:9302" in c.found
    for part in ("99-coralrt.rules", "udevadm control --reload-rules", "usermod -aG plugdev"):
        assert part in c.fix


def test_udev_rule_covering_only_running_mode_fails(tmp_path):
    d = rules_dir(tmp_path, "60-google.rules",
                  'SUBSYSTEM=="usb", ATTRS{idVendor}=="18d1", ATTRS{idProduct}=="9302", '
                  'GROUP="plugdev"\n')
    c = D.check_udev_rule([d], platform_name="linux")
    assert c.status == "fail" and "missing: 1a6e:089a" in c.found


def test_udev_rule_split_over_two_files_is_ok(tmp_path):
    a, b = D.RULE_LINES
    d = rules_dir(tmp_path, "70-a.rules", a + "\n")
    rules_dir(tmp_path, "71-b.rules", b + "\n")
    assert D.check_udev_rule([d], platform_name="linux").status == "ok"


def test_world_writable_rule_warns(tmp_path):
    d = rules_dir(tmp_path, "71-edgetpu.rules",
                  'SUBSYSTEM=="usb", ATTRS{idVendor}=="1a6e", MODE="0666"\n'
                  'SUBSYSTEM=="usb", ATTRS{idVendor}=="18d1", MODE="0666"\n')
    c = D.check_udev_rule([d], platform_name="linux")
    assert c.status == "warn" and "world-writable" in c.found and "plugdev" in c.fix


def test_rule_shadowed_by_a_file_of_the_same_name_in_etc_does_not_count(tmp_path):
    lib = rules_dir(tmp_path, folder="lib")
    etc = rules_dir(tmp_path, text="# disabled\n", folder="etc")
    assert D.check_udev_rule([etc, lib], platform_name="linux").status == "fail"
    assert D.check_udev_rule([lib], platform_name="linux").status == "ok"


def test_udev_rule_skipped_off_linux(tmp_path):
    assert D.check_udev_rule([tmp_path], platform_name="darwin").status == "skip"


# -- check 3: permissions --------------------------------------------------------------------

def node(tmp_path, mode, bus=2, address=4):
    path = tmp_path / f"{bus:03d}" / f"{address:03d}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    path.chmod(mode)
    return path


def test_device_node_path():
    assert device_node(2, 4) == "/dev/bus/usb/002/004"
    assert device_node(1, 117, "/x") == "/x/001/117"


@pytest.mark.parametrize("mode, in_group, ok", [
    (0o660, True, True), (0o660, False, False), (0o664, False, False), (0o666, False, True),
    (0o640, True, False),
])
def test_permissions_by_mode_bits(tmp_path, mode, in_group, ok):
    p = node(tmp_path, mode)
    other_uid = os.getuid() + 4242  # not the owner, not root
    groups = {p.stat().st_gid} if in_group else set()
    c = D.check_permissions([stick()], dev_root=str(tmp_path), platform_name="linux",
                            uid=other_uid, groups=groups)
    assert c.status == ("ok" if ok else "fail"), c
    assert str(p) in c.found
    if not ok:
        assert "not readable and writable" in c.found and c.fix


def test_permissions_for_this_process_use_the_kernel(tmp_path):
    node(tmp_path, 0o600)  # owned by the test's own user
    c = D.check_permissions([stick()], dev_root=str(tmp_path), platform_name="linux")
    assert c.status == "ok"


def test_permission_denied_outside_plugdev_gives_the_rule_fix(tmp_path):
    p = node(tmp_path, 0o664)
    c = D.check_permissions([stick()], dev_root=str(tmp_path), platform_name="linux",
                            uid=os.getuid() + 4242, groups=set())
    if D._group_name(p.stat().st_gid) == "plugdev":
        pytest.skip("temporary files belong to the plugdev group here")
    assert c.status == "fail" and "99-coralrt.rules" in c.fix and "udevadm trigger" in c.fix


def test_permission_denied_on_a_plugdev_node_says_join_plugdev(tmp_path):
    grp = pytest.importorskip("grp")
    try:
        gid = grp.getgrnam("plugdev").gr_gid
    except KeyError:
        pytest.skip("no plugdev group on this machine")
    p = node(tmp_path, 0o660)
    try:
        os.chown(p, -1, gid)
    except PermissionError:
        pytest.skip("cannot give the test node to the plugdev group")
    c = D.check_permissions([stick()], dev_root=str(tmp_path), platform_name="linux",
                            uid=os.getuid() + 4242, groups=set())
    assert c.status == "fail" and "usermod -aG plugdev" in c.fix and "udevadm" not in c.fix
    # A plugdev member who still cannot write: the node's mode is wrong, reinstall the rule.
    p.chmod(0o640)
    c = D.check_permissions([stick()], dev_root=str(tmp_path), platform_name="linux",
                            uid=os.getuid() + 4242, groups={gid})
    assert c.status == "fail" and "udevadm" in c.fix


def test_missing_device_node_fails(tmp_path):
    c = D.check_permissions([stick()], dev_root=str(tmp_path), platform_name="linux")
    assert c.status == "fail" and "does not exist" in c.found and "/dev/bus/usb" in c.fix


@pytest.mark.parametrize("kwargs, devices", [
    ({"platform_name": "win32"}, [stick()]), ({"simulated": True}, [stick()]), ({}, []),
])
def test_permissions_skipped(tmp_path, kwargs, devices):
    kwargs.setdefault("platform_name", "linux")
    assert D.check_permissions(devices, dev_root=str(tmp_path), **kwargs).status == "skip"


# -- checks 1, 2, 5, 6, 7 --------------------------------------------------------------------

def test_libusb_loads_here_and_failure_has_a_fix():
    c, backend = D.check_libusb()
    assert c.status == "ok" and "libusb" in c.found and backend is not None
    if importlib.util.find_spec("libusb_package") is None:   # as in make test-nolitert
        assert c.found.startswith("system libusb-1.0 through pyusb"), c.found

    def broken():
        raise DeviceError("no libusb-1.0 library could be loaded")
    c, backend = D.check_libusb(broken)
    assert c.status == "fail" and backend is None and "libusb-package" in c.fix


def test_sticks_none_present_usb2_and_usb3():
    none = D.check_sticks(list_devices(SimulatedBackend(n_devices=0)))
    assert none.status == "fail" and "lsusb" in none.fix
    slow = D.check_sticks(list_devices(SimulatedBackend(n_devices=1, usb_speed="usb2")))
    assert slow.status == "warn" and "USB 3 port" in slow.fix and "usb:0" in slow.fix
    fast = D.check_sticks(list_devices(SimulatedBackend(n_devices=2)), simulated=True)
    assert fast.status == "ok" and "2 found" in fast.found and "simulated" in fast.found
    err = D.check_sticks([], error=DeviceError("listing USB devices failed"))
    assert err.status == "fail" and "listing USB devices failed" in err.found


def test_firmware_check_branches(tmp_path, monkeypatch):
    path = tmp_path / firmware.FIRMWARE_NAME
    boot, running = stick(mode="bootloader"), stick(mode="running")
    c = D.check_firmware([boot], path=path)
    assert c.status == "fail" and "usb:0" in c.found and "coralrt firmware install" in c.fix
    assert firmware.FIRMWARE_URL in c.fix
    assert D.check_firmware([], path=path).status == "fail"
    c = D.check_firmware([running], path=path)
    assert c.status == "warn" and "every stick is running" in c.found and c.fix
    path.write_bytes(IMAGE)
    c = D.check_firmware([boot], path=path)
    assert c.status == "fail" and "sha256" in c.found
    monkeypatch.setattr(firmware, "FIRMWARE_SHA256", hashlib.sha256(IMAGE).hexdigest())
    c = D.check_firmware([boot], path=path)
    assert c.status == "ok" and not c.fix


@pytest.mark.needs_litert
def test_cpu_backends_and_versions():
    checks = D.check_cpu_backends()
    by_name = {c.name: c for c in checks}
    assert by_name["CPU backend litert"].status == "ok"
    assert "used by default" in by_name["CPU backend litert"].found
    tfl = by_name["CPU backend tflite_runtime"]
    if tfl.status != "ok":   # installed only where its wheels exist (Python <= 3.11)
        assert tfl.status == "info" and "tflite" in tfl.found

    def none_usable():
        return [{"name": "litert", "usable": False, "version": None,
                 "reason": "CPU backend 'litert' is not installed"},
                {"name": "tflite_runtime", "usable": False, "version": None,
                 "reason": "no wheels for Python 3.12 or newer"}]
    checks = D.check_cpu_backends(none_usable)
    assert [c.status for c in checks] == ["fail", "fail"]
    assert all("pip install ai-edge-litert" in c.fix for c in checks)
    assert "Python 3.12" in checks[1].found
    import numpy as np
    v = D.check_python()
    assert v.status == "info" and np.__version__ in v.found


def test_tflite_runtime_error_says_when_it_cannot_be_installed(monkeypatch):
    import importlib.util
    import sys
    from coralrt._backends import litert
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tflite_runtime" else real(name, *a))
    monkeypatch.setattr(litert, "NO_TFLITE_RUNTIME_WHEELS", sys.version_info[:2])
    with pytest.raises(BackendUnavailableError) as e:
        litert.TFLiteRuntimeBackend()
    assert "no wheels for Python 3.12 or newer" in str(e.value)
    assert "installs nothing" in str(e.value) and "ai-edge-litert" in str(e.value)
    monkeypatch.setattr(litert, "NO_TFLITE_RUNTIME_WHEELS", (99, 0))
    with pytest.raises(BackendUnavailableError) as e:
        litert.TFLiteRuntimeBackend()
    assert "pip install tflite-runtime 'numpy<2'" in str(e.value)


def test_edgetpu_compiler_check(tmp_path):
    c = D.check_edgetpu_compiler(lambda: None, machine="x86_64")
    assert c.status == "info" and "not found" in c.found
    c = D.check_edgetpu_compiler(lambda: None, machine="aarch64")
    assert c.status == "info" and "no build for aarch64" in c.found and "compile service" in c.found
    fake = tmp_path / "edgetpu_compiler"
    c = D.check_edgetpu_compiler(lambda: fake, version=lambda p: "16.0.384591198")
    assert c.status == "ok" and "16.0.384591198" in c.found and str(fake) in c.found

    def broken(p):
        raise OSError(8, "Exec format error")
    c = D.check_edgetpu_compiler(lambda: fake, version=broken)
    assert c.status == "warn" and "Exec format error" in c.found


def test_check_status_is_validated():
    with pytest.raises(ValueError):
        D.Check("x", "fine", "")


# -- the commands ----------------------------------------------------------------------------

def test_help_lists_the_commands_and_hides_simulated(capsys):
    code, out, _ = cli(capsys, "--help")
    assert code == 0 and "devices" in out and "doctor" in out
    for command in ("devices", "doctor"):
        code, out, _ = cli(capsys, command, "--help")
        assert code == 0 and "--json" in out and "--simulated" not in out


def test_devices_simulated_text_and_json(capsys):
    code, out, _ = cli(capsys, "devices", "--simulated", "2")
    assert code == 0 and "simulated" in out
    assert re.search(r"usb:0\s+bootloader\s+usb3\s+2\s+4\s+/sys/bus/usb/devices/2-1", out)
    assert "usb:1" in out and "firmware not loaded yet" in out
    code, out, _ = cli(capsys, "devices", "--simulated", "2", "--json")
    data = json.loads(out)
    assert code == 0 and data["simulated"] is True
    assert [d["path"] for d in data["devices"]] == ["usb:0", "usb:1"]
    assert data["devices"][0]["device_node"] == "/dev/bus/usb/002/004"
    assert {"mode", "usb_speed", "bus", "address", "port_path"} <= set(data["devices"][0])


def test_devices_none_found_exits_0(capsys):
    code, out, _ = cli(capsys, "devices", "--simulated", "0")
    assert code == 0 and "no Coral USB Accelerator found" in out
    code, out, _ = cli(capsys, "devices")  # the real bus of this machine: any answer, exit 0
    assert code == 0 and out.strip()


def test_devices_rejects_a_negative_count(capsys):
    code, _, err = cli(capsys, "devices", "--simulated", "-1")
    assert code == 2 and "must be at least 0" in err


def test_doctor_exit_code_follows_the_checks(capsys):
    code, out, _ = cli(capsys, "doctor", "--simulated", "1", "--json")
    data = json.loads(out)
    statuses = [c["status"] for c in data["checks"]]
    assert len(statuses) == 11 and set(statuses) <= set(D.STATUSES)
    assert data["ok"] is ("fail" not in statuses)
    assert code == (1 if "fail" in statuses else 0)
    for c in data["checks"]:
        assert c["status"] in ("ok", "info", "skip") or c["fix"], c


def _args(**kw):
    import argparse
    return argparse.Namespace(json=kw.pop("json", False), simulated=kw.pop("simulated", None))


@pytest.mark.needs_litert
def test_doctor_all_ok_then_one_failure(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(firmware, "FIRMWARE_SHA256", hashlib.sha256(IMAGE).hexdigest())
    fw = tmp_path / "fw.bin"
    fw.write_bytes(IMAGE)
    devroot = tmp_path / "dev"
    backend = SimulatedBackend(n_devices=2, firmware_loaded=True)
    for d in list_devices(backend):
        node(devroot, 0o600, d.bus, d.address)
    good = dict(backend=backend, rules_dirs=[rules_dir(tmp_path)], dev_root=str(devroot),
                firmware_path=fw, platform_name="linux")
    assert D.command_doctor(_args(), **good) == 0
    out = capsys.readouterr().out
    assert "0 checks failed" in out and "fix:" not in out
    bad = dict(good, firmware_path=tmp_path / "absent.bin")
    assert D.command_doctor(_args(), **bad) == 0  # sticks run: missing firmware only warns
    assert "every stick is running" in capsys.readouterr().out
    bad = dict(good, rules_dirs=[tmp_path / "absent"])
    assert D.command_doctor(_args(), **bad) == 1
    out = capsys.readouterr().out
    assert "1 check failed" in out and "fix: install coralrt's udev rule" in out


# -- the Raspberry Pi guide ------------------------------------------------------------------

def test_pi_guide_writes_the_shipped_rule_and_its_python_compiles():
    text = (REPO_ROOT / "docs" / "install-raspberry-pi.md").read_text()
    heredoc = re.search(r"<<'EOF'\n(.*?)\nEOF\n", text, re.S).group(1).splitlines()
    assert heredoc == list(D.RULE_LINES)
    for part in ("python3 -m venv", "pip install coralrt", "udevadm control --reload-rules",
                 "usermod -aG plugdev", "coralrt firmware install", firmware.FIRMWARE_URL,
                 "coralrt doctor", "coralrt devices", "--target coral",
                 "not run on a Raspberry Pi"):
        assert part in text, part
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for code in blocks:
        compile(code, "docs/install-raspberry-pi.md", "exec")


def test_pi_guide_python_example_runs_on_the_simulated_stick(monkeypatch, capsys):
    from conftest import shared_model
    model = shared_model("edgetpu/mobilenet_v2_1.0_224_quant_edgetpu.tflite")
    text = (REPO_ROOT / "docs" / "install-raspberry-pi.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    # The one change: a simulated stick instead of the USB bus.  The simulated Edge TPU
    # refuses edgetpu_compiler programs; the test-only switch lets the example's calls
    # run through the driver (placeholder output bytes, so the classes are meaningless).
    code = code.replace('target="coral")', 'target="coral", device=_sim_device())')
    assert "_sim_device()" in code
    from support.sim import dwn1_backend

    from coralrt import open_device
    monkeypatch.chdir(model.parent)
    opened = []
    scope = {"_sim_device": lambda: opened.append(open_device(backend=dwn1_backend())) or opened[-1]}
    try:
        exec(compile(code, "docs/install-raspberry-pi.md", "exec"), scope)
        assert "top-5 classes:" in capsys.readouterr().out
        assert scope["session"].target == "coral"
    finally:   # the example is a script that ends with the process; a test must let go
        if "session" in scope:
            scope["session"].close()
        for device in opened:
            device.close()


def test_no_stick_points_at_the_simulator(capsys):
    """Someone without a stick learns that --target sim runs models anyway; with a
    (simulated) stick the line is not printed."""
    from coralrt._cli.main import main
    hint = "no stick? --target sim (target='sim' in Python) runs models on coralrt's " \
           "simulated Edge TPU"
    assert main(["devices", "--simulated", "0"]) == 0
    assert hint in capsys.readouterr().out
    assert main(["devices", "--simulated", "1"]) == 0
    assert hint not in capsys.readouterr().out
    main(["doctor", "--simulated", "0"])
    out = capsys.readouterr().out
    assert hint in out and out.index("checks failed") < out.index(hint) < out.index(
        "compile paths")
    main(["doctor", "--simulated", "1"])
    assert hint not in capsys.readouterr().out
