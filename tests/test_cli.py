"""The ``coralrt`` command line, run in-process through ``main(argv)``."""

from __future__ import annotations

import json
import re
import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import MODELS_DIR, REPO_ROOT, model_params, shared_model

import coralrt
from coralrt import InferenceSession, TensorInfo
from coralrt.errors import COMPILER_HELP
from coralrt._cli.main import main
from coralrt._cli.run_cmd import random_input
from coralrt.testing import build_demo_model, demo_input
from coralrt._formats.opnames import SEGMENT_OP
from coralrt import load_model
from coralrt.testing import ModelBuilder

MOBILENET = "mobilenet_v1_0.25_128_quant.tflite"
# Files that are not valid models at all: inspect must refuse them.
UNREADABLE = {"invalid/broken_model.tflite", "invalid/not_a_model.bin",
              "invalid/empty_model.tflite"}
ALL_FILES = sorted(str(p.relative_to(MODELS_DIR)) for p in MODELS_DIR.rglob("*")
                   if p.suffix in (".tflite", ".bin")) if MODELS_DIR.is_dir() else []


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err: str, *fragments: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("coralrt: error: ")
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0]


# -- global options ------------------------------------------------------------

def test_version(capsys):
    code, out, _ = cli(capsys, "--version")
    assert code == 0
    assert out.strip() == f"coralrt {coralrt.__version__}"


def test_python_m_coralrt_version():
    proc = subprocess.run([sys.executable, "-m", "coralrt", "--version"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"coralrt {coralrt.__version__}"


def test_help_lists_commands(capsys):
    code, out, _ = cli(capsys, "--help")
    assert code == 0
    for command in ("inspect", "run", "demo"):
        assert command in out
    code, out, _ = cli(capsys, "run", "--help")
    assert code == 0 and "--repeat" in out and "--input" in out


@pytest.mark.parametrize("argv", [
    [], ["frobnicate"], ["inspect"], ["run", "m.tflite", "--repeat", "0"],
    ["run", "m.tflite", "--warmup", "-1"], ["run", "m.tflite", "--target", "gpu"],
])
def test_usage_errors_exit_2(capsys, argv):
    code, _, err = cli(capsys, *argv)
    assert code == 2
    assert "usage:" in err


def test_logging_handler_is_removed_after_main(capsys):
    logger = logging.getLogger("coralrt")
    before = list(logger.handlers), logger.level
    cli(capsys, "demo", "--runs", "1")
    assert (list(logger.handlers), logger.level) == before


# -- inspect -------------------------------------------------------------------

def test_inspect_text(capsys):
    path = shared_model(MOBILENET)
    code, out, err = cli(capsys, "inspect", path)
    assert code == 0, err
    assert "edgetpu compiled  no" in out
    assert "1x128x128x3" in out and "0.0078125" in out
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()
            if line.strip().startswith(("CONV_2D ", "DEPTHWISE_CONV_2D "))}
    assert rows == {"CONV_2D": "15", "DEPTHWISE_CONV_2D": "13"}


def test_inspect_json(capsys):
    path = shared_model(MOBILENET)
    code, out, _ = cli(capsys, "inspect", path, "--json")
    assert code == 0
    r = json.loads(out)
    assert r["path"] == str(path)
    assert r["size_bytes"] == path.stat().st_size
    assert r["edgetpu_compiled"] is False
    assert (r["subgraphs"], r["tensors"]) == (1, 89)
    assert r["operators"] == {"CONV_2D": 15, "DEPTHWISE_CONV_2D": 13, "AVERAGE_POOL_2D": 1,
                              "RESHAPE": 1, "SOFTMAX": 1}
    assert r["custom_ops"] == [] and r["custom_op_count"] == 0
    assert 0 < r["parameter_bytes"] < r["size_bytes"]
    sess = InferenceSession(path)
    assert r["inputs"] == [t.to_dict() for t in sess.get_inputs()]
    assert r["outputs"] == [t.to_dict() for t in sess.get_outputs()]
    assert r["inputs"][0]["quantization"] == {"scale": 0.0078125, "zero_point": 128}


def test_inspect_edgetpu_model(capsys):
    path = shared_model("edgetpu/deeplabv3_mnv2_dm05_pascal_quant_edgetpu.tflite")
    code, out, _ = cli(capsys, "inspect", path, "--json")
    r = json.loads(out)
    assert code == 0 and r["edgetpu_compiled"] is True
    assert r["custom_ops"] == ["edgetpu-custom-op"] and r["custom_op_count"] == 1
    assert r["operators"]["RESIZE_BILINEAR"] == 3
    code, out, _ = cli(capsys, "inspect", path)
    assert "yes (1 edgetpu-custom-op)" in out


def test_inspect_custom_op_and_signatures(capsys):
    r = json.loads(cli(capsys, "inspect", shared_model("custom_sinh.tflite"), "--json")[1])
    assert r["custom_ops"] == ["Sinh"] and r["edgetpu_compiled"] is False
    r = json.loads(cli(capsys, "inspect", shared_model("multi_signatures.tflite"),
                       "--json")[1])
    assert r["subgraphs"] == 2 and len(r["signatures"]) == 2


def test_inspect_per_channel_output(capsys, tmp_path):
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.float32)
    y = b.tensor("y", (1, 3), np.int8, scale=[0.5, 0.25, 0.125], zero_point=0, axis=1)
    w = b.constant("w", np.ones((3, 4), np.float32))
    z = b.tensor("z", (1, 3), np.float32)
    b.op("FULLY_CONNECTED", [x, w, -1], [z])
    b.op("QUANTIZE", [z], [y])
    b.output(y)
    path = tmp_path / "pc.tflite"
    path.write_bytes(b.build().to_bytes())
    r = json.loads(cli(capsys, "inspect", path, "--json")[1])
    q = r["outputs"][0]["quantization"]
    assert q["scales"] == [0.5, 0.25, 0.125] and q["quantized_dimension"] == 1
    assert r["parameter_bytes"] == 3 * 4 * 4
    _, out, _ = cli(capsys, "inspect", path)
    assert "per-channel (3 scales, axis 1)" in out


