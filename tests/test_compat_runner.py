"""Unmodified tflite_runtime / pycoral programs run on coralrt (``coralrt.compat``).

Each program is written to a temporary folder and run in a subprocess, as a
user would: ``python -m coralrt.compat script.py ARGS`` (the runner), or
plain ``python`` with ``CORALRT_COMPAT=1`` and coralrt's start-up hook
(``coralrt-compat.pth`` + ``_coralrt_compat``; here in a site folder that a
``sitecustomize`` adds, since the suite's venv may predate the hook;
tests/test_wheel.py checks it in a real install).  The import hook must give
the program coralrt's modules, yet coralrt's own ``tflite_runtime`` CPU
backend the real package (a fake one here; tests/test_tflite_runtime.py
checks the real one).
"""

from __future__ import annotations

import json
import os
import re
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import IMAGES_DIR, MODELS_DIR, REPO_ROOT, shared_image, shared_model
from tests.support.compat_hook import hook_pythonpath

TIMEOUT = 300


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("CORALRT_COMPAT", "CORALRT_TARGET", "PYTHONPATH")}
    env.update({k: v for k, v in extra.items() if v is not None})
    return env


def _write(folder: Path, name: str, code: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(code))
    return path


def _compat(args, *, cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coralrt.compat", *map(str, args)], cwd=cwd,
                          env=_env(**env), capture_output=True, text=True, timeout=TIMEOUT)


def _python(args, *, cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=_env(**env),
                          capture_output=True, text=True, timeout=TIMEOUT)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


# -- the programs ----------------------------------------------------------------------------

CLASSIFY = """\
    import sys
    from PIL import Image
    from pycoral.adapters import classify, common
    from pycoral.utils.dataset import read_label_file
    from pycoral.utils.edgetpu import make_interpreter
    from tflite_runtime.interpreter import Interpreter, load_delegate

    model, image_path, labels_path = sys.argv[1:4]
    interpreter = make_interpreter(model)
    assert isinstance(interpreter, Interpreter)
    interpreter.allocate_tensors()
    labels = read_label_file(labels_path)
    size = common.input_size(interpreter)
    common.set_input(interpreter, Image.open(image_path).convert("RGB").resize(size, Image.NEAREST))
    interpreter.invoke()
    for c in classify.get_classes(interpreter, top_k=1):
        print(f"class {c.id} {labels.get(c.id, c.id)} {c.score:.3f}")
"""

# Frigate's Edge TPU detector, reduced: a delegate for the USB stick, an interpreter
# with it, and a loop that feeds frames and reads the four detection outputs.
DETECTOR = """\
    import sys
    import numpy as np
    from tflite_runtime.interpreter import Interpreter, load_delegate

    class EdgeTpuTfl:
        def __init__(self, model_path, device_config):
            edge_tpu_delegate = load_delegate("libedgetpu.so.1", device_config)
            self.interpreter = Interpreter(model_path=model_path,
                                           experimental_delegates=[edge_tpu_delegate])
            self.interpreter.allocate_tensors()
            self.tensor_input_details = self.interpreter.get_input_details()
            self.tensor_output_details = self.interpreter.get_output_details()

        def detect_raw(self, tensors):
            for detail, tensor in zip(self.tensor_input_details, tensors):
                self.interpreter.set_tensor(detail["index"], tensor)
            self.interpreter.invoke()
            out = self.tensor_output_details
            boxes = self.interpreter.tensor(out[0]["index"])()[0]
            class_ids = self.interpreter.tensor(out[1]["index"])()[0]
            scores = self.interpreter.tensor(out[2]["index"])()[0]
            count = int(self.interpreter.tensor(out[3]["index"])()[0])
            assert boxes.shape[-1] == 4 and 0 <= count <= len(scores)
            # Copied out, as Frigate does: arrays from tensor() held across the next
            # invoke() make tflite_runtime (and coralrt) raise RuntimeError.
            detections = np.zeros((20, 6), np.float32)
            for i in range(min(count, 20)):
                detections[i] = [class_ids[i], scores[i], *boxes[i]]
            return detections, count

    detector = EdgeTpuTfl(sys.argv[1], {"device": "usb"})
    rng = np.random.default_rng(0)
    for frame in range(3):
        frame_tensors = [rng.integers(0, 256, d["shape"], dtype=np.uint8)
                         for d in detector.tensor_input_details]
        detections, count = detector.detect_raw(frame_tensors)
        scores = detections[:count, 1]
        assert np.all((scores >= 0) & (scores <= 1))
        print(f"frame {frame}: {count} detections, top score {float(scores.max()):.3f}")
"""


