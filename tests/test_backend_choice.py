"""Which CPU backend sessions get: LiteRT where it is installed, else coralrt's NumPy kernels.

The registry logic runs here against stand-in backends; the end-to-end check runs
``InferenceSession(..., target="cpu")`` in a child Python where ``ai_edge_litert`` and
``tflite_runtime`` cannot be imported (``sys.modules[name] = None`` before coralrt is
imported: the way Python itself marks a module as unavailable), and compares its outputs
with LiteRT's in this process.  The environment markers of the optional native wheels
(pyproject.toml) are checked against the platform sets coralrt's messages rely on.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import platform
import shutil
import subprocess
import sys
import tomllib

import numpy as np
import pytest
from conftest import REPO_ROOT, run_litert, shared_model
from packaging.markers import Marker
from packaging.requirements import Requirement

from coralrt import _backends as backends, _wheels as wheels
from coralrt._backends.base import CpuBackend
from coralrt._backends.litert import LiteRTBackend, TFLiteRuntimeBackend
from coralrt._cli import doctor_cmd
from coralrt._cli.doctor_software import check_cpu_backends
from coralrt.errors import BackendUnavailableError, DeviceError, DeviceNotFoundError

HAVE_NUMPY_BACKEND = importlib.util.find_spec("coralrt._backends.numpy_backend") is not None
NO_NUMPY_BACKEND = "coralrt/_backends/numpy_backend.py (backend 'numpy') is not there yet"

FALLBACK_LINE = ("no LiteRT interpreter is installed (ai-edge-litert, tflite-runtime); "
                 "running CPU work with coralrt's NumPy kernels (backend 'numpy')")


# -- the registry, with stand-ins ------------------------------------------------------------

class _NoLiteRT(LiteRTBackend):
    _module = "coralrt_test_no_such_litert.interpreter"


class _NoTFLite(TFLiteRuntimeBackend):
    _module = "coralrt_test_no_such_tflite.interpreter"


class _StandIn(CpuBackend):
    name = "numpy"
    version = "0.0-test"


@pytest.fixture
def stand_ins(monkeypatch):
    """The registry with both interpreters missing and a stand-in 'numpy' backend."""
    monkeypatch.setattr(backends, "_REGISTRY", {
        "litert": _NoLiteRT, "tflite_runtime": _NoTFLite, "numpy": _StandIn})
    monkeypatch.setattr(backends, "_instances", {})
    monkeypatch.setattr(backends, "_fallback_logged", False)


def _info_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "coralrt.backends" and r.levelno == logging.INFO]


def test_numpy_is_last_in_the_order():
    assert backends.backend_names() == ["litert", "tflite_runtime", "numpy"]


def test_fallback_is_logged_once_per_process(stand_ins, caplog):
    caplog.set_level(logging.INFO, logger="coralrt.backends")
    first = backends.get_backend()
    assert isinstance(first, _StandIn)
    assert backends.get_backend() is first and backends.get_backend(None) is first
    assert _info_lines(caplog) == [FALLBACK_LINE]
    report = {r["name"]: r for r in backends.backend_report()}
    assert list(report) == ["litert", "tflite_runtime", "numpy"]
    assert report["numpy"] == {"name": "numpy", "usable": True, "version": "0.0-test",
                               "reason": None}
    for name, package in (("litert", "ai-edge-litert"), ("tflite_runtime", "tflite")):
        assert not report[name]["usable"] and "is not installed" in report[name]["reason"]
        assert package in report[name]["reason"]
    assert backends.available_backends() == ["numpy"]
    assert _info_lines(caplog) == [FALLBACK_LINE]


def test_asking_for_numpy_by_name_logs_nothing(stand_ins, caplog):
    caplog.set_level(logging.INFO, logger="coralrt.backends")
    assert isinstance(backends.get_backend("numpy"), _StandIn)
    assert _info_lines(caplog) == []


def test_fallback_line_gives_other_reasons(stand_ins, monkeypatch, caplog):
    class Broken(LiteRTBackend):
        def __init__(self):
            raise ImportError("libfoo.so: cannot open shared object file")

    monkeypatch.setitem(backends._REGISTRY, "litert", Broken)
    caplog.set_level(logging.INFO, logger="coralrt.backends")
    assert isinstance(backends.get_backend(), _StandIn)
    [line] = _info_lines(caplog)
    assert line.startswith("no LiteRT interpreter is usable (litert: CPU backend 'litert' "
                           "cannot be imported: libfoo.so: cannot open shared object file; "
                           "tflite_runtime: CPU backend 'tflite_runtime' is not installed")
    assert line.endswith("; running CPU work with coralrt's NumPy kernels (backend 'numpy')")
    with pytest.raises(BackendUnavailableError, match="libfoo.so"):
        backends.get_backend("litert")


@pytest.mark.needs_litert("with the numpy module missing, the test expects LiteRT to be chosen")
def test_missing_numpy_module_is_only_unusable(monkeypatch):
    monkeypatch.setitem(sys.modules, "coralrt._backends.numpy_backend", None)
    monkeypatch.setattr(backends, "_instances", {})
    with pytest.raises(BackendUnavailableError, match="'numpy'"):
        backends.get_backend("numpy")
    assert isinstance(backends.get_backend(), LiteRTBackend)
    numpy_row = backends.backend_report()[-1]
    assert numpy_row["name"] == "numpy" and not numpy_row["usable"]


def test_importing_coralrt_does_not_import_the_numpy_backend():
    code = ("import sys, coralrt, coralrt._backends; "
            "assert 'coralrt._backends.numpy_backend' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT)


# -- coralrt doctor ----------------------------------------------------------------------

def _rows(litert_reason="CPU backend 'litert' is not installed; install it with "
                        "`pip install ai-edge-litert`"):
    return lambda: [
        {"name": "litert", "usable": False, "version": None, "reason": litert_reason},
        {"name": "tflite_runtime", "usable": False, "version": None,
         "reason": "CPU backend 'tflite_runtime' is not installed"},
        {"name": "numpy", "usable": True, "version": "0.1.0", "reason": None}]


def test_doctor_names_numpy_as_the_default():
    checks = check_cpu_backends(_rows(), has_litert_wheels=False)
    assert [c.name for c in checks] == ["CPU backend litert", "CPU backend tflite_runtime",
                                        "CPU backend numpy"]
    assert [c.status for c in checks] == ["info", "info", "ok"]
    assert "used by default" in checks[2].found and "numpy 0.1.0" in checks[2].found
    assert "no wheels for" in checks[0].found and "sessions use 'numpy'" in checks[0].found
    assert "pip install" not in checks[0].found and not checks[0].fix
    # Where LiteRT has wheels, missing it is worth a warning: it is faster.
    checks = check_cpu_backends(_rows(), has_litert_wheels=True)
    assert [c.status for c in checks] == ["warn", "info", "ok"]
    assert checks[0].fix == "pip install ai-edge-litert" and "slower" in checks[0].found


@pytest.mark.needs_litert("compares this process, which has LiteRT, with a child that hides it")
def test_doctor_with_litert_says_numpy_is_the_fallback():
    checks = {c.name: c for c in check_cpu_backends()}
    assert "used by default" in checks["CPU backend litert"].found
    numpy_row = checks["CPU backend numpy"]
    if HAVE_NUMPY_BACKEND:
        assert numpy_row.status == "ok" and "fallback" in numpy_row.found
        assert "used by default" not in numpy_row.found
    else:
        assert numpy_row.status == "info" and "numpy_backend.py is missing" in numpy_row.found


# -- libusb without libusb-package ---------------------------------------------------------

def test_libusb_without_libusb_package_uses_pyusbs_lookup(monkeypatch):
    import usb.backend.libusb1

    from coralrt._usb import discovery

    system = object()
    monkeypatch.setitem(sys.modules, "libusb_package", None)    # not installed
    monkeypatch.setattr(usb.backend.libusb1, "get_backend", lambda *a, **k: system)
    assert discovery.default_backend() is system
    backend, found = doctor_cmd.load_libusb()
    assert backend is system and "system libusb-1.0 through pyusb" in found
    assert "libusb-package is not installed" in found

    monkeypatch.setattr(usb.backend.libusb1, "get_backend", lambda *a, **k: None)
    with pytest.raises(DeviceNotFoundError, match="libusb"):
        discovery.default_backend()
    with pytest.raises(DeviceError, match="no libusb-1.0 library"):
        doctor_cmd.load_libusb()
    monkeypatch.setattr(doctor_cmd, "libusb_package_has_wheels", lambda *a: False)
    check, backend = doctor_cmd.check_libusb()
    assert check.status == "fail" and backend is None
    assert check.fix == "install the system library: sudo apt install libusb-1.0-0"


# -- the markers of pyproject.toml ---------------------------------------------------------

_PLATFORMS = [("linux", m) for m in ("x86_64", "aarch64", "armv7l", "armv6l", "riscv64",
                                     "i686", "ppc64le", "s390x")] + \
             [("darwin", "x86_64"), ("darwin", "arm64")] + \
             [("win32", m) for m in ("AMD64", "x86", "ARM64")]


def _dependencies() -> dict[str, Requirement]:
    data = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    reqs = [Requirement(r) for r in data["project"]["dependencies"]]
    return {r.name: r for r in reqs}


def marker_platforms(marker: Marker) -> set[tuple[str, str]]:
    """The (sys_platform, platform_machine) pairs of _PLATFORMS that ``marker`` accepts."""
    return {(p, m) for p, m in _PLATFORMS
            if marker.evaluate({"sys_platform": p, "platform_machine": m})}


def test_markers_match_the_wheel_platforms():
    deps = _dependencies()
    assert marker_platforms(deps["ai-edge-litert"].marker) == set(wheels.LITERT_WHEEL_PLATFORMS)
    assert marker_platforms(deps["libusb-package"].marker) == \
        set(wheels.LIBUSB_PACKAGE_WHEEL_PLATFORMS)
    for p, m in _PLATFORMS:
        assert backends.litert_has_wheels(p, m) == ((p, m) in wheels.LITERT_WHEEL_PLATFORMS)
    # The 32-bit and RISC-V boards get neither; everything else stays unconditional.
    for machine in ("armv7l", "armv6l", "riscv64"):
        assert not backends.litert_has_wheels("linux", machine)
        assert not doctor_cmd.libusb_package_has_wheels("linux", machine)
    assert [n for n, r in deps.items() if r.marker] == ["libusb-package", "ai-edge-litert"]


def test_a_32_bit_python_on_a_64_bit_kernel_gets_the_32_bit_machine_name():
    # The 32-bit Raspberry Pi OS on a Pi 4/5 runs a 64-bit kernel: uname says aarch64.
    assert wheels.pip_machine("aarch64", 32) == "armv8l"
    assert wheels.pip_machine("aarch64", 64) == "aarch64"
    assert wheels.pip_machine("x86_64", 32) == "i686"
    assert wheels.pip_machine("armv7l", 32) == "armv7l"
    for package in ("ai-edge-litert", "libusb-package"):
        assert wheels.has_wheels(package, "linux", "aarch64")
        assert not wheels.has_wheels(package, "linux", wheels.pip_machine("aarch64", 32))


def test_doctor_names_a_32_bit_python_on_a_64_bit_kernel(monkeypatch):
    monkeypatch.setattr(wheels.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(wheels.platform, "system", lambda: "Linux")
    monkeypatch.setattr(wheels, "python_bits", lambda: 32)
    monkeypatch.setattr(wheels.sys, "platform", "linux")
    assert not backends.litert_has_wheels() and not doctor_cmd.libusb_package_has_wheels()
    assert wheels.platform_name() == "Linux armv8l (32-bit Python on an aarch64 kernel)"
    rows = [{"name": "litert", "usable": False, "version": None,
             "reason": "CPU backend 'litert' is not installed"},
            {"name": "numpy", "usable": True, "version": "0.1.0", "reason": None}]
    litert = check_cpu_backends(lambda: rows)[0]
    assert litert.status == "info" and "no wheels for Linux armv8l (32-bit Python" in litert.found


@pytest.mark.skipif(shutil.which("linux32") is None or platform.machine() != "x86_64",
                    reason="needs linux32 (util-linux) on an x86-64 Linux kernel")
def test_the_markers_skip_both_wheels_under_the_32_bit_personality():
    """The Pi guide's fix for a 32-bit OS on a 64-bit kernel is `linux32 pip install`:
    under the 32-bit personality the kernel gives its 32-bit machine name, which the
    markers exclude.  Checked here with the x86-64 kernel's personality (i686), the same
    kernel mechanism that gives armv8l on an arm64 kernel."""
    code = ("import json, platform; from packaging.requirements import Requirement; "
            f"deps = {[str(r) for r in _dependencies().values()]!r}; "
            "print(json.dumps([platform.machine(), sorted(Requirement(d).name for d in deps "
            "if Requirement(d).marker is None or Requirement(d).marker.evaluate())]))")
    plain = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                      text=True, check=True).stdout)
    personality = json.loads(subprocess.run(["linux32", sys.executable, "-c", code],
                                            capture_output=True, text=True, check=True).stdout)
    assert plain[0] == "x86_64" and {"ai-edge-litert", "libusb-package"} <= set(plain[1])
    assert personality[0] == "i686"
    assert set(plain[1]) - set(personality[1]) == {"ai-edge-litert", "libusb-package"}


# -- end to end, in a child Python without LiteRT -----------------------------------------

_CHILD = r"""
import json, logging, sys
for name in ("ai_edge_litert", "tflite_runtime"):
    sys.modules[name] = None       # import fails: ModuleNotFoundError, find_spec: None
