"""The example plugin in examples/coralrt-sinh, installed into a fresh venv and
reached through its entry point only (no explicit registration)."""

from __future__ import annotations

import importlib.util
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO_ROOT, shared_model

EXAMPLE = REPO_ROOT / "examples" / "coralrt-sinh"

PROBE = """
import sys, numpy as np
from importlib.metadata import entry_points
from coralrt import InferenceSession
from coralrt.errors import UnsupportedOperatorError
print("entry points:", sorted(ep.name for ep in entry_points(group="coralrt")))
try:
    s = InferenceSession(sys.argv[1])
except UnsupportedOperatorError as e:
    print("unsupported:", e.op_name)
    raise SystemExit(0)
x = np.linspace(-1, 1, int(np.prod(s.get_inputs()[0].shape)), dtype=np.float32)
(y,) = s.run(x.reshape(s.get_inputs()[0].shape)).values()
print("max error:", float(np.max(np.abs(y.reshape(-1) - np.sinh(x)))))
"""


@pytest.fixture(scope="module")
def plugin_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("plugin") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    # Let the new venv see this environment's packages (coralrt, numpy, LiteRT)
    # without downloading them again.
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], check=True, capture_output=True,
                             text=True).stdout.strip()
    here = [sysconfig.get_paths()["purelib"], *site.getsitepackages(), str(REPO_ROOT)]
    Path(purelib, "parent-env.pth").write_text("\n".join(dict.fromkeys(here)) + "\n")
    cmd = [str(py), "-m", "pip", "install", "--quiet", "--no-deps", str(EXAMPLE)]
    if _can_build_offline():
        cmd.insert(-1, "--no-build-isolation")  # build with this env's setuptools
    subprocess.run(cmd, check=True, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    return py


def _can_build_offline() -> bool:
    # setuptools builds wheels by itself from 70.1 on; older ones need "wheel".
    try:
        import setuptools
    except ImportError:
        return False
    major, minor = (int(p) for p in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def probe(py: Path, **env) -> str:
    result = subprocess.run([str(py), "-c", PROBE, str(shared_model("custom_sinh.tflite"))],
                            capture_output=True, text=True, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_example_plugin_is_found_by_its_entry_point(plugin_venv):
    out = probe(plugin_venv)
    assert "entry points: ['sinh']" in out
    error = float(out.split("max error:")[1])
    assert error < 1e-6


def test_autoload_can_be_turned_off(plugin_venv):
    out = probe(plugin_venv, CORALRT_DISABLE_PLUGIN_AUTOLOAD="1")
    assert "unsupported: Sinh" in out
