"""``from ai_edge_litert.interpreter import Interpreter, load_delegate`` under coralrt.compat.

Programs (Frigate's Edge TPU detector among them) now import LiteRT's module and
load libedgetpu's delegate through it.  Under the compatibility layer that import
reaches coralrt's interpreter when libedgetpu's delegate is loaded, and LiteRT
itself otherwise; coralrt's own use of LiteRT and its libedgetpu path are never
redirected.  Each program runs in a child process, as users run them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO_ROOT, shared_model

pytest.importorskip("ai_edge_litert.interpreter", reason="ai-edge-litert is not installed")

MODEL = "mobilenet_v1_0.25_128_quant.tflite"
VENDOR = REPO_ROOT.parent / "shared" / "vendor" / "libedgetpu" / "direct" / "libedgetpu.so.1"

PROGRAM = textwrap.dedent('''
    import json, sys
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter, load_delegate
    import ai_edge_litert.interpreter as module
    import ai_edge_litert

    report = {"module": module.__name__, "attr_is_module": ai_edge_litert.interpreter is module,
              "has_op_resolver_type": hasattr(module, "OpResolverType")}
    model = sys.argv[1]
    frame = np.random.default_rng(0).integers(0, 256, (1, 128, 128, 3), dtype=np.uint8)

    def top(it):
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], frame)
        it.invoke()
        return it.get_tensor(it.get_output_details()[0]["index"]).tolist()

    plain = Interpreter(model_path=model)
    report["plain"] = type(plain).__mro__[1].__module__
    report["plain_out"] = top(plain)
    report["ref_out"] = top(Interpreter(
        model_path=model, experimental_op_resolver_type=module.OpResolverType.BUILTIN_REF))
    try:
        load_delegate("libcoralrt_nonexistent.so")
    except (ValueError, OSError) as e:
        report["other_delegate"] = f"{type(e).__name__}: {e}"
    try:
        delegate = load_delegate("libedgetpu.so.1", {"device": "usb"})
    except (ValueError, OSError) as e:
        report["edgetpu_refused"] = str(e)
    else:
        tpu = Interpreter(model_path=model, experimental_delegates=[delegate])
        report["tpu"] = type(tpu).__module__
        report["tpu_target"] = tpu.session.target
        report["tpu_out"] = top(tpu)
    # coralrt's own CPU work in the same process still gets LiteRT, with no loop.
    import coralrt
    from coralrt._backends.litert import _import_real
    report["session"] = coralrt.InferenceSession(model, target="cpu").target
    real = _import_real("ai_edge_litert.interpreter")
    report["real_is_litert"] = real.__name__ == "ai_edge_litert.interpreter" and \\
        real is not module and real.load_delegate is not load_delegate
    print(json.dumps(report))
''')


def _run(tmp_path, *args, env_extra=None, compat=("-m", "coralrt.compat")) -> dict:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items()
           if k not in ("CORALRT_COMPAT", "CORALRT_TARGET")}
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, *compat, *args, str(script),
                           str(shared_model(MODEL))], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_litert_program_with_libedgetpu_runs_on_coralrt(tmp_path):
    r = _run(tmp_path, "--target", "sim")
    assert r["module"] == "coralrt.compat._litert" and r["attr_is_module"]
    assert r["has_op_resolver_type"]
    # Without the delegate: LiteRT's own interpreter.  With it: coralrt's, on sim.
    assert r["plain"] == "ai_edge_litert.interpreter"
    assert r["tpu"] == "coralrt.tflite.interpreter" and r["tpu_target"] == "sim"
    assert r["tpu_out"] == r["ref_out"]     # sim is exact against LiteRT's reference kernels
    # Another delegate library is LiteRT's to load (and to refuse, in its own way).
    assert r["other_delegate"].startswith("OSError: libcoralrt_nonexistent.so: cannot open")
    assert r["session"] == "cpu" and r["real_is_litert"]


def test_the_start_up_variable_maps_it_too_and_no_stick_refuses(tmp_path):
    attached = subprocess.run([sys.executable, "-c", "import coralrt._usb as u; "
                               "print(len(u.list_devices()))"], capture_output=True, text=True)
    if attached.stdout.strip() not in ("0", ""):
        pytest.skip("a Coral stick is attached to this machine")
    r = _run(tmp_path, env_extra={"CORALRT_COMPAT": "1"}, compat=())
    assert r["module"] == "coralrt.compat._litert"
    assert r["edgetpu_refused"].startswith("Failed to load delegate from libedgetpu.so.1\n"
                                           "no Coral USB Accelerator found")
    assert "tpu" not in r and r["plain"] == "ai_edge_litert.interpreter"


def test_without_compat_nothing_is_mapped(tmp_path):
    r = _run(tmp_path, compat=())
    assert r["module"] == "ai_edge_litert.interpreter"
    assert r["other_delegate"].startswith("OSError: libcoralrt_nonexistent.so: cannot open")


def test_coralrts_libedgetpu_probe_is_never_redirected(monkeypatch):
    # The probe's child loads Google's library through the installed LiteRT even when
    # this process (and its environment) has the compatibility layer on.
    if not VENDOR.is_file():
        pytest.skip(f"{VENDOR} is absent")
    from coralrt import compat
    from coralrt._backends import libedgetpu_probe
    monkeypatch.setenv("CORALRT_COMPAT", "1")
    compat.install()
    try:
        found = libedgetpu_probe._run_child(str(VENDOR), "ai_edge_litert.interpreter", {},
                                            120, None)
    finally:
        compat.uninstall()
    if found.stage == "ok":
        pytest.skip("a Coral stick is attached to this machine")
    assert found.stage == "delegate", found
    assert found.version and "RuntimeVersion" in found.version    # Google's library answered
    assert "no Coral USB Accelerator found" not in found.message     # not coralrt's words


def test_installing_and_removing_the_hook_keeps_one_litert_module():
    # A second copy of LiteRT's module would not mix with the first (its OpResolverType
    # members are other objects, which the first copy's Interpreter refuses).
    import importlib
    from coralrt import compat
    from coralrt._backends.litert import _import_real
    before = importlib.import_module("ai_edge_litert.interpreter")
    assert _import_real("ai_edge_litert.interpreter") is before
    compat.install()
    try:
        shim = importlib.import_module("ai_edge_litert.interpreter")
        assert shim is not before and shim.OpResolverType is before.OpResolverType
        assert _import_real("ai_edge_litert.interpreter") is before
    finally:
        compat.uninstall()
    after = importlib.import_module("ai_edge_litert.interpreter")
    assert after is before
    import ai_edge_litert
    assert ai_edge_litert.interpreter is before
    after.Interpreter(model_path=str(shared_model(MODEL)),
                      experimental_op_resolver_type=before.OpResolverType.BUILTIN_REF)
