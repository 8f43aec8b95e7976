"""``coralrt bench --plot``: a PNG of the per-run latencies; a clear error without matplotlib."""

from __future__ import annotations

import struct
import sys

import pytest
from conftest import shared_model

from coralrt._cli.main import main

pytest.importorskip("matplotlib")


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("target", ["sim", "cpu"])
def test_plot_is_a_png(tmp_path, capsys, monkeypatch, target):
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "bench.png"
    model = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    assert main(["bench", str(model), "--target", target, "--repeat", "5", "--warmup", "1",
                 "--plot", str(out)]) == 0
    assert "host" in capsys.readouterr().out      # the report is printed as before
    width, height = _png_size(out.read_bytes())
    assert 400 <= width <= 3000 and 200 <= height <= 2000
    assert out.stat().st_size > 5000               # not an empty canvas


def test_without_matplotlib_a_one_line_error(tmp_path, capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib -> ImportError
    out = tmp_path / "bench.png"
    model = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    assert main(["bench", str(model), "--plot", str(out)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""                      # fails before any work
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("coralrt: error: ")
    assert "pip install 'coralrt[plot]'" in lines[0]
    assert not out.exists()