lines = []
class Keep(logging.Handler):
    def emit(self, record):
        if record.levelno == logging.INFO:
            lines.append(record.getMessage())
log = logging.getLogger("coralrt.backends")
log.setLevel(logging.INFO)
log.addHandler(Keep())

import numpy as np
from coralrt import InferenceSession
from coralrt._backends import backend_report

model, inputs_path, outputs_path = sys.argv[1:4]
inputs = list(np.load(inputs_path).values())
names = []
with InferenceSession(model, target="cpu") as s:
    result = s.run(inputs)
    with InferenceSession(model, target="cpu") as again:    # no second log line
        again.run(inputs)
    names = [s.backend, again.backend]
np.savez(outputs_path, *result.values())
print(json.dumps({"backends": names, "log": lines, "report": backend_report(),
                  "litert_imported": "ai_edge_litert.interpreter" in sys.modules}))
"""

_MODEL = "mobilenet_v1_0.25_128_quant.tflite"


@pytest.mark.needs_litert("compares this process, which has LiteRT, with a child that hides it")
def test_session_without_litert_runs_on_numpy(tmp_path):
    if not HAVE_NUMPY_BACKEND:
        pytest.skip(NO_NUMPY_BACKEND)
    model = shared_model(_MODEL)
    from coralrt import InferenceSession

    with InferenceSession(model, target="cpu") as s:
        assert s.backend == "litert"
        rng = np.random.default_rng(7)
        inputs = [rng.integers(0, 256, t.shape, dtype=np.uint8) for t in s.get_inputs()]
    np.savez(tmp_path / "in.npz", *inputs)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(model), str(tmp_path / "in.npz"),
         str(tmp_path / "out.npz")],
        cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    assert child["backends"] == ["numpy", "numpy"]
    assert child["log"] == [FALLBACK_LINE]
    assert not child["litert_imported"]
    report = {r["name"]: r for r in child["report"]}
    assert list(report) == ["litert", "tflite_runtime", "numpy"]
    assert report["numpy"]["usable"] and report["numpy"]["reason"] is None
    for name in ("litert", "tflite_runtime"):
        assert not report[name]["usable"]
        assert f"CPU backend {name!r} is not installed" in report[name]["reason"]

    got = list(np.load(tmp_path / "out.npz").values())
    want = run_litert(model.read_bytes(), inputs, kernels="reference")
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
