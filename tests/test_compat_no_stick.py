"""What a program written for libedgetpu meets when no stick can serve it.

libedgetpu's delegate fails to load when no Coral USB Accelerator is attached
(``ValueError: Failed to load delegate from libedgetpu.so.1``, measured with the
vendored build, ../shared/vendor/libedgetpu/README.md); coralrt's does the same
unless the user chose ``CORALRT_TARGET=cpu`` or ``sim``.  Under ``sim`` the
compatibility layer presents ``CORALRT_SIM_STICKS`` simulated sticks.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import coralrt._usb
from coralrt import InferenceSession
from coralrt._model import load_model
from coralrt._model.extract import extract
from coralrt.errors import DeviceNotFoundError
from coralrt.pycoral.pipeline.pipelined_model_runner import PipelinedModelRunner
from coralrt.pycoral.utils import edgetpu
from coralrt.tflite import Interpreter, load_delegate
from tests.conftest import REPO_ROOT, shared_model

MODEL = "mobilenet_v1_0.25_128_quant.tflite"
VENDOR = REPO_ROOT.parent / "shared" / "vendor" / "libedgetpu" / "direct" / "libedgetpu.so.1"
HINT = "to run without a stick, set CORALRT_TARGET=sim"


@pytest.fixture
def sticks(monkeypatch):
    """Set how many sticks USB lists (a list of placeholders: only its length counts)."""
    def attach(n: int) -> None:
        monkeypatch.setattr(coralrt._usb, "list_devices", lambda *a, **k: [object()] * n)
    attach(0)
    return attach


@pytest.mark.parametrize("target", [None, "auto", "coral", "AUTO"])
@pytest.mark.parametrize("options", [None, {"device": "usb"}, {"device": "usb:0"},
                                     {"device": ":0"}])
def test_no_stick_no_delegate_unless_cpu_or_sim_was_chosen(target, options, sticks,
                                                           monkeypatch):
    if target is None:
        monkeypatch.delenv("CORALRT_TARGET", raising=False)
    else:
        monkeypatch.setenv("CORALRT_TARGET", target)
    with pytest.raises(ValueError) as e:
        load_delegate("libedgetpu.so.1", options)
    first, _, rest = str(e.value).partition("\n")
    assert first == "Failed to load delegate from libedgetpu.so.1"
    assert rest.startswith("no Coral USB Accelerator found") and HINT in rest
    # pycoral's helpers raise the same (pycoral's own tests match "Failed to load delegate").
    with pytest.raises(ValueError, match="^Failed to load delegate"):
        edgetpu.make_interpreter(str(shared_model(MODEL)), device=(options or {}).get("device"))


@pytest.mark.parametrize("target, backend", [("cpu", "cpu"), ("sim", "sim")])
def test_a_chosen_cpu_or_sim_target_needs_no_stick(target, backend, sticks, monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", target)
    delegate = load_delegate("libedgetpu.so.1", {"device": "usb"})
    it = Interpreter(model_path=str(shared_model(MODEL)), experimental_delegates=[delegate])
    assert it.session.target == backend


def test_a_named_stick_beyond_those_attached(sticks, monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "auto")
    sticks(1)
    assert load_delegate("libedgetpu.so.1", {"device": "usb:0"}).device == "usb:0"
    with pytest.raises(ValueError, match=r"^Failed to load delegate from libedgetpu.so.1\n"
                                         r"device 'usb:1': found only 1 Coral USB Accelerator;"):
        load_delegate("libedgetpu.so.1", {"device": "usb:1"})


def test_unlistable_usb_leaves_the_answer_to_opening(monkeypatch):
    def broken(*a, **k):
        raise OSError("no libusb")
    monkeypatch.setenv("CORALRT_TARGET", "coral")
    monkeypatch.setattr(coralrt._usb, "list_devices", broken)
    assert load_delegate("libedgetpu.so.1").device is None


def _vendor_refusal() -> str:
    """The first line of the vendored libedgetpu's refusal, loaded by LiteRT with no stick."""
    if not VENDOR.is_file():
        pytest.skip(f"{VENDOR} is absent")
    code = ("from ai_edge_litert.interpreter import load_delegate\n"
            "import sys\n"
            "try:\n    load_delegate(sys.argv[1])\nexcept ValueError as e:\n"
            "    print(str(e).splitlines()[0])\nelse:\n    print('LOADED')\n")
    env = {k: v for k, v in os.environ.items() if k != "CORALRT_COMPAT"}
    proc = subprocess.run([sys.executable, "-c", code, str(VENDOR)], capture_output=True,
                          text=True, timeout=120, env=env)
    if proc.returncode != 0 and "No module named 'ai_edge_litert'" in proc.stderr:
        pytest.skip("ai-edge-litert is not installed")
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    if line == "LOADED":
        pytest.skip("a Coral stick is attached to this machine")
    return line