def test_pycoral_classification_of_the_cat_prints_class_286(tmp_path):
    model = shared_model("mobilenet_v2_1.0_224_quant.tflite")
    image, labels = shared_image("cat.bmp"), shared_image("imagenet_labels.txt")
    script = _write(tmp_path, "classify.py", CLASSIFY)
    out = _ok(_compat([script, model, image, labels], cwd=tmp_path, CORALRT_TARGET="sim"))
    assert out.startswith("class 286 Egyptian cat "), out


@pytest.mark.parametrize("target", ["cpu", "sim"])
def test_frigate_style_detector_loop(tmp_path, target):
    model = shared_model("ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite")
    script = _write(tmp_path, "detector.py", DETECTOR)
    out = _ok(_compat([script, model], cwd=tmp_path, CORALRT_TARGET=target))
    assert [line.split(":")[0] for line in out.splitlines()] == ["frame 0", "frame 1", "frame 2"]


def test_a_compiled_model_on_sim_is_refused_not_zeros(tmp_path):
    model = shared_model("edgetpu/mobilenet_v2_1.0_224_quant_edgetpu.tflite")
    image, labels = shared_image("cat.bmp"), shared_image("imagenet_labels.txt")
    script = _write(tmp_path, "classify.py", CLASSIFY)
    proc = _compat([script, model, image, labels], cwd=tmp_path, CORALRT_TARGET="sim")
    assert proc.returncode != 0 and "class " not in proc.stdout, proc.stdout
    assert "compiled by edgetpu_compiler" in proc.stderr, proc.stderr
    assert "Coral USB Accelerator" in proc.stderr, proc.stderr


def test_pycoral_learn_imports_coralrts_modules(tmp_path):
    script = _write(tmp_path, "learn.py", """\
        from pycoral.learn.imprinting.engine import ImprintingEngine
        from pycoral.learn.backprop.softmax_regression import SoftmaxRegression
        print(ImprintingEngine.__module__, SoftmaxRegression.__module__)
    """)
    out = _ok(_compat([script], cwd=tmp_path))
    assert out.split() == ["coralrt.pycoral.learn.imprinting.engine",
                           "coralrt.pycoral.learn.backprop.softmax_regression"], out


# -- the runner behaves like python ----------------------------------------------------------

PROBE = """\
    import json, os, sys
    import tflite_runtime, tflite_runtime.interpreter as tfl
    import pycoral.utils.edgetpu as edgetpu
    import coralrt.tflite, coralrt.tflite.interpreter, coralrt.pycoral.utils.edgetpu
    try:
        import pycoral.no_such_module
        missing = None
    except ModuleNotFoundError as e:
        missing = str(e)
    print(json.dumps({
        "argv": sys.argv, "name": __name__, "path0": sys.path[0],
        "file": os.path.basename(__file__) if "__file__" in globals() else None,
        "same": [tflite_runtime is coralrt.tflite, tfl is coralrt.tflite.interpreter,
                 edgetpu is coralrt.pycoral.utils.edgetpu],
        "real_name": tfl.__name__, "spec": tfl.__spec__.name, "missing": missing,
        "target": os.environ.get("CORALRT_TARGET"), "compat": os.environ.get("CORALRT_COMPAT"),
    }))
    sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


def test_runner_runs_a_script_like_python(tmp_path):
    sub = tmp_path / "prog"
    sub.mkdir()
    script = _write(sub, "probe.py", PROBE)
    proc = _compat(["--target", "sim", script, "-v", "--x=1", "--", "last"], cwd=tmp_path,
                   PROBE_EXIT="3")
    assert proc.returncode == 3, proc.stderr
    got = json.loads(proc.stdout)
    assert got["argv"] == [str(script), "-v", "--x=1", "--", "last"]
    assert got["name"] == "__main__" and got["file"] == "probe.py"
    assert got["path0"] == str(sub)
    assert got["same"] == [True, True, True]
    assert got["real_name"] == got["spec"] == "coralrt.tflite.interpreter"
    assert got["missing"] == "No module named 'pycoral.no_such_module'"
    assert got["target"] == "sim" and got["compat"] == "1"


def test_runner_runs_modules_and_code(tmp_path):
    _write(tmp_path, "probe_mod.py", PROBE)
    got = json.loads(_ok(_compat(["-m", "probe_mod", "a", "-b"], cwd=tmp_path,
                                 CORALRT_TARGET="cpu")))
    assert got["argv"] == [str(tmp_path / "probe_mod.py"), "a", "-b"]
    assert got["name"] == "__main__" and got["same"] == [True, True, True]
    assert got["path0"] == str(tmp_path) and got["target"] == "cpu"

    code = "import sys, tflite_runtime.interpreter as t; print(t.__name__, sys.argv, __name__)"
    out = _ok(_compat(["-c", code, "x"], cwd=tmp_path))
    assert out.split() == ["coralrt.tflite.interpreter", "['-c',", "'x']", "__main__"]


def test_runner_help_and_usage_errors(tmp_path):
    proc = _compat(["--help"], cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: python -m coralrt.compat")
    assert "CORALRT_TARGET" in proc.stdout and "CORALRT_COMPAT=1" in proc.stdout
    for args, message in ((["--target", "gpu", "x.py"], "invalid choice: 'gpu'"),
                          ([], "name the program to run"),
                          (["--bogus", "x.py"], "unrecognized arguments: --bogus"),
                          (["missing.py"], "can't open file")):
        proc = _compat(args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and proc.stdout == "", (args, proc.stderr)


# -- CORALRT_COMPAT=1: the start-up hook -------------------------------------------------------

SPAWN = """\
    import multiprocessing as mp
    import sys

    def child(queue):
        import tflite_runtime.interpreter as tfl
        queue.put(tfl.__name__)

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue,))
        proc.start()
        print("child:", queue.get(timeout=120))
        proc.join(60)
        sys.exit(proc.exitcode)
