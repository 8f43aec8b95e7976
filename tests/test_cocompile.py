"""Whole-model compiles with edgetpu_compiler: co-compilation and ``--num-segments``.

No real edgetpu_compiler is installed here: ``tests/support/fake_edgetpu_compiler.py``
plays it (see its docstring).  These tests check coralrt's side only: the command
lines the compiler receives (recorded by the stand-in through
``FAKE_EDGETPU_ARGV_LOG``), the files written, the merge of the segments and how
a session runs the results.  Whether the real compiler balances segments well,
and whether co-compiled models share the parameter cache on a real stick, can
only be checked on real hardware.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import MODELS_DIR, random_inputs, shared_model

from coralrt import InferenceSession, _config as config
from coralrt._cli.main import main
from coralrt._compile.whole import merge_segments
from coralrt.errors import ModelError
from coralrt._formats.opnames import EDGETPU_OP
from coralrt import load_model

FAKE = Path(__file__).parent / "support" / "fake_edgetpu_compiler.py"
V1 = "mobilenet_v1_0.25_128_quant"
DEEPLAB = "deeplabv3_mnv2_dm05_pascal_quant"


def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(0o755)
    return path


@pytest.fixture
def env(tmp_path, monkeypatch):
    for name in ("FAKE_EDGETPU_HANG", "FAKE_EDGETPU_FAIL", "FAKE_EDGETPU_PIDFILE"):
        monkeypatch.delenv(name, raising=False)
    fake = _script(tmp_path / "bin" / "edgetpu_compiler",
                   f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    monkeypatch.setenv(config.EDGETPU_COMPILER, str(fake))
    monkeypatch.setenv(config.EDGETPU_COMPILER_TIMEOUT, "60")
    monkeypatch.setenv("FAKE_EDGETPU_MODELS", str(MODELS_DIR))
    monkeypatch.setenv("FAKE_EDGETPU_ARGV_LOG", str(tmp_path / "argv.jsonl"))
    monkeypatch.chdir(tmp_path)
    from coralrt.plugins import _host as plugins
    plugins.reset()
    yield monkeypatch
    plugins.reset()  # the process-wide host must not keep this test's compiler


def _calls(tmp_path) -> list[list[str]]:
    """The compile command lines the stand-in received (``--version`` calls left out)."""
    path = tmp_path / "argv.jsonl"
    if not path.is_file():
        return []
    return [a for a in map(json.loads, path.read_text().splitlines()) if a != ["--version"]]


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _customs(model) -> list:
    return [op for op in model.main.operators if op.name == EDGETPU_OP]


def _package(name: str) -> bytes:
    (op,) = _customs(load_model(shared_model(f"edgetpu/{name}_edgetpu.tflite")))
    return bytes(op.custom_options)


def _names(sg, idxs) -> list[str]:
    return [sg.tensors[t].name for t in idxs]


# -- co-compilation ---------------------------------------------------------------------

@pytest.mark.parametrize("order", [("mobilenet_v1_0.25_128_quant", "split_concat"),
                                   ("split_concat", "mobilenet_v1_0.25_128_quant")])
def test_co_compilation_is_one_call_with_the_models_in_order(env, tmp_path, capsys, order):
    srcs = [shared_model(f"{n}.tflite") for n in order]
    code, out, err = cli(capsys, "compile", "--compiler", "edgetpu_compiler", *srcs,
                         "-o", tmp_path / "out")
    assert code == 0, err
    (argv,) = _calls(tmp_path)
    assert argv[:2] == ["-s", "-o"] and Path(argv[2]).name == "out"
    assert Path(argv[2]) != tmp_path / "out"          # the compiler writes to a temp folder
    assert argv[3:] == ["-t", "60", *map(str, srcs)]
    assert "2 models co-compiled in one run" in out
    for name in order:
        compiled = load_model(tmp_path / "out" / f"{name}_edgetpu.tflite")
        (op,) = _customs(compiled)
        assert bytes(op.custom_options) == _package(name)
        text = (tmp_path / "out" / f"{name}_edgetpu.log").read_text()
        assert f"Input model: {shared_model(name + '.tflite')}" in text
        assert "Mapped to Edge TPU" in text and "Operator" in text
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        f"{n}_edgetpu.{ext}" for n in order for ext in ("tflite", "log"))


def test_co_compilation_default_folder_json_and_unmapped_model(env, tmp_path, capsys):
    srcs = [shared_model(f"{V1}.tflite"), shared_model("add_quantized_uint8.tflite")]
    code, out, err = cli(capsys, "compile", "--compiler", "edgetpu_compiler", *srcs, "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["co_compiled"] is True and r["mode"] == "compat" and r["num_segments"] == 1
    assert r["command"][1:4] == ["-s", "-o", r["command"][3]]
    assert [Path(o["output"]) for o in r["outputs"]] == [
        tmp_path / f"{V1}_edgetpu.tflite", tmp_path / "add_quantized_uint8_edgetpu.tflite"]
    assert [o["edgetpu_ops"] for o in r["outputs"]] == [1, 0]
    assert r["outputs"][1]["cpu_ops"] == 2 and r["outputs"][0]["cpu_ops"] == 0
    # The model the compiler mapped nothing of is written as the compiler left it.
    assert [op.name for op in load_model(tmp_path / "add_quantized_uint8_edgetpu.tflite")
            .main.operators] == ["ADD", "ADD"]


# -- num_segments ------------------------------------------------------------------------

def test_num_segments_command_line_and_files(env, tmp_path, capsys):
    src = shared_model(f"{V1}.tflite")
    code, out, err = cli(capsys, "compile", "--compiler", "edgetpu_compiler",
                         "--num-segments", "3", src, "-o", tmp_path / "o" / "v1.tflite")
    assert code == 0, err
    (argv,) = _calls(tmp_path)
    assert argv[:2] == ["-s", "-o"] and argv[3:] == ["-n", "3", "-t", "60", str(src)]
    names = sorted(p.name for p in (tmp_path / "o").iterdir())
    assert names == sorted(["v1.tflite", "v1.log"] + [
        f"{V1}_segment_{i}_of_3_edgetpu.{ext}" for i in range(3) for ext in ("tflite", "log")])
    assert "whole model, 3 segments" in out
    assert out.count("Segment: ") == 3


@pytest.mark.parametrize("name,n", [(V1, 2), (V1, 3), ("split_concat", 3), (DEEPLAB, 4),
                                    ("keras_lstm_mnist_ptq", 2)])
def test_merged_segments_run_like_the_plain_model(env, tmp_path, capsys, name, n):
    src = shared_model(f"{name}.tflite")
    code, _, err = cli(capsys, "compile", "--compiler", "edgetpu_compiler",
                       "--num-segments", n, src)
    assert code == 0, err
    plain = load_model(src)
    merged = load_model(tmp_path / f"{name}_edgetpu.tflite")
    segments = [load_model(tmp_path / f"{name}_segment_{i}_of_{n}_edgetpu.tflite")
                for i in range(n)]
    # N segments, each a consecutive run of the plain model's operators, in order.
    assert all(len(s.main.operators) >= 1 for s in segments)
    assert sum(len(s.main.operators) for s in segments) == len(plain.main.operators)
    assert [op.name for op in merged.main.operators] == \
        [op.name for s in segments for op in s.main.operators] == \
        [op.name for op in plain.main.operators]
    assert [_names(merged.main, op.outputs) for op in merged.main.operators] == \
        [_names(plain.main, op.outputs) for op in plain.main.operators]
    assert _names(merged.main, merged.main.inputs) == _names(plain.main, plain.main.inputs)
    assert _names(merged.main, merged.main.outputs) == _names(plain.main, plain.main.outputs)
    # The stand-in's pieces are plain operators: the merged model computes exactly the same.
    want = InferenceSession(src, target="cpu")
    got = InferenceSession(tmp_path / f"{name}_edgetpu.tflite", target="cpu")
    for seed in (0, 1):
        x = random_inputs(want.get_inputs(), seed)
        a, b = want.run(x), got.run(x)
        assert list(a) == list(b)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_num_segments_balances_parameter_bytes(env, tmp_path, capsys):
    # The stand-in's cut, not the real compiler's: the plumbing is what is checked.
    src = shared_model(f"{V1}.tflite")
    assert cli(capsys, "compile", "--compiler", "edgetpu_compiler", "--num-segments", "2",
               src)[0] == 0

    def params(m):
        sg = m.main
        return sum(t.nbytes for t in sg.tensors if t.is_constant)

    a, b = (load_model(tmp_path / f"{V1}_segment_{i}_of_2_edgetpu.tflite") for i in range(2))
    total = params(load_model(src))
    assert abs(params(a) - params(b)) < total / 2


def test_num_segments_one_compiles_the_whole_model_without_n(env, tmp_path, capsys):
    src = shared_model(f"{V1}.tflite")
    code, out, err = cli(capsys, "compile", "--compiler", "edgetpu_compiler",
                         "--num-segments", "1", src)
    assert code == 0, err
    (argv,) = _calls(tmp_path)
    assert "-n" not in argv and argv[-1] == str(src)
    (op,) = _customs(load_model(tmp_path / f"{V1}_edgetpu.tflite"))
    assert bytes(op.custom_options) == _package(V1)


# -- merge_segments ----------------------------------------------------------------------

def _deeplab_pieces():
    compiled = load_model(shared_model(f"edgetpu/{DEEPLAB}_edgetpu.tflite"))
    n = len(compiled.main.operators)
    return compiled, [compiled.extract([0]), compiled.extract(range(1, n))]


def test_merge_segments_of_a_compiled_model_joins_by_tensor_name():
    compiled, pieces = _deeplab_pieces()
    for plain in (compiled, None):
        merged = load_model(merge_segments(pieces, plain).to_bytes())
        sg, csg = merged.main, compiled.main
        assert [op.name for op in sg.operators] == [op.name for op in csg.operators]
        assert [op.name for op in sg.operators].count(EDGETPU_OP) == 1
        assert [_names(sg, op.inputs) for op in sg.operators] == \
            [_names(csg, op.inputs) for op in csg.operators]
        assert _names(sg, sg.inputs) == _names(csg, csg.inputs)
        assert _names(sg, sg.outputs) == _names(csg, csg.outputs)
        assert bytes(_customs(merged)[0].custom_options) == bytes(_customs(compiled)[0]
                                                                 .custom_options)


def test_merge_segments_refuses_a_segment_input_nobody_produces():
    compiled, (head, tail) = _deeplab_pieces()
    with pytest.raises(ModelError, match="no earlier segment produces"):
        merge_segments([tail, head], compiled)
    with pytest.raises(ModelError, match="produces .* again"):
        merge_segments([head, head, tail])
    with pytest.raises(ModelError, match="no segments"):
        merge_segments([])


def test_merged_model_pipelines_over_sticks_and_extra_sticks_stay_idle(caplog):
    # The merged model of a compiled model cut after its Edge TPU operator, pipelined
    # (one segment would replicate by default): one TPU step, so one stage on usb:0 (with the CPU tail); usb:1 stays
    # idle and the log says so.  The simulated sticks answer placeholder bytes for
    # Google's programs (test mode of tests/support/sim.py): shapes, not values.
    from support.sim import accept_dwn1

    from coralrt.testing import SimulatedBackend
    from coralrt import open_device

    compiled, pieces = _deeplab_pieces()
    data = merge_segments(pieces, compiled).to_bytes()
    bus = accept_dwn1(SimulatedBackend(n_devices=2, firmware_loaded=True, time_scale=0.0,
                                       lock_scope="process"))
    sticks = [open_device("usb:0", backend=bus), open_device("usb:1", backend=bus)]
    try:
        with caplog.at_level(logging.INFO, logger="coralrt.pipeline"):
            sess = InferenceSession(data, target="coral", device=sticks, strategy="pipeline")
        assert "stay(s) idle" in caplog.text and "usb:1" in caplog.text
        out = sess.run(random_inputs(sess.get_inputs()))
        assert out["ArgMax"].shape == (1, 513, 513)
        rows = sess.profile()
        assert [(r["kind"], r["stage"], r["device"]) for r in rows] == [
            ("tpu", 0, sticks[0].path), ("cpu", 0, sticks[0].path)]
        sess.close()
    finally:
        for stick in sticks:
            stick.close()


# -- errors ---------------------------------------------------------------------------------

def _error(capsys, *argv) -> str:
    code, out, err = cli(capsys, "compile", *argv)
    assert code != 0 and err.startswith("coralrt: error: "), (code, out, err)
    return err


def test_usage_errors(env, tmp_path, capsys):
    v1, sc = shared_model(f"{V1}.tflite"), shared_model("split_concat.tflite")
    err = _error(capsys, v1, sc)
    assert "co-compilation of several models is an edgetpu_compiler feature" in err
    assert "--num-segments is an edgetpu_compiler feature" in _error(
        capsys, "--num-segments", "2", v1)
    err = _error(capsys, "--compiler", "edgetpu_compiler", "--num-segments", "2", v1, sc)
    assert "--num-segments takes one model" in err and "does not allow" in err
    for n in ("0", "-3"):
        assert "at least 1" in _error(capsys, "--compiler", "edgetpu_compiler",
                                      "--num-segments", n, v1)
    assert "--mode multi does not apply" in _error(
        capsys, "--compiler", "edgetpu_compiler", "--mode", "multi", v1, sc)
    assert "-o names an output folder" in _error(
        capsys, "--compiler", "edgetpu_compiler", v1, sc, "-o", tmp_path / "x.tflite")
    other = tmp_path / "other"
    other.mkdir()
    (other / f"{V1}.tflite").write_bytes(v1.read_bytes())
    assert "outputs would collide" in _error(capsys, "--compiler", "edgetpu_compiler", v1,
                                             other / f"{V1}.tflite")
    assert _calls(tmp_path) == []       # none of these ran the compiler


def test_compiled_input_is_refused(env, tmp_path, capsys):
    err = _error(capsys, "--compiler", "edgetpu_compiler", shared_model(f"{V1}.tflite"),
                 shared_model(f"edgetpu/{DEEPLAB}_edgetpu.tflite"))
    assert "already compiled by edgetpu_compiler" in err
    assert _calls(tmp_path) == []


def test_compiler_failure(env, tmp_path, capsys):
    env.setenv("FAKE_EDGETPU_FAIL", "1")
    err = _error(capsys, "--compiler", "edgetpu_compiler", shared_model(f"{V1}.tflite"),
                 shared_model("split_concat.tflite"))
    assert "exit status 1" in err and "Internal compiler error" in err
    assert not list(tmp_path.glob("*_edgetpu.*"))


@pytest.mark.parametrize("segments", [None, "2"])
def test_compiler_that_writes_nothing(env, tmp_path, capsys, segments):
    _script(tmp_path / "bin2" / "edgetpu_compiler",
            "#!/bin/sh\necho 'Edge TPU Compiler version 16.0.384591198'\n"
            "echo 'Compilation succeeded!'\n")
    env.setenv(config.EDGETPU_COMPILER, str(tmp_path / "bin2" / "edgetpu_compiler"))
    v1 = shared_model(f"{V1}.tflite")
    if segments:
        err = _error(capsys, "--compiler", "edgetpu_compiler", "--num-segments", segments, v1)
        want = [f"{V1}_segment_{i}_of_2_edgetpu.tflite" for i in range(2)]
    else:
        err = _error(capsys, "--compiler", "edgetpu_compiler", v1,
                     shared_model("split_concat.tflite"))
        want = [f"{V1}_edgetpu.tflite", "split_concat_edgetpu.tflite"]
    assert f"did not write {', '.join(want)}" in err
    assert "Compilation succeeded!" in err        # the log tail
    assert not list(tmp_path.glob("*.tflite"))


def test_compiler_output_that_is_not_a_model(env, tmp_path, capsys):
    _script(tmp_path / "bin3" / "edgetpu_compiler",
            "#!/bin/sh\necho 'Edge TPU Compiler version 16.0.384591198'\n"
            'for a; do d="$o"; o="$a"; [ "$d" = "-o" ] && out="$a"; done\n'
            f'echo garbage > "$out/{V1}_edgetpu.tflite"\n'
            'echo garbage > "$out/split_concat_edgetpu.tflite"\n')
    env.setenv(config.EDGETPU_COMPILER, str(tmp_path / "bin3" / "edgetpu_compiler"))
    err = _error(capsys, "--compiler", "edgetpu_compiler", shared_model(f"{V1}.tflite"),
                 shared_model("split_concat.tflite"))
    assert f"wrote {V1}_edgetpu.tflite, which does not load as a TFLite model" in err


def test_existing_output_needs_force(env, tmp_path, capsys):
    v1, sc = shared_model(f"{V1}.tflite"), shared_model("split_concat.tflite")
    (tmp_path / "split_concat_edgetpu.tflite").write_bytes(b"mine")
    err = _error(capsys, "--compiler", "edgetpu_compiler", v1, sc)
    assert "split_concat_edgetpu.tflite exists; pass --force" in err
    assert _calls(tmp_path) == [] and not (tmp_path / f"{V1}_edgetpu.tflite").exists()
    seg = tmp_path / f"{V1}_segment_1_of_2_edgetpu.tflite"
    seg.write_bytes(b"mine too")
    err = _error(capsys, "--compiler", "edgetpu_compiler", "--num-segments", "2", v1)
    assert f"{seg.name} exists; pass --force" in err
    assert seg.read_bytes() == b"mine too" and _calls(tmp_path) == []
    assert cli(capsys, "compile", "--compiler", "edgetpu_compiler", v1, sc, "--force")[0] == 0
    assert load_model(tmp_path / "split_concat_edgetpu.tflite").is_edgetpu_compiled
    assert cli(capsys, "compile", "--compiler", "edgetpu_compiler", "--num-segments", "2", v1,
               "--force")[0] == 0
    load_model(seg)


# -- the round trip: compiled on x86, run with target="coral" as is ----------------------------

def _sim_stick():
    from support.sim import dwn1_backend

    from coralrt import open_device
    backend = dwn1_backend(time_scale=0.0, lock_scope="process")
    return backend, open_device(None, backend)


def _check_ran_on_the_stick(path: Path, backend, stick, out_shapes: dict) -> None:
    from coralrt._formats.dwn1 import parse_package, select_executables

    model = load_model(path)
    (op,) = _customs(model)
    cache, run = select_executables(parse_package(bytes(op.custom_options)))
    start = len(backend.transcript)
    sess = InferenceSession(path, target="coral", device=stick)
    out = sess.run(random_inputs(sess.get_inputs()))
    assert {k: v.shape for k, v in out.items()} == out_shapes
    rows = sess.profile()
    assert [r["kind"] for r in rows] == ["tpu"] and "note" not in rows[0]
    sent = [e for e in list(backend.transcript)[start:] if e["op"] == "bulk_out"]
    # The program's instruction streams went to the stick as raw (DWN1) streams, and
    # its parameters with them (the parameter-caching executable, or the run's own).
    assert any(e.get("kind") == "raw" and e["tag"] == 0 for e in sent)
    params = (cache or run).parameters_bytes
    assert params > 0 and any(e["tag"] == 2 and e["length"] == params for e in sent)
    assert any(e["tag"] == 1 for e in sent)           # the input went in
    sess.close()


def test_compile_on_x86_then_run_with_target_coral_as_is(env, tmp_path, capsys):
    # `coralrt compile --compiler edgetpu_compiler m.tflite -o m_coral.tflite` on the
    # compile machine; the file runs with target="coral" on the Pi with no recompile.
    out = tmp_path / "m_coral.tflite"
    code, _, err = cli(capsys, "compile", "--compiler", "edgetpu_compiler",
                       shared_model(f"{V1}.tflite"), "-o", out)
    assert code == 0, err
    env.delenv(config.EDGETPU_COMPILER)
    env.setenv("PATH", "/nonexistent")              # the Pi has no edgetpu_compiler
    backend, stick = _sim_stick()
    try:
        _check_ran_on_the_stick(out, backend, stick,
                                {"MobilenetV1/Predictions/Reshape_1": (1, 1001)})
    finally:
        stick.close()


def test_co_compiled_outputs_run_with_target_coral(env, tmp_path, capsys):
    code, _, err = cli(capsys, "compile", "--compiler", "edgetpu_compiler",
                       shared_model(f"{V1}.tflite"), shared_model("split_concat.tflite"))
    assert code == 0, err
    env.delenv(config.EDGETPU_COMPILER)
    env.setenv("PATH", "/nonexistent")
    backend, stick = _sim_stick()
    try:
        _check_ran_on_the_stick(tmp_path / f"{V1}_edgetpu.tflite", backend, stick,
                                {"MobilenetV1/Predictions/Reshape_1": (1, 1001)})
        sc = load_model(tmp_path / "split_concat_edgetpu.tflite").main
        _check_ran_on_the_stick(tmp_path / "split_concat_edgetpu.tflite", backend, stick,
                                {sc.tensors[t].name: sc.tensors[t].shape for t in sc.outputs})
    finally:
        stick.close()