@pytest.mark.parametrize("name", model_params(ALL_FILES))
def test_inspect_every_shared_file(capsys, name):
    path = shared_model(name)
    code, out, err = cli(capsys, "inspect", path, "--json")
    if name in UNREADABLE:
        assert code == 1 and out == ""
        assert_one_line_error(err, str(path))
    else:
        assert code == 0, err
        r = json.loads(out)
        assert r["edgetpu_compiled"] == name.startswith("edgetpu/")
        assert sum(r["operators"].values()) == r["operator_count"] > 0


# -- errors --------------------------------------------------------------------

@pytest.mark.parametrize("command", ["inspect", "run"])
@pytest.mark.parametrize("name", ["invalid/not_a_model.bin", "invalid/broken_model.tflite"])
def test_invalid_model_is_one_line(capsys, command, name):
    code, out, err = cli(capsys, command, shared_model(name))
    assert code == 1 and out == ""
    assert_one_line_error(err, "not a valid TFLite flatbuffer")


def test_missing_file(capsys, tmp_path):
    code, _, err = cli(capsys, "inspect", tmp_path / "nope.tflite")
    assert code == 1
    assert_one_line_error(err, "not found", "nope.tflite")


def test_debug_shows_traceback(capsys):
    code, _, err = cli(capsys, "--debug", "inspect", shared_model("invalid/not_a_model.bin"))
    assert code == 1
    assert "Traceback (most recent call last)" in err and "ModelError" in err
    assert err.strip().splitlines()[-1].startswith("coralrt: error: ")
    # The flag is also accepted after the command.
    code, _, err2 = cli(capsys, "inspect", shared_model("invalid/not_a_model.bin"), "--debug")
    assert code == 1 and "Traceback" in err2


