"""``backend="tflite_runtime"`` tested for real, in a venv of its own.

tflite-runtime needs NumPy 1 and has no wheels for Python 3.12 or newer, so it
cannot share the suite's venv (ai-edge-litert, NumPy 2).  This module builds a
second venv with tflite-runtime, NumPy < 2 and coralrt's other dependencies
but no ai-edge-litert, runs every plain shared model there on ``cpu`` (both
kernel sets) and ``sim``, and compares the outputs with the suite's own
LiteRT runs: TFLite's reference kernels give identical results in both
libraries; the optimized ones may differ by a few LSB on the MobileNets
(shared/models/MANIFEST.md says so).

Not tested where it cannot be: on Python 3.12+ (no tflite-runtime wheels;
there the tests check that the backend says so) and when PyPI is unreachable
(the module skips with that reason).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import MODELS_DIR, MISSING_REASON, REPO_ROOT

from coralrt import InferenceSession
from coralrt._backends import get_backend
from coralrt._backends.litert import NO_TFLITE_RUNTIME_WHEELS
from coralrt.errors import BackendUnavailableError
from tests.support.tflite_runtime_worker import feeds

MODELS = ["add_float.tflite", "add_quantized_int8.tflite", "add_quantized_uint8.tflite",
          "hello_world_int8.tflite", "keras_lstm_mnist_ptq.tflite",
          "mobilenet_v1_0.25_128_quant.tflite", "split_concat.tflite",
          "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite"]
NO_WHEELS = sys.version_info[:2] >= NO_TFLITE_RUNTIME_WHEELS


def _requirements() -> list[str]:
    """coralrt's dependencies without the LiteRT backend; NumPy pinned below 2."""
    reqs = ["tflite-runtime", "numpy<2"]
    for req in importlib.metadata.requires("coralrt") or ():
        name = re.split(r"[ ;<>=!~\[]", req, maxsplit=1)[0].lower()
        if "extra ==" in req or name in ("ai-edge-litert", "numpy"):
            continue
        reqs.append(req.split(";")[0].strip())
    return reqs


@pytest.fixture(scope="module")
def tflite_runtime_venv(tmp_path_factory) -> Path:
    """The venv's python."""
    if NO_WHEELS:
        pytest.skip(f"tflite-runtime has no wheels for Python "
                    f"{sys.version_info[0]}.{sys.version_info[1]}")
    if not MODELS_DIR.is_dir():
        pytest.skip(MISSING_REASON)
    root = tmp_path_factory.mktemp("tflite-runtime-venv")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", *_requirements()],
                         capture_output=True, text=True, timeout=900)
    if pip.returncode != 0:
        if re.search(r"(?i)connection|network|resolve|temporary failure|No matching "
                     r"distribution", pip.stderr):
            pytest.skip(f"cannot install tflite-runtime from PyPI here: "
                        f"{pip.stderr.strip().splitlines()[-1]}")
        pytest.fail(f"pip install failed:\n{pip.stderr}")
    return py


@pytest.fixture(scope="module")
def tflite_runtime_outputs(tflite_runtime_venv):
    py = tflite_runtime_venv
    root = py.parents[2]
    out = root / "outputs.npz"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    worker = REPO_ROOT / "tests" / "support" / "tflite_runtime_worker.py"
    proc = subprocess.run([str(py), str(worker), str(MODELS_DIR), str(out), *MODELS],
                          capture_output=True, text=True, timeout=600, env=env,
                          cwd=str(root))
    assert proc.returncode == 0, proc.stderr
    with np.load(out) as data:
        return {k: data[k] for k in data.files}


def _ours(name: str, label: str) -> dict[str, np.ndarray]:
    kwargs = {"cpu-reference": dict(target="cpu", cpu_kernels="reference"),
              "cpu-optimized": dict(target="cpu"), "sim": dict(target="sim")}[label]
    session = InferenceSession(MODELS_DIR / name, backend="litert", **kwargs)
    return session.run(feeds(session))


def test_default_backend_without_litert_is_tflite_runtime(tflite_runtime_outputs):
    got = tflite_runtime_outputs
    assert str(got["|meta|backend"]) == "tflite_runtime"
    assert str(got["|meta|numpy"]).startswith("1.")
    assert "pip install ai-edge-litert" in str(got["|meta|litert_error"])


@pytest.mark.parametrize("label", ["cpu-reference", "cpu-optimized", "sim"])
@pytest.mark.parametrize("name", MODELS)
def test_outputs_match_litert(tflite_runtime_outputs, name, label):
    got = tflite_runtime_outputs
    want = _ours(name, label)
    for out, expected in want.items():
        actual = got[f"{name}|{label}|{out}"]
        assert actual.dtype == expected.dtype and actual.shape == expected.shape
        if label == "cpu-reference" or expected.dtype.kind not in "iuf":
            np.testing.assert_array_equal(actual, expected)
        elif expected.dtype.kind == "f":
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
        else:   # optimized integer kernels of the two libraries: a few LSB apart
            diff = np.abs(actual.astype(np.int64) - expected.astype(np.int64))
            assert diff.max(initial=0) <= 2, (out, diff.max())


@pytest.mark.skipif(not NO_WHEELS, reason="tflite-runtime has wheels for this Python")
def test_backend_says_it_cannot_be_installed_here():
    with pytest.raises(BackendUnavailableError, match="no wheels for Python 3.12 or newer"):
        get_backend("tflite_runtime")


_COMPAT_PROBE = """\
import json, sys
import numpy as np
import tflite_runtime.interpreter as user_view          # coralrt.compat's mapping
from coralrt import InferenceSession
from coralrt._backends import get_backend
backend = get_backend("tflite_runtime")
session = InferenceSession(sys.argv[1], target="cpu", backend="tflite_runtime")
out = session.run([np.ones(t.shape, t.dtype) for t in session.get_inputs()])
import tflite_runtime.interpreter as again
print(json.dumps({"user": [user_view.__name__, again.__name__],
                  # its code's file: sys.modules maps the module's name to coralrt's
                  "backend_file": backend._Interpreter.__init__.__code__.co_filename,
                  "backend_module": backend._Interpreter.__module__,
                  "outputs": len(out)}))
"""


def test_compat_hook_leaves_the_backend_the_real_package(tflite_runtime_venv, tmp_path):
    """With coralrt.compat's import hook active (python -m coralrt.compat), the program's
    `import tflite_runtime` gets coralrt's module, while the tflite_runtime backend still
    loads the installed package and runs models with it."""
    py = tflite_runtime_venv
    script = tmp_path / "probe.py"
    script.write_text(_COMPAT_PROBE)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([str(py), "-m", "coralrt.compat", str(script),
                           str(MODELS_DIR / "add_float.tflite")], capture_output=True,
                          text=True, timeout=300, env=env, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["user"] == ["coralrt.tflite.interpreter"] * 2
    assert got["backend_module"] == "tflite_runtime.interpreter"
    backend_file = Path(got["backend_file"]).resolve()
    assert backend_file.is_relative_to(py.parents[1].resolve()), backend_file
    assert got["outputs"] >= 1