"""


@pytest.fixture
def hook_site(tmp_path) -> dict:
    """The environment of a Python whose site-packages has coralrt's start-up hook: a
    site folder with the two files, which a ``sitecustomize`` adds (as site does for
    site-packages, so the ``.pth`` line runs), in every process that inherits it."""
    return {"PYTHONPATH": hook_pythonpath(tmp_path)}


def test_compat_env_maps_imports_in_spawned_children(tmp_path, hook_site):
    script = _write(tmp_path, "spawner.py", SPAWN)
    out = _ok(_python([script], cwd=tmp_path, CORALRT_COMPAT="1", **hook_site))
    assert out.strip() == "child: coralrt.tflite.interpreter"
    # The runner sets CORALRT_COMPAT=1 for the program, so its children get it too.
    out = _ok(_compat([script], cwd=tmp_path, **hook_site))
    assert out.strip() == "child: coralrt.tflite.interpreter"


def test_without_the_variable_the_hook_imports_nothing(tmp_path, hook_site):
    code = ("import sys\nprint(sorted(m for m in sys.modules if m.startswith(('coralrt', '_coralrt'))))\n"
            "import tflite_runtime\n")
    for value in (None, "0", "off", ""):
        proc = _python(["-c", code], cwd=tmp_path, CORALRT_COMPAT=value, **hook_site)
        # Unset: the .pth line imports nothing; set to "off": only the tiny hook module.
        want = "[]" if value is None else "['_coralrt_compat']"
        assert proc.stdout.strip() == want, (value, proc.stdout)
        assert "No module named 'tflite_runtime'" in proc.stderr, (value, proc.stderr)
    proc = _python(["-c", code], cwd=tmp_path, CORALRT_COMPAT="1", **hook_site)
    # At start-up only the finder's module is loaded, not coralrt's package (nor NumPy).
    assert proc.stdout.strip() == "['_coralrt_compat', 'coralrt.compat._finder']", proc.stdout
    assert proc.returncode == 0, proc.stderr


def test_a_broken_coralrt_does_not_break_python(tmp_path, hook_site):
    broken = tmp_path / "broken"
    (broken / "coralrt").mkdir(parents=True)
    (broken / "coralrt" / "__init__.py").write_text("raise RuntimeError('broken')\n")
    env = dict(hook_site, PYTHONPATH=f"{broken}{os.pathsep}{hook_site['PYTHONPATH']}")
    proc = _python(["-c", "print('started')"], cwd=tmp_path, CORALRT_COMPAT="1", **env)
    assert proc.returncode == 0 and proc.stdout == "started\n", proc.stderr
    assert proc.stderr.startswith("coralrt: CORALRT_COMPAT is set but the "), proc.stderr
    assert "finder.py is missing" in proc.stderr


def test_this_venv_hook_follows_the_install():
    """The suite's venv is an editable install: it has the start-up hook when it was
    installed with this version's build configuration (setup.py adds it to editable
    wheels too)."""
    pths = [Path(d) / "coralrt-compat.pth" for d in site.getsitepackages()]
    if not any(p.is_file() for p in pths):
        pytest.skip("this venv was installed before the start-up hook existed; "
                    "`pip install -e .` (or `make test`, which reinstalls) adds it")
    proc = _python(["-c", "import tflite_runtime.interpreter as t; print(t.__name__)"],
                   cwd=REPO_ROOT, CORALRT_COMPAT="1")
    assert _ok(proc).strip() == "coralrt.tflite.interpreter"


# -- coralrt's own tflite_runtime backend keeps the real package --------------------------------

FAKE_TFLITE_RUNTIME = {
    "__init__.py": "__version__ = '0.0-fake'\n",
    "_wrapper.py": "LOADED = True\n",
    # Like the real package: the interpreter imports its sibling by absolute name.
    "interpreter.py": textwrap.dedent("""\
        import enum
        from tflite_runtime import _wrapper
        class OpResolverType(enum.Enum):
            AUTO = 0
            BUILTIN = 1
            BUILTIN_REF = 2
            BUILTIN_WITHOUT_DEFAULT_DELEGATES = 3
        class Interpreter:
            FAKE = _wrapper.LOADED
    """),
}

BACKEND_PROBE = """\
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import coralrt.compat
    from coralrt._backends import get_backend, litert
    litert.TFLiteRuntimeBackend._check_usable = lambda self: None   # the fake needs no numpy<2
    coralrt.compat.install()
    seen = []
    if sys.argv[2] == "user-first":
        import tflite_runtime.interpreter as t
        seen.append(t.__name__)
    backend = get_backend("tflite_runtime")
    import tflite_runtime.interpreter as t
    import tflite_runtime
    seen.append(t.__name__)
    print(json.dumps({
        "seen": seen, "fake": getattr(backend._Interpreter, "FAKE", False),
        "module": backend._Interpreter.__module__, "version": backend.version,
        "top": tflite_runtime.__name__, "first": type(sys.meta_path[0]).__name__,
        "again": get_backend("tflite_runtime") is backend,
    }))