def test_error_as_subprocess_is_one_line():
    path = shared_model("invalid/not_a_model.bin")
    proc = subprocess.run([sys.executable, "-m", "coralrt", "inspect", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert_one_line_error(proc.stderr, "not a valid TFLite flatbuffer")


def test_compiled_model_on_cpu_is_refused(capsys):
    path = shared_model("edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite")
    code, _, err = cli(capsys, "run", path)
    assert code == 1
    assert_one_line_error(err, "edgetpu_compiler")


# -- compile -------------------------------------------------------------------

# A process that runs `coralrt compile ARGS` RUNS times, starting at a start
# line (a file) after its imports, so that two of them write together; its exit
# status is the number of runs that failed.
_COMPILE_WORKER = """
import sys, time
from pathlib import Path
from coralrt._cli.main import main
line, name, runs, argv = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4:]
(line / f"ready-{name}").touch()
while not (line / "go").exists():
    time.sleep(0.001)
sys.exit(sum(main(argv) != 0 for _ in range(runs)))    # how many runs failed
"""


def test_concurrent_compiles_to_one_output_leave_one_complete_model(tmp_path, capsys):
    src = shared_model(MOBILENET)
    out_dir = tmp_path / "out"
    out = out_dir / "m_coralrt.tflite"
    code, _, err = cli(capsys, "compile", src, "-o", out)          # the expected bytes
    assert code == 0, err
    want = out.read_bytes()
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), CORALRT_CACHE_DIR=str(tmp_path / "cache"))
    for round_ in range(2):
        line = tmp_path / f"round{round_}"
        line.mkdir()
        procs = [subprocess.Popen([sys.executable, "-c", _COMPILE_WORKER, str(line), str(i), "25",
                                   "compile", str(src), "-o", str(out), "--force"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env) for i in range(2)]
        deadline = time.monotonic() + 120
        while len(list(line.glob("ready-*"))) < 2 and time.monotonic() < deadline \
                and all(p.poll() is None for p in procs):
            time.sleep(0.005)
        (line / "go").touch()
        seen = []                   # what a reader finds at OUT while both write
        while any(p.poll() is None for p in procs):
            seen.append(out.read_bytes() == want)
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
        assert all(seen), f"round {round_}: {seen.count(False)} of {len(seen)} reads incomplete"
        assert not out.is_symlink() and out.read_bytes() == want, f"round {round_}"
        load_model(out)
        assert "Number of Edge TPU subgraphs: 1" in out.with_suffix(".log").read_text()
        assert sorted(f.name for f in out_dir.iterdir()) == ["m_coralrt.log",
                                                             "m_coralrt.tflite"]


def test_compile_does_not_write_through_a_symlink_at_the_old_temporary_name(tmp_path, capsys):
    src = shared_model(MOBILENET)
    out = tmp_path / "out" / "m_coralrt.tflite"
    out.parent.mkdir()
    victim, victim_log = tmp_path / "victim", tmp_path / "victim.log"
    victim.write_bytes(b"not yours")
    victim_log.write_bytes(b"not yours either")
    # The old code wrote OUT + ".tmp" (a fixed name) and renamed it onto OUT; the
    # log it wrote in place.
    planted = out.with_name(out.name + ".tmp")
    planted.symlink_to(victim)
    out.with_suffix(".log").symlink_to(victim_log)
    ref = tmp_path / "ref.tflite"
    code, _, err = cli(capsys, "compile", src, "-o", ref)
    assert code == 0, err
    code, _, err = cli(capsys, "compile", src, "-o", out)
    assert code == 0, err
    assert victim.read_bytes() == b"not yours"
    assert victim_log.read_bytes() == b"not yours either"
    assert out.is_file() and not out.is_symlink()
    assert out.read_bytes() == ref.read_bytes()
    assert [op.name for op in load_model(out).main.operators] == [SEGMENT_OP]
    log_path = out.with_suffix(".log")
    assert not log_path.is_symlink() and "Operator" in log_path.read_text()
    assert planted.is_symlink() and planted.resolve() == victim.resolve()   # left alone
    compiled = out.read_bytes()
    # An existing output is still refused without --force, and left as it was.
    code, _, err = cli(capsys, "compile", src, "-o", out)
    assert code == 1 and "--force" in err
    assert out.read_bytes() == compiled and victim.read_bytes() == b"not yours"
    code, _, err = cli(capsys, "compile", src, "-o", out, "--force")
    assert code == 0, err
    assert out.read_bytes() == compiled and victim.read_bytes() == b"not yours"


# -- run -----------------------------------------------------------------------

def run_json(capsys, *argv) -> dict:
    code, out, err = cli(capsys, "run", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.mark.needs_litert
def test_run_json(capsys):
    path = shared_model(MOBILENET)
    r = run_json(capsys, path, "--repeat", "3", "--warmup", "0", "--threads", "1")
    assert r["target"] == "cpu" and r["backend"] == "litert"
    lat = r["latency_ms"]
    assert lat["runs"] == 3
    assert 0 < lat["min"] <= lat["median"] and lat["mean"] > 0
    (name, s), = r["outputs"].items()
    assert name == "MobilenetV1/Predictions/Reshape_1"
    assert s["shape"] == [1, 1001] and s["dtype"] == "uint8"
    assert s["min"] <= s["mean"] <= s["max"]
    values = [t["value"] for t in s["top5"]]
    assert len(values) == 5 and values == sorted(values, reverse=True)
    assert values[0] == s["max"]
    assert s["top5"][0]["dequantized"] == pytest.approx(values[0] / 256)


def test_run_input_npy_matches_session(capsys, tmp_path):
    path = shared_model(MOBILENET)
    x = np.random.default_rng(7).integers(0, 256, size=(1, 128, 128, 3), dtype=np.uint8)
    np.save(tmp_path / "x.npy", x)
    r = run_json(capsys, path, "--input", tmp_path / "x.npy", "--repeat", "1")
    expected = InferenceSession(path).run(x)["MobilenetV1/Predictions/Reshape_1"].reshape(-1)
    s = r["outputs"]["MobilenetV1/Predictions/Reshape_1"]
    assert (s["min"], s["max"]) == (int(expected.min()), int(expected.max()))
    assert s["mean"] == pytest.approx(float(expected.mean()))
    order = np.argsort(-expected.astype(float), kind="stable")[:5]
    assert [t["index"] for t in s["top5"]] == order.tolist()
    assert r["inputs"] == [{"name": "input", "source": str(tmp_path / "x.npy")}]


def test_run_random_inputs_are_seeded(capsys):
    path = shared_model(MOBILENET)
    a = run_json(capsys, path, "--repeat", "1", "--seed", "3")["outputs"]
    b = run_json(capsys, path, "--repeat", "1", "--seed", "3")["outputs"]
    c = run_json(capsys, path, "--repeat", "1", "--seed", "4")["outputs"]
    assert a == b and a != c


def test_run_text(capsys):
    code, out, _ = cli(capsys, "run", shared_model(MOBILENET), "--repeat", "2")
    assert code == 0
    assert "top-5 of MobilenetV1/Predictions/Reshape_1" in out
    assert "latency  min" in out and "(2 runs after 1 warmup)" in out


def test_run_several_inputs(capsys, tmp_path):
    path = shared_model("split_concat.tflite")
    infos = InferenceSession(path).get_inputs()
    files = []
    for i, info in enumerate(infos):
        files.append(tmp_path / f"in{i}.npy")
        np.save(files[-1], np.full(info.shape, 10 * (i + 1), info.dtype))
    r = run_json(capsys, path, *[a for f in files for a in ("--input", f)], "--repeat", "1")
    assert len(r["outputs"]) == 5
    assert [i["source"] for i in r["inputs"]] == [str(f) for f in files]
    code, _, err = cli(capsys, "run", path, "--input", files[0])
    assert code == 1
    assert_one_line_error(err, "3 input(s)", "1 time(s)")


@pytest.mark.parametrize("bad,fragment", [
    (np.zeros((1, 10, 10, 3), np.uint8), "expects shape [1, 128, 128, 3]"),
    (np.zeros((1, 128, 128, 3), np.float32), "expects dtype uint8"),
])
def test_run_wrong_npy_is_input_error(capsys, tmp_path, bad, fragment):
    np.save(tmp_path / "bad.npy", bad)
    code, out, err = cli(capsys, "run", shared_model(MOBILENET), "--input", tmp_path / "bad.npy")
    assert code == 1 and out == ""
    assert_one_line_error(err, fragment)


def test_run_not_an_npy_file(capsys, tmp_path):
    (tmp_path / "x.npy").write_text("hello")
    code, _, err = cli(capsys, "run", shared_model(MOBILENET), "--input", tmp_path / "x.npy")
    assert code == 1
    assert_one_line_error(err, "not a .npy file")
    code, _, err = cli(capsys, "run", shared_model(MOBILENET), "--input", tmp_path / "no.npy")
    assert code == 1
    assert_one_line_error(err, "no.npy", "No such file")


def test_run_unavailable_target(capsys, monkeypatch):
    # A plain model on a real stick needs edgetpu_compiler, which is not installed here
    # (a stick is said to be attached: without one, that is said first).
    import coralrt._usb
    monkeypatch.setattr(coralrt._usb, "list_devices", lambda *a, **k: [object()])
    code, _, err = cli(capsys, "run", shared_model(MOBILENET), "--target", "coral")
    assert code == 1
    lines = err.strip().splitlines()
    assert lines[0].startswith("coralrt: error: ") and "Traceback" not in err
    # The install steps keep their lines, each command whole and paste-able,
    # and no URL is split.
    assert any(line.startswith("  curl -fsSL https://packages.cloud.google.com/apt/doc/"
                               "apt-key.gpg | sudo gpg --dearmor") for line in lines)
    assert any(line.strip() == "sudo apt-get update && sudo apt-get install edgetpu-compiler"
               for line in lines)
    for url in re.findall(r"https?://\S+", err):
        assert url in COMPILER_HELP


def test_run_auto_target_logs_at_info(capsys):
    code, out, err = cli(capsys, "-v", "run", shared_model(MOBILENET), "--target", "auto",
                         "--repeat", "1", "--json")
    assert code == 0 and json.loads(out)["target"] == "cpu"
    assert "target 'auto'" in err


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32])
def test_random_input_spans_integer_range(dtype):
    info = TensorInfo(name="x", shape=(64, 64), dtype=np.dtype(dtype))
    a = random_input(info, np.random.default_rng(0))
    assert a.dtype == dtype and a.shape == (64, 64)
    ii = np.iinfo(dtype)
    if ii.bits <= 8:
        assert (a.min(), a.max()) == (ii.min, ii.max)
    else:
        assert a.min() < ii.min // 2 and a.max() > ii.max // 2


