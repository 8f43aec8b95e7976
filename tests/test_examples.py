"""Every command shown in examples/README.md runs, and prints what it says it does.

The fenced blocks of examples/README.md are ```sh blocks of commands, one per
line, each ``python examples/SCRIPT.py ...``.  Each block runs here as a
subprocess from the repository root, its commands in order (the detector is
built before it is used), with this interpreter for ``python``.  Arguments
under ``/tmp/`` are moved into the test's own temporary folder, so runs
neither clash nor leave files behind.  Every command must exit 0, and each
script has a check of its key output in ``CHECKS``: a command for a script
without one fails, so a new example comes with its check.

(tests/test_docs.py checks README.md and docs/*.md, not this file.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import IMAGES_DIR, MODELS_DIR, REPO_ROOT, shared_model

from tests.support.doc_blocks import read_blocks

EXAMPLES = REPO_ROOT / "examples"
README = EXAMPLES / "README.md"
BLOCKS = read_blocks(README)
TMP = "/tmp/"


def commands(block) -> list[str]:
    lines, out = block.code.splitlines(), []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1].rstrip() + " " + line
        else:
            out.append(line)
    return out


def argv_of(command: str, tmp: Path) -> list[str]:
    argv = shlex.split(command)
    assert argv[0] == "python" and len(argv) > 1 and argv[1].startswith("examples/"), (
        f"examples/README.md: {command!r} is not `python examples/SCRIPT.py ...`")
    return [sys.executable] + [str(tmp / a[len(TMP):]) if a.startswith(TMP) else a
                               for a in argv[1:]]


def positional(argv: list[str]) -> list[str]:
    """The script's positional arguments (all written before its options here)."""
    args = argv[2:]
    return args[:next((i for i, a in enumerate(args) if a.startswith("--")), len(args))]


