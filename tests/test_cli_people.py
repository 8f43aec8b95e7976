"""The command line as people use it: JSON everywhere it reports, ``cache`` with
no action, no native INFO chatter on stderr, and errors whose lines survive."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import shared_model

from coralrt._backends.native_log import native_info_to_log
from coralrt._cli.main import main


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cache_without_action_shows_the_cache(capsys):
    code, out, _ = cli(capsys, "cache")
    assert code == 0 and "directory" in out and "entries" in out
    code, info, _ = cli(capsys, "cache", "info")
    assert out == info
    for argv in (["cache", "--json"], ["cache", "info", "--json"], ["cache", "--json", "info"]):
        code, out, _ = cli(capsys, *argv)
        assert code == 0 and json.loads(out)["directory"] == os.environ["CORALRT_CACHE_DIR"]


def test_cache_clear_json(capsys):
    from coralrt import InferenceSession
    InferenceSession(shared_model("split_concat.tflite"), target="sim")
    code, out, _ = cli(capsys, "cache", "clear", "--json")
    assert code == 0 and json.loads(out)["removed"] >= 1
    assert json.loads(cli(capsys, "cache", "--json")[1])["entries"] == 0


def test_compile_json(tmp_path, capsys):
    out_path = tmp_path / "m.tflite"
    code, out, _ = cli(capsys, "compile", shared_model("split_concat.tflite"), "-o", out_path,
                       "--json")
    assert code == 0
    report = json.loads(out)
    assert report["output"] == str(out_path) and out_path.stat().st_size == report["output_bytes"]
    assert report["summary"]["tpu_ops"] == 3 and len(report["ops"]) == 3
    assert os.path.exists(report["log"])


@pytest.mark.parametrize("target", ["sim", "cpu"])
def test_demo_json(capsys, target):
    code, out, _ = cli(capsys, "demo", "--json", "--runs", "2", "--target", target)
    assert code == 0
    report = json.loads(out)
    assert report["target"] == target and len(report["top5"]) == 5
    assert sum(report["operators"].values()) == len(report["placement"])
    if target == "sim":
        assert report["estimated_device_ms"] > 0
        assert any("Edge TPU" in p["ran_on"] for p in report["placement"])
    else:
        assert report["estimated_device_ms"] is None


@pytest.mark.needs_litert
def test_native_info_line_does_not_reach_stderr():
    # In a fresh process: the TFLite core prints its XNNPACK line once per process.
    proc = subprocess.run([sys.executable, "-m", "coralrt", "run",
                           str(shared_model("add_float.tflite")), "--repeat", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "XNNPACK" not in proc.stderr and "INFO:" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "coralrt", "--debug", "run",
                           str(shared_model("add_float.tflite")), "--repeat", "1"],
                          capture_output=True, text=True, timeout=120)
    assert "native: INFO: Created TensorFlow Lite XNNPACK delegate" in proc.stderr


def test_native_filter_keeps_everything_but_info(capfd):
    with native_info_to_log():
        os.write(2, b"INFO: chatter\nWARNING: keep me\n")
        os.write(2, b"ERROR: and me\n")
    err = capfd.readouterr().err
    assert err == "WARNING: keep me\nERROR: and me\n"
    os.write(2, b"after\n")   # descriptor 2 is the real one again
    assert capfd.readouterr().err == "after\n"


def test_help_never_breaks_a_url(capsys, monkeypatch):
    from coralrt._usb import firmware
    monkeypatch.setenv("COLUMNS", "50")     # narrower than the URLs
    assert main(["firmware", "install", "--help"]) == 0
    out = capsys.readouterr().out
    assert firmware.FIRMWARE_URL in out
    assert main(["firmware", "--help"]) == 0
    assert "(https://github.com/google-coral/libedgetpu," in capsys.readouterr().out