def test_the_refusal_reads_as_libedgetpus_own(sticks, monkeypatch):
    # Google's library, given by path as programs do, with no stick: coralrt's first line
    # is the same text for the same path.
    theirs = _vendor_refusal()
    monkeypatch.setenv("CORALRT_TARGET", "auto")
    with pytest.raises(ValueError) as e:
        load_delegate(str(VENDOR))
    assert str(e.value).splitlines()[0] == theirs == f"Failed to load delegate from {VENDOR}"


# -- target coral with a plain model: the stick first -----------------------------------------

def test_coral_without_a_stick_says_so_before_any_compiler(sticks, monkeypatch):
    monkeypatch.delenv("CORALRT_EDGETPU_COMPILER", raising=False)
    monkeypatch.delenv("CORALRT_COMPILER_URL", raising=False)
    with pytest.raises(DeviceNotFoundError) as e:
        InferenceSession(shared_model(MODEL), target="coral")
    text = str(e.value)
    assert text.startswith("no Coral USB Accelerator found")
    assert "target 'sim'" in text and "compiler" not in text


def test_coral_cli_without_a_stick(tmp_path):
    # In a child: no monkeypatching, the machine has no stick (skips if one is attached).
    env = {**os.environ, "CORALRT_CACHE_DIR": str(tmp_path)}
    env.pop("CORALRT_EDGETPU_COMPILER", None)
    if coralrt._usb.count_attached():
        pytest.skip("a Coral stick is attached to this machine")
    proc = subprocess.run([sys.executable, "-m", "coralrt", "run", str(shared_model(MODEL)),
                           "--target", "coral"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("coralrt: error: no Coral USB Accelerator found"), proc.stderr
    assert "edgetpu_compiler" not in proc.stderr and len(lines) <= 3


# -- auto: the CPU fallback the user asked for is said once at WARNING --------------------------

def test_auto_falls_back_to_the_cpu_with_one_warning(sticks, monkeypatch, caplog):
    import coralrt._targets.auto as auto
    monkeypatch.setattr(auto, "_warned", False)
    with caplog.at_level(logging.INFO, logger="coralrt"):
        for _ in range(3):
            assert InferenceSession(shared_model(MODEL), target="auto").target == "cpu"
    said = [r for r in caplog.records if "target 'auto': running on" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.INFO, logging.INFO]
    assert "no Coral USB Accelerator found" in said[0].getMessage()


# -- simulated sticks under sim -----------------------------------------------------------

def test_sim_lists_the_simulated_sticks(monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "sim")
    monkeypatch.delenv("CORALRT_SIM_STICKS", raising=False)
    assert edgetpu.list_edge_tpus() == [{"type": "usb", "path": f"usb:{i}", "simulated": True}
                                        for i in range(4)]
    monkeypatch.setenv("CORALRT_SIM_STICKS", "2")
    assert len(edgetpu.list_edge_tpus()) == 2
    assert load_delegate("libedgetpu.so.1", {"device": ":1"}).device == ":1"
    for device in (":2", "usb:2"):
        with pytest.raises(ValueError, match=r"^Failed to load delegate from libedgetpu.so.1\n"
                                             r"device '.*' is not one of the 2 simulated"):
            load_delegate("libedgetpu.so.1", {"device": device})
    monkeypatch.setenv("CORALRT_SIM_STICKS", "lots")
    assert edgetpu.list_edge_tpus() == []           # never raises, as pycoral's
    with pytest.raises(Exception, match="CORALRT_SIM_STICKS='lots' is not a number"):
        load_delegate("libedgetpu.so.1")


def _segments(path: Path) -> tuple[bytes, bytes]:
    model = load_model(path)
    n = len(model.main.operators)
    return (extract(model, range(n // 2)).model.to_bytes(),
            extract(model, range(n // 2, n)).model.to_bytes())


def test_a_pipeline_over_two_simulated_sticks_equals_the_whole_model(monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "sim")
    path = shared_model(MODEL)
    devices = [f"usb:{i}" for i in range(2)]
    assert len(edgetpu.list_edge_tpus()) >= 2
    interpreters = [edgetpu.make_interpreter(seg, device=d)
                    for seg, d in zip(_segments(path), devices)]
    for it in interpreters:
        it.allocate_tensors()
    whole = edgetpu.make_interpreter(str(path), device=":0")
    whole.allocate_tensors()
    runner = PipelinedModelRunner(interpreters)
    name = interpreters[0].get_input_details()[0]["name"]
    shape = interpreters[0].get_input_details()[0]["shape"]
    frames = [np.random.default_rng(i).integers(0, 256, shape, dtype=np.uint8)
              for i in range(3)]
    for f in frames:
        runner.push({name: f})
    runner.push({})
    for f in frames:
        got = runner.pop()
        edgetpu.run_inference(whole, f)
        want = whole.get_tensor(whole.get_output_details()[0]["index"])
        np.testing.assert_array_equal(next(iter(got.values())), want)
    assert runner.pop() is None


# -- pycoral's error texts ------------------------------------------------------------------

def test_pycoral_invoke_helpers_and_their_errors(monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "sim")
    it = edgetpu.make_interpreter(str(shared_model(MODEL)))
    handle = it._native_handle()
    data = np.random.default_rng(0).integers(0, 256, 128 * 128 * 3, dtype=np.uint8)
    for call in (lambda: edgetpu.invoke_with_membuffer(handle, data.ctypes.data, data.size),
                 lambda: edgetpu.invoke_with_dmabuffer(handle, 0, data.size),
                 lambda: edgetpu.invoke_with_bytes(handle, data.tobytes())):
        with pytest.raises(RuntimeError, match=r"^Invoke called on model that is not ready\.$"):
            call()
    it.allocate_tensors()
    out = it.get_output_details()[0]["index"]
    edgetpu.run_inference(it, data)
    want = it.get_tensor(out)
    edgetpu.invoke_with_membuffer(handle, data.ctypes.data, data.size)
    np.testing.assert_array_equal(it.get_tensor(out), want)
    edgetpu.invoke_with_bytes(handle, data.tobytes() + b"extra")
    np.testing.assert_array_equal(it.get_tensor(out), want)
    with pytest.raises(RuntimeError, match="input size=10, expected=49152"):
        edgetpu.invoke_with_bytes(handle, data.tobytes()[:10])
    with pytest.raises(RuntimeError, match="PCIe"):
        edgetpu.invoke_with_dmabuffer(handle, 0, data.size)
    assert edgetpu.supports_dmabuf(handle) is False
    with pytest.raises(ValueError, match="not the _native_handle"):
        edgetpu.invoke_with_bytes(12345, b"")


def test_a_segment_that_was_not_allocated_fails_in_pycorals_words(monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "sim")
    segs = [edgetpu.make_interpreter(s) for s in _segments(shared_model(MODEL))]
    runner = PipelinedModelRunner(segs)             # allocate_tensors() never called
    d = segs[0].get_input_details()[0]
    runner.push({d["name"]: np.zeros(d["shape"], np.uint8)})
    text = "Segment 0 runner error: Invoke called on model that is not ready."
    with pytest.raises(RuntimeError, match=f"^{text}$"):
        runner.pop()
    with pytest.raises(RuntimeError, match=f"^{text}$"):
        runner.push({d["name"]: np.zeros(d["shape"], np.uint8)})
    with pytest.raises(ValueError, match=r"Interpreter [\d]+ can not get its input tensors"):
        PipelinedModelRunner(segs[::-1])


def test_pycoral_run_inference_runs_while_an_output_array_is_held(monkeypatch):
    # pycoral's run_inference calls the native interpreter, which does not check for
    # arrays from tensor(); an array held meanwhile sees the new outputs.
    monkeypatch.setenv("CORALRT_TARGET", "sim")
    it = edgetpu.make_interpreter(str(shared_model(MODEL)))
    it.allocate_tensors()
    out = it.get_output_details()[0]["index"]
    frames = [np.random.default_rng(i).integers(0, 256, 128 * 128 * 3, dtype=np.uint8)
              for i in range(2)]
    edgetpu.run_inference(it, frames[0])
    held = it.tensor(out)()
    first = held.copy()
    edgetpu.run_inference(it, frames[1].tobytes())
    second = it.get_tensor(out)
    np.testing.assert_array_equal(held, second)
    assert not np.array_equal(first, second)
    with pytest.raises(RuntimeError, match="still referenced"):
        it.invoke()                                  # tflite_runtime's own invoke() refuses