def option(argv: list[str], name: str, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


# -- the key output of each example ---------------------------------------------------------

def check_classify(argv, out):
    ranked = re.findall(r"^\s+(\d+)\s+(\d+)\s+([\d.]+)\s+(.*)$", out, re.M)
    assert len(ranked) == int(option(argv, "--top-k", 3)), out
    model, image = positional(argv)
    if "mobilenet_v2" in model and image.endswith("cat.bmp"):
        assert ranked[0][1] == "286" and ranked[0][3] == "Egyptian cat", out
    assert f"target: {option(argv, '--target')}" in out


def check_tiny_detector(argv, out):
    from coralrt import InferenceSession
    from coralrt.vision import guess_task
    path = Path(positional(argv)[0])
    assert path.is_file() and "UNTRAINED" in out, out
    with InferenceSession(str(path), target="cpu") as session:
        assert guess_task(session) == "detect"


def check_detect(argv, out):
    from PIL import Image
    count = int(re.search(r"^(\d+) objects scoring", out, re.M).group(1))
    assert count >= 1 and len(re.findall(r"  score \d\.\d\d  box ", out)) == count, out
    saved = Path(option(argv, "--save"))
    assert saved.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(saved) as drawn, Image.open(REPO_ROOT / positional(argv)[0]) as image:
        assert drawn.size == image.size
    if option(argv, "--model") is None:             # the real SSD: people and kites
        assert "UNTRAINED" not in out and "coco_ssd_mobilenet_v1" in out, out
        if option(argv, "--labels"):
            found = set(re.findall(r"^  (\w+)  score ", out, re.M))
            assert found == {"person", "kite"}, out


def check_camera_loop(argv, out):
    frames = int(option(argv, "--frames"))
    assert len(re.findall(r"^frame +\d+ ", out, re.M)) == frames, out
    fps = re.search(rf"^{frames} frames in [\d.]+ s: ([\d.]+) frames per second$", out, re.M)
    assert fps and float(fps.group(1)) > 0, out
    if "mobilenet" in positional(argv)[0] and option(argv, "--labels"):
        assert re.search(r"bird\.bmp +chickadee ", out), out


def check_two_models(argv, out):
    rounds = int(option(argv, "--rounds", 3))
    runs = re.findall(r"^round (\d+)  model ([AB])  (.+?)  [\d.]+ +[\d.]+ ms$", out, re.M)
    assert [m for _, m, _ in runs] == ["A", "B"] * rounds, out
    if positional(argv)[2].endswith("cat.bmp") and option(argv, "--labels"):
        assert {label for *_, label in runs} == {"Egyptian cat"}, out
    assert "both sessions on <UsbEdgeTpu usb:0" in out, out    # one stick, shared


def check_two_sticks(argv, out):
    requests = int(option(argv, "--requests"))
    stats = json.loads(re.search(r"^stats: (.*)$", out, re.M).group(1))
    assert re.search(rf"^{requests} requests in [\d.]+ s: [\d.]+ requests per second$",
                     out, re.M), out
    if option(argv, "--strategy") == "replicate":
        per_stick = {r["device"]: r["requests"] for r in stats["replicas"]}
        assert set(per_stick) == {"usb:0", "usb:1"} and all(per_stick.values()), stats
        assert sum(per_stick.values()) == requests, stats
    else:
        assert stats["completed"] == requests, stats
        assert [s["device"] for s in stats["stages"]] == ["usb:0", "usb:1"], stats
        assert all(s["requests"] == requests for s in stats["stages"]), stats


def check_gp_pagerank(argv, out):
    nodes, iterations = int(option(argv, "--nodes", 400)), int(option(argv, "--iterations", 30))
    assert re.search(rf"^PageRank of a random graph: {nodes} nodes, \d+ links", out, re.M), out
    assert re.search(rf"^{iterations} iterations in [\d.]+ s \(\d+ tile jobs", out, re.M), out
    top = int(option(argv, "--top", 10))
    assert len(re.findall(r"^ +\d+ +\d+  \d\.\d{6} +\d\.\d{6}$", out, re.M)) == top, out
    rel = float(re.search(r"^relative L1: ([\d.]+)%$", out, re.M).group(1))
    assert rel < 10, out                   # 8-bit tiles: a few percent, not more
    assert re.search(rf"^top-{top} ranking agrees with numpy: (yes|no) ", out, re.M), out


CHECKS = {
    "classify_image.py": check_classify,
    "tiny_detector.py": check_tiny_detector,
    "detect_objects.py": check_detect,
    "camera_loop.py": check_camera_loop,
    "two_models_one_stick.py": check_two_models,
    "one_model_two_sticks.py": check_two_sticks,
    "gp_pagerank.py": check_gp_pagerank,
}


# -- the README --------------------------------------------------------------------------


def test_readme_blocks_are_commands_and_cover_every_example(tmp_path):
    assert BLOCKS, "examples/README.md shows no commands"
    shown = set()
    for block in BLOCKS:
        assert block.lang == "sh", f"{block.where}: blocks are ```sh commands"
        assert commands(block), f"{block.where}: an empty block"
        for command in commands(block):
            script = Path(argv_of(command, tmp_path)[1]).name
            assert script in CHECKS, (f"{block.where}: no check for {script}: add one to "
                                      "CHECKS in tests/test_examples.py")
            shown.add(script)
    scripts = {p.name for p in EXAMPLES.glob("*.py")}
    assert scripts == shown, f"examples without a README command: {sorted(scripts - shown)}"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The environment of the commands: one compile cache for all, as a user has."""
    env = dict(os.environ)
    env["CORALRT_CACHE_DIR"] = str(tmp_path_factory.mktemp("examples-cache"))
    env["CORALRT_RUNTIME_DIR"] = str(tmp_path_factory.mktemp("examples-run"))
    return env


@pytest.mark.parametrize("block", [pytest.param(b, id=f"line-{b.line}") for b in BLOCKS])
def test_readme_commands_run(block, tmp_path, env):
    for folder in (MODELS_DIR, IMAGES_DIR):
        if not folder.is_dir() and f"shared/{folder.name}" in block.code:
            pytest.skip(f"test data folder {folder} is absent")
    for command in commands(block):
        argv = argv_of(command, tmp_path)
        proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, (f"`{command}` exited {proc.returncode}:\n"
                                      f"{proc.stdout}{proc.stderr}")
        CHECKS[Path(argv[1]).name](argv, proc.stdout)


# -- the parts the README does not run --------------------------------------------------------


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_example_is_short_documented_and_takes_target(script):
    text = (EXAMPLES / script).read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 120, f"{script}: keep examples under 120 lines"
    assert text.startswith('"""') and "python examples/" in text, \
        f"{script}: a docstring saying how to run it"
    if script != "tiny_detector.py":       # it builds a model, runs nothing
        assert 'default="auto", choices=["auto", "sim", "coral", "cpu"]' in text, script
        assert "--target coral" in text, f"{script}: say how to run on a real stick"


def test_camera_without_opencv_is_a_clear_error(env):
    if importlib.util.find_spec("cv2") is not None:
        pytest.skip("OpenCV is installed here: the missing-cv2 message cannot be seen")
    model = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    proc = subprocess.run([sys.executable, "examples/camera_loop.py", str(model), "--camera",
                           "0", "--target", "cpu"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "--camera needs OpenCV: pip install opencv-python-headless" in proc.stderr


def test_detect_falls_back_to_the_untrained_detector_only_without_the_shared_ssd(tmp_path, env):
    """The example copied where no ../shared exists builds the tiny detector and warns."""
    shared_model("detect/coco_ssd_mobilenet_v1_1.0_quant_2018_06_29.tflite")  # skips without
    image = IMAGES_DIR / "kite_and_cold.jpg"
    folder = tmp_path / "copy" / "examples"
    folder.mkdir(parents=True)
    for name in ("detect_objects.py", "tiny_detector.py"):
        (folder / name).write_bytes((EXAMPLES / name).read_bytes())
    proc = subprocess.run([sys.executable, str(folder / "detect_objects.py"), str(image),
                           "--save", str(tmp_path / "out.png"), "--target", "cpu",
                           "--threshold", "0.3"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("WARNING: ") and "not found: using the tiny UNTRAINED" in lines[0]
    assert "model: tiny untrained detector" in proc.stdout