"""


@pytest.mark.parametrize("order", ["user-first", "backend-first"])
def test_backend_gets_the_real_tflite_runtime_and_users_get_coralrts(tmp_path, order):
    fake = tmp_path / "fake"
    (fake / "tflite_runtime").mkdir(parents=True)
    for name, text in FAKE_TFLITE_RUNTIME.items():
        (fake / "tflite_runtime" / name).write_text(text)
    script = _write(tmp_path, "probe.py", BACKEND_PROBE)
    got = json.loads(_ok(_python([script, fake, order], cwd=tmp_path)))
    assert got["fake"] is True and got["module"] == "tflite_runtime.interpreter"
    assert got["version"] == "0.0-fake"
    assert set(got["seen"]) == {"coralrt.tflite.interpreter"}
    assert got["top"] == "coralrt.tflite" and got["first"] == "CompatFinder"
    assert got["again"] is True


def test_backend_without_the_real_package_says_not_installed(tmp_path):
    code = ("import coralrt.compat; coralrt.compat.install()\n"
            "import tflite_runtime\n"
            "from coralrt._backends import get_backend\n"
            "from coralrt.errors import BackendUnavailableError\n"
            "try:\n    get_backend('tflite_runtime')\n"
            "except BackendUnavailableError as e:\n    print('unavailable:', e)\n")
    out = _ok(_python(["-c", code], cwd=tmp_path))
    assert out.startswith("unavailable: CPU backend 'tflite_runtime' is not installed"), out


# -- docs/porting.md's programs, unmodified ---------------------------------------------------

def _unported(code: str) -> str:
    """The block with each ``# was: ORIGINAL`` line put back in place of the line after it."""
    lines, out = code.splitlines(), []
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)# was: (.*)$", lines[i])
        if m:
            out.append(m[1] + m[2])
            i += 2
        else:
            out.append(lines[i])
            i += 1
    return "\n".join(out) + "\n"


def _porting_programs() -> list:
    from tests.support.doc_blocks import DOCS, read_blocks
    blocks = [b for b in read_blocks(DOCS / "porting.md")
              if b.lang == "python" and "# was: " in b.code]
    return [pytest.param(b, id=f"porting.md:{b.line}") for b in blocks]


@pytest.mark.parametrize("block", _porting_programs())
def test_porting_guide_programs_run_unmodified_with_the_runner(tmp_path, block):
    shared_model("mobilenet_v2_1.0_224_quant.tflite")
    shared_image("cat.bmp")
    for folder in (MODELS_DIR, IMAGES_DIR):
        for entry in folder.iterdir():
            if not (tmp_path / entry.name).exists():
                (tmp_path / entry.name).symlink_to(entry)
    code = _unported(block.code)
    assert "coralrt" not in code, code
    script = tmp_path / "program.py"
    script.write_text(code)
    out = _ok(_compat([script], cwd=tmp_path, CORALRT_TARGET="sim"))
    if "classify" in code:
        assert out.startswith("286 Egyptian cat"), out
    assert out.strip(), "the guide's programs print what they found"
