"""tools/peak_rss.py: peak RSS of LiteRT and target="sim", each in a fresh subprocess."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, shared_model

NUMBER = r"(\d+(?:\.\d+)?)"


@pytest.mark.needs_litert
def test_peak_rss_tool_prints_figures_for_both():
    model = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "peak_rss.py"), str(model),
                           "--runs", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "mobilenet_v1_0.25_128_quant.tflite" in out
    base = re.search(rf"^imports\s+{NUMBER}\s*$", out, re.M)
    assert base and float(base.group(1)) > 0, out
    for row in ("litert", "sim"):
        m = re.search(rf"^{row}\s+{NUMBER}\s+(-?\d+(?:\.\d+)?)\s*$", out, re.M)
        assert m, f"no {row} row in:\n{out}"
        assert float(m.group(1)) > 0
    assert re.search(rf"^ratio sim/LiteRT peak RSS: {NUMBER}$", out, re.M), out
