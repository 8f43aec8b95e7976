"""Just-in-time compilation on load, the compiled model, and its cache."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import REPO_ROOT, random_inputs, shared_model

from coralrt import InferenceSession
from coralrt.cli.main import main
from coralrt.formats import segment_codec as seg_format
from coralrt.compile.cache import CompileCache
from coralrt.compile.jit import jit_compile
from coralrt.compile.driver import compile_model
from coralrt.formats.opnames import SEGMENT_OP
from coralrt.errors import ModelError, UnsupportedOperatorError
from coralrt.model import load_model

MODEL = "deeplabv3_mnv2_dm05_pascal_quant.tflite"


def sim_session_info(path, **kw) -> dict:
    return InferenceSession(path, target="sim", **kw).compile_info


def test_first_load_compiles_second_load_hits_the_cache():
    path = shared_model(MODEL)
    first = sim_session_info(path)
    second = sim_session_info(path)
    assert first["cache_hit"] is False and second["cache_hit"] is True
    assert first["key"] == second["key"] and len(first["key"]) == 64
    assert first["compile_seconds"] > 0 and second["compile_seconds"] > 0
    assert first["segments"] == second["segments"] == 2
    assert second["placement"][64][0] == "cpu"


def test_the_key_depends_on_mode_and_model():
    keys = {sim_session_info(shared_model(MODEL), partition_mode="compat")["key"],
            sim_session_info(shared_model(MODEL), partition_mode="multi")["key"],
            sim_session_info(shared_model("mobilenet_v1_0.25_128_quant.tflite"))["key"]}
    assert len(keys) == 3


def test_cache_can_be_disabled(monkeypatch):
    monkeypatch.setenv("CORALRT_CACHE", "0")
    path = shared_model("split_concat.tflite")
    assert not sim_session_info(path)["cache_hit"]
    assert not sim_session_info(path)["cache_hit"]


def test_cache_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("CORALRT_CACHE_DIR", str(tmp_path / "here"))
    info = sim_session_info(shared_model("split_concat.tflite"))
    assert info["cache_dir"].startswith(str(tmp_path / "here"))
    assert list((tmp_path / "here").rglob(f"{info['key']}.bin"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "garble_json"])
def test_corrupt_entry_is_a_logged_miss_and_is_rebuilt(tmp_path, caplog, damage):
    cache = CompileCache(tmp_path)
    model = load_model(shared_model("split_concat.tflite"))
    first = jit_compile(model.source, cache=cache)
    key = first.compile_info["key"]
    (bin_path,) = tmp_path.rglob(f"{key}.bin")
    json_path = bin_path.with_suffix(".json")
    data = bin_path.read_bytes()
    if damage == "truncate":
        bin_path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        bin_path.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        json_path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        again = jit_compile(model.source, cache=cache)
    assert again.compile_info["cache_hit"] is False
    assert any("corrupt" in r.getMessage() for r in caplog.records)
    assert bin_path.read_bytes() == data  # rebuilt, identical
    assert jit_compile(model.source, cache=cache).compile_info["cache_hit"] is True


def test_compiled_model_is_valid_tflite_with_segment_ops():
    model = load_model(shared_model(MODEL))
    result = compile_model(model)
    compiled = load_model(result.to_bytes())
    names = [op.name for op in compiled.main.operators]
    assert names == [SEGMENT_OP, "RESIZE_BILINEAR", SEGMENT_OP, "ARG_MAX"]
    for op in compiled.main.operators:
        if op.name == SEGMENT_OP:
            seg = seg_format.decode(bytes(op.custom_options))
            assert len(seg.ops) in (64, 6)
    # Input and output names survive; LiteRT loads it and fails only on the custom op.
    assert ([compiled.main.tensors[i].name for i in compiled.main.inputs]
            == [model.main.tensors[i].name for i in model.main.inputs])
    with pytest.raises(UnsupportedOperatorError, match=SEGMENT_OP):
        InferenceSession(compiled)


def test_compiled_edgetpu_models_are_refused_by_the_native_compiler():
    with pytest.raises(ModelError, match="edgetpu_compiler"):
        InferenceSession(shared_model("edgetpu/split_concat_edgetpu.tflite"), target="sim")


_WORKER = """
import sys, time
from pathlib import Path
from coralrt import InferenceSession
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
info = InferenceSession(sys.argv[1], target="sim").compile_info
print(info["cache_hit"], info["key"])
"""


def test_four_processes_compile_the_same_model_once(tmp_path):
    env = dict(os.environ, CORALRT_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=str(REPO_ROOT))
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(shared_model(MODEL)), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(4)]
    time.sleep(1.0)  # let every process import and wait at the start line
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    results = [o.split() for o, _ in outs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert sorted(r[0] for r in results) == ["False", "True", "True", "True"]
    assert len({r[1] for r in results}) == 1


def test_compile_cli_writes_model_and_log(tmp_path, capsys):
    out = tmp_path / "d_coralrt.tflite"
    assert main(["compile", str(shared_model(MODEL)), "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Number of Edge TPU subgraphs: 2" in text
    log_text = out.with_suffix(".log").read_text()
    assert "Operator" in log_text and "ARG_MAX" in log_text and "Mapped to Edge TPU" in log_text
    assert [op.name for op in load_model(out).main.operators].count(SEGMENT_OP) == 2
    assert main(["compile", str(shared_model(MODEL)), "-o", str(out)]) == 1  # exists
    assert main(["compile", str(shared_model(MODEL)), "-o", str(out), "--mode", "compat",
                 "--force"]) == 0
    assert [op.name for op in load_model(out).main.operators].count(SEGMENT_OP) == 1


def test_cache_cli_sees_jit_entries(capsys):
    sim_session_info(shared_model("split_concat.tflite"))
    assert main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 1
    assert main(["cache", "clear"]) == 0
    capsys.readouterr()
    assert main(["cache", "info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 0


def test_a_changed_model_file_is_compiled_again(tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(shared_model("split_concat.tflite").read_bytes())
    first = sim_session_info(path)
    assert not first["cache_hit"] and sim_session_info(path)["cache_hit"]
    # Same size, one byte different (a letter of a tensor name): the stored
    # digest must not be reused.
    data = path.read_bytes()
    at = data.index(b"input")
    path.write_bytes(data[:at] + b"Input" + data[at + 5:])
    changed = sim_session_info(path)
    assert not changed["cache_hit"] and changed["key"] != first["key"]
    # Back to the original bytes: the original entry serves it again.
    path.write_bytes(shared_model("split_concat.tflite").read_bytes())
    again = sim_session_info(path)
    assert again["cache_hit"] and again["key"] == first["key"]


def test_segments_whose_activations_overflow_the_chip_are_split():
    import numpy as np

    from coralrt.compile.rules import UNSPECIFIED_LIMITATION
    from coralrt.model.builder import ModelBuilder

    b = ModelBuilder()
    q = dict(scale=0.02, zero_point=128)
    x = b.input("x", (1, 65, 1024, 64), np.uint8, **q)  # 4.06 MiB: two do not fit in 8 MiB
    for k in range(2):
        y = b.tensor(f"y{k}", (1, 65, 1024, 64), np.uint8, **q)
        b.op("RELU", [x], [y])
        x = y
    z = b.tensor("z", (1, 65, 1024, 16), np.uint8, **q)
    b.op("STRIDED_SLICE", [x, b.constant("b", np.zeros(4, np.int32)),
                           b.constant("e", np.array([1, 65, 1024, 16], np.int32)),
                           b.constant("s", np.ones(4, np.int32))], [z])
    for k in range(3):
        y = b.tensor(f"w{k}", (1, 65, 1024, 16), np.uint8, **q)
        b.op("RELU", [z], [y])
        z = y
    b.output(z)
    result = compile_model(b.build())
    placement = [(o.opcode, o.target) for o in result.plan.ops]
    assert placement[:2] == [("RELU", "cpu"), ("RELU", "cpu")]
    assert all(t == "tpu" for _, t in placement[2:])
    assert result.plan.ops[0].reason.startswith(UNSPECIFIED_LIMITATION)
    assert "on-chip memory" in result.plan.ops[0].reason
    assert load_model(result.to_bytes())  # a valid compiled model


def test_sim_session_parses_the_source_once_and_keeps_the_model_it_compiled(
        monkeypatch, tmp_path):
    from coralrt import InferenceSession
    from coralrt.model import reader

    parsed = []
    real = reader.validate
    monkeypatch.setattr(reader, "validate", lambda m: (parsed.append(m), real(m))[1])
    cache = CompileCache(tmp_path)
    path = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    first = InferenceSession(path, target="sim", cache=cache)
    # The miss parses the source once; the compiled model is used as built, not read back.
    assert first.compile_info["cache_hit"] is False and len(parsed) == 1
    parsed.clear()
    second = InferenceSession(path, target="sim", cache=cache)
    # The hit parses only the cached compiled model, never the source.
    assert second.compile_info["cache_hit"] is True and len(parsed) == 1
    assert parsed[0].main.operators[0].name == "coralrt-segment"
    x = random_inputs(first.get_inputs(), seed=4)
    for name, value in first.run(x).items():
        np.testing.assert_array_equal(value, second.run(x)[name])
    first.close()
    second.close()
