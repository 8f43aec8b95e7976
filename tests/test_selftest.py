"""``coralrt selftest``: the sequence against simulated sticks, the pinned downloads,
the libedgetpu probe and the register read-back against the reference trace."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
from conftest import EXTRA_MODELS_ENV, MODELS_DIR, REPO_ROOT

from coralrt._cli.main import main as cli_main
from coralrt._selftest import CHIP_REASON, REPORT_KEYS, run_selftest
from coralrt._selftest import libedgetpu as L
from coralrt._selftest import models as M
from coralrt._selftest import runner
from coralrt._selftest.recorder import Transfer, compare_with_trace
from coralrt.testing import SimulatedBackend
from coralrt._selftest.open_trace import OPEN_TRACE, parse_trace

TRACE = REPO_ROOT.parent / "shared" / "reference" / "libedgetpu-open-trace.tsv"
def _published_folders() -> list[Path]:
    """Folders of ``CORALRT_EXTRA_MODELS`` holding every pinned file by name (copies
    of Coral's public test data; google-coral/edgetpu carries older copies of some)."""
    found = []
    for folder in filter(None, os.environ.get(EXTRA_MODELS_ENV, "").split(os.pathsep)):
        for f in sorted(Path(folder).rglob("mobilenet_v1_0.25_128_quant_edgetpu.tflite")):
            if all((f.parent / name).is_file() for name in M.PINS):
                found.append(f.parent)
    return found


FOLDERS = _published_folders()
TRANSPORT = ("enumeration", "firmware-download", "re-enumeration", "bring-up",
             "register-readback", "usb-speed")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))     # no firmware installed
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def by_name(checks) -> dict:
    return {c["name"]: c for c in checks}


# -- --simulated, end to end -------------------------------------------------------------