def test_random_input_float_is_standard_normal():
    info = TensorInfo(name="x", shape=(100, 100), dtype=np.dtype(np.float32))
    a = random_input(info, np.random.default_rng(0))
    assert a.dtype == np.float32
    assert abs(a.mean()) < 0.05 and abs(a.std() - 1) < 0.05


# -- demo ----------------------------------------------------------------------

@pytest.mark.needs_litert
def test_demo(capsys, tmp_path):
    save = tmp_path / "demo.tflite"
    code, out, err = cli(capsys, "demo", "--save", save, "--runs", "5")
    assert code == 0, err
    assert save.read_bytes() == build_demo_model().to_bytes()
    lines = out.splitlines()
    assert sum(line.rstrip().endswith("Edge TPU segment 0 (simulated)") for line in lines) == 7
    assert "estimated on a Coral USB Accelerator" in out
    top = lines[lines.index("top-5 classes of the synthetic input") + 2:][:5]
    ranks = [line.split() for line in top]
    assert [int(r[0]) for r in ranks] == [1, 2, 3, 4, 5]
    sess = InferenceSession(build_demo_model())
    probs = sess.get_outputs()[0].dequantize(sess.run(demo_input())["probabilities"])[0]
    assert int(ranks[0][1]) == int(np.argmax(probs))
    assert float(ranks[0][2]) == pytest.approx(probs.max(), abs=1e-4)
    assert "over 5 runs" in out
    code, out, err = cli(capsys, "demo", "--target", "cpu", "--runs", "2")
    assert code == 0, err
    assert sum(line.rstrip().endswith("cpu (litert)") for line in out.splitlines()) == 7