def test_simulated_end_to_end(tmp_path, capsys):
    out = tmp_path / "reports" / "report.json"
    assert cli_main(["selftest", "--simulated", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "simulated" in text.splitlines()[0] and "no check failed" in text
    report = json.loads(out.read_text())
    assert tuple(report) == REPORT_KEYS
    assert report["simulated"] is True and report["ok"] is True
    for key in ("coralrt", "python", "numpy", "pyusb", "libusb"):
        assert report["versions"][key]
    assert {"os", "machine"} <= set(report["host"])
    usb = report["usb"]
    assert usb["port_path"] and usb["speed"] == "usb3" and usb["endpoints"]
    assert usb["before_open"]["ids"] == "1a6e:089a" and usb["after_open"]["ids"] == "18d1:9302"
    checks = by_name(report["checks"])
    for name in TRANSPORT:
        assert checks[name]["status"] == "ok", checks[name]
    # The download really ran (stand-in image) and the stick came back on its port.
    fw = checks["firmware-download"]["measurements"]
    assert fw["stand_in_image"] and not fw["google_image"] and fw["dnload_requests"] > 1
    assert checks["re-enumeration"]["measurements"]["address_after"] != \
        checks["re-enumeration"]["measurements"]["address_before"]
    rows = checks["register-readback"]["measurements"]["registers"]
    assert len(rows) == 6 and all(r["equal"] for r in rows)    # the modelled reset values
    assert checks["bring-up"]["measurements"]["writes_as_in_trace"]
    assert checks["bring-up"]["measurements"]["explained_writes"] == 3   # EnableReset
    # Whatever needs the chip is skipped with the reason, never passed, no outputs compared.
    chip = [c for c in report["checks"] if c["needs_chip"]]
    assert {c["name"] for c in chip} >= {"parameter-caching", "libedgetpu-comparison",
                                         "model:mobilenet_v1_0.25_128",
                                         "model:mobilenet_v1_0.75_192"}
    for c in chip:
        assert c["status"] == "skipped" and c["reason"] == CHIP_REASON, c
        assert "outputs" not in c["measurements"] and "first_run_ms" not in c["measurements"]
    assert not any(c["name"].startswith("libedgetpu:") for c in report["checks"])
    assert report["counts"] == {"ok": 6, "fail": 0, "skipped": len(report["checks"]) - 6}
    for c in report["checks"]:
        assert f"{c['status']:<7} {c['name']}" in text


def test_simulated_with_the_shared_models_folder(capsys):
    if not MODELS_DIR.is_dir():
        pytest.skip(f"{MODELS_DIR} is absent")
    assert cli_main(["selftest", "--simulated", "--models", str(MODELS_DIR)]) == 0
    found = M.resolve_models(MODELS_DIR)
    small = found[0]
    assert small["compiled"] == MODELS_DIR / "edgetpu" / small["model"].compiled
    assert small["plain"] == MODELS_DIR / small["model"].plain and small["pinned"]
    assert found[1]["compiled"] is None and "not in" in found[1]["problem"]
    report = run_selftest(simulated=True, models_dir=MODELS_DIR)
    c = next(c for c in report.checks if c.name == "model:mobilenet_v1_0.25_128")
    assert c.status == "skipped" and c.summary == CHIP_REASON
    assert c.measurements["file"] == str(small["compiled"])


def test_no_stick_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(runner, "simulated_backend", lambda n=1: SimulatedBackend(n_devices=0))
    out = tmp_path / "r.json"
    assert cli_main(["selftest", "--simulated", "--json", str(out)]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("no Coral USB Accelerator found")
    assert json.loads(out.read_text())["stick_found"] is False
    # The same without --simulated, when the USB bus has no stick.
    monkeypatch.setattr(runner, "default_backend", lambda: SimulatedBackend(n_devices=0))
    assert cli_main(["selftest"]) == 2
    assert len(capsys.readouterr().out.splitlines()) == 1


def test_no_such_device_exits_2(capsys):
    assert cli_main(["selftest", "--simulated", "--device", "usb:3"]) == 2
    assert len(capsys.readouterr().out.splitlines()) == 1


# -- register read-back against the trace -----------------------------------------------

def test_trace_data_is_the_reference_trace():
    if not TRACE.is_file():
        pytest.skip(f"{TRACE} is absent")
    assert parse_trace(TRACE.read_text()) == OPEN_TRACE


def test_a_stick_whose_reset_values_differ_from_the_model_is_reported_not_failed(
        monkeypatch):
    from coralrt._sim.stick import chip
    power_on = chip.ChipRegisters.power_on

    def unlike_the_model(self):
        power_on(self)
        self.values[0x1A0D4] = 0x3

    monkeypatch.setattr(chip.ChipRegisters, "power_on", unlike_the_model)
    report = run_selftest(simulated=True)
    c = {c.name: c for c in report.checks}["register-readback"]
    assert c.status == "ok" and "1 of 6 differ" in c.summary and "please send" in c.summary
    assert c.measurements["model_differences"] == [
        {"register": "0x1a0d4", "model": "0x1", "read": "0x3", "equal": False}]
    # The bring-up's read-modify-write follows what the stick answered: not the trace.
    b = {c.name: c for c in report.checks}["bring-up"]
    assert b.status == "fail" and "0x1a0d4: 0x80000003" in b.summary


def _as_transfers(steps) -> list:
    return [Transfer(0.0, 0x40 if s.op == "write" else 0xC0, s.request, s.register & 0xFFFF,
                     s.register >> 16, s.value.to_bytes(s.length, "little")) for s in steps]


def test_a_write_that_libedgetpu_does_not_make_is_reported():
    fake = _as_transfers(OPEN_TRACE)
    assert compare_with_trace(fake, OPEN_TRACE)["writes_as_in_trace"]
    fake.insert(3, Transfer(0.0, 0x40, 1, 0xA000, 0x1, b"\x05\0\0\0"))
    result = compare_with_trace(fake, OPEN_TRACE)
    assert not result["writes_as_in_trace"] and "0x1a000" in result["write_differences"][0]


def test_enable_reset_writes_are_the_only_extra_writes_allowed():
    fake = _as_transfers(OPEN_TRACE)
    sleep = Transfer(0.0, 0x40, 1, 0xA318, 0x1, (0x80C50410).to_bytes(4, "little"))
    pulse = [Transfer(0.0, 0x40, 1, 0x907C, 0x1, bytes([v, 0, 0, 0])) for v in (0xF, 0)]
    result = compare_with_trace(fake[:5] + [sleep] + pulse + fake[5:], OPEN_TRACE)
    assert result["writes_as_in_trace"] and result["explained_writes"] == 3
    missing = compare_with_trace(fake[:-2], OPEN_TRACE)     # the last write left out
    assert not missing["writes_as_in_trace"]
    assert "1 of the trace's writes were not made" in missing["write_differences"][0]


# -- the non-simulated path never passes what it did not run -----------------------------

def test_real_path_on_a_stick_that_refuses_google_programs():
    if not MODELS_DIR.is_dir():
        pytest.skip(f"{MODELS_DIR} is absent")
    backend = SimulatedBackend(n_devices=1, firmware_loaded=True)   # refuses DWN1 programs
    report = run_selftest(backend=backend, models_dir=MODELS_DIR, repeat=2,
                          probe=lambda: {"library": L.LIBRARY, "status": "not installed",
                                         "error": "test"})
    checks = {c.name: c for c in report.checks}
    assert checks["firmware-download"].status == "skipped"     # already running
    assert checks["re-enumeration"].status == "ok"              # after the port reset
    assert checks["model:mobilenet_v1_0.25_128"].status == "fail"
    assert "ProgramRefusedError" in checks["model:mobilenet_v1_0.25_128"].summary
    assert checks["model:mobilenet_v1_0.75_192"].status == "skipped"   # not in the folder
    assert checks["parameter-caching"].status == "skipped"
    assert checks["libedgetpu-comparison"].status == "skipped"
    assert not any(c.needs_chip and c.status == "ok" for c in report.checks)
    assert report.exit_status == 1


def test_bootloader_stick_without_firmware_fails_the_download():
    report = run_selftest(backend=SimulatedBackend(n_devices=1, lock_scope="process"),
                          probe=lambda: {"library": L.LIBRARY, "status": "not installed"})
    checks = {c.name: c for c in report.checks}
    assert checks["firmware-download"].status == "fail"
    assert "coralrt firmware install" in checks["firmware-download"].summary
    assert checks["bring-up"].status == "skipped"
    assert checks["register-readback"].status == "skipped"
    assert report.exit_status == 1


# -- pinned downloads --------------------------------------------------------------------

def test_download_keeps_only_the_pinned_file(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.tflite").write_bytes(b"model bytes")
    (src / "bad.tflite").write_bytes(b"tampered bytes")
    pins = {"good.tflite": hashlib.sha256(b"model bytes").hexdigest(),
            "bad.tflite": hashlib.sha256(b"model bytes").hexdigest()}
    dest = tmp_path / "cache"
    base = src.as_uri() + "/"
    got = M.download_model("good.tflite", dest, base_url=base, pins=pins)
    assert got == dest / "good.tflite" and got.read_bytes() == b"model bytes"
    with pytest.raises(M.ModelDownloadError, match="not the pinned"):
        M.download_model("bad.tflite", dest, base_url=base, pins=pins)
    assert not (dest / "bad.tflite").exists()
    assert sorted(p.name for p in dest.iterdir()) == ["good.tflite"]    # no temp file left
    # A cached copy that was changed is downloaded again; an unpinned name is refused.
    got.write_bytes(b"changed")
    assert M.download_model("good.tflite", dest, base_url=base, pins=pins).read_bytes() \
        == b"model bytes"
    with pytest.raises(M.ModelDownloadError, match="no pinned"):
        M.download_model("other.tflite", dest, base_url=base, pins=pins)


def test_download_with_a_monkeypatched_fetch_and_the_real_pins(tmp_path):
    name = "mobilenet_v1_0.25_128_quant_edgetpu.tflite"
    asked = []

    def fetch(url):
        asked.append(url)
        return b"not the published file"

    with pytest.raises(M.ModelDownloadError):
        M.download_model(name, tmp_path, fetch=fetch)
    assert asked == [M.BASE_URL + name]
    assert asked[0] == ("https://github.com/google-coral/test_data/raw/master/"
                        "mobilenet_v1_0.25_128_quant_edgetpu.tflite")
    assert not any(tmp_path.iterdir())


@pytest.mark.skipif(not FOLDERS, reason=f"{EXTRA_MODELS_ENV} names no folder of Coral's "
                                         f"public test data (the published files)")
def test_pins_are_those_of_the_published_files(tmp_path):
    # One of the copies (google-coral/test_data, where --download fetches from) must
    # match every pin; a wrong pin matches none and fails here.
    matching = [f for f in FOLDERS
                if all(M.sha256_of(f / name) == pin for name, pin in M.PINS.items())]
    assert matching, f"no folder among {FOLDERS} has files with the pinned SHA-256"
    published = matching[0]
    # --download through file:// (the same code path as https) into the user cache folder.
    found = M.resolve_models(download=True, base_url=published.as_uri() + "/")
    assert all(e["compiled"] is not None and e["pinned"] for e in found)
    assert all(Path(e["compiled"]).parent == M.models_cache_dir() for e in found)


# -- libedgetpu, in a child process --------------------------------------------------------

@pytest.mark.needs_litert
def test_probe_reports_not_installed_here():
    result = L.probe()
    if result["status"] == "installed":
        pytest.skip(f"libedgetpu is installed on this machine ({result})")
    assert result["status"] == "not installed" and "libedgetpu.so.1" in result["error"]
    assert L.probe("libcoralrt-no-such-library.so.0")["status"] == "not installed"


def test_probe_survives_a_crashing_library(monkeypatch):
    # The driver's probe with a child that aborts, as a mismatched build does.
    from functools import partial

    from coralrt._backends import libedgetpu as driver
    driver.clear_probe_cache()
    crashing = [sys.executable, "-c", "import os; os.abort()"]
    monkeypatch.setattr(L, "driver_probe", partial(driver.probe, command=crashing))
    result = L.probe()
    assert result["status"] == "unusable" and "SIGABRT" in result["error"]
