"""Just-in-time compilation on load, the compiled model, and its cache."""

from __future__ import annotations

import hashlib
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
from coralrt._cli.main import main
from coralrt._formats import segment_codec as seg_format
from coralrt._compile.cache import CompileCache
from coralrt._compile.jit import jit_compile
from coralrt._compile.segments import compile_model
from coralrt._formats.opnames import SEGMENT_OP
from coralrt.errors import ModelError
from coralrt import load_model

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
    # Input and output names survive; the CPU target points to target='sim'.
    assert ([compiled.main.tensors[i].name for i in compiled.main.inputs]
            == [model.main.tensors[i].name for i in model.main.inputs])
    with pytest.raises(ModelError, match="target='sim'"):
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

    from coralrt._compile.rules import UNSPECIFIED_LIMITATION
    from coralrt.testing import ModelBuilder

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
    placement = [(o.opcode, o.unit) for o in result.plan.ops]
    assert placement[:2] == [("RELU", "cpu"), ("RELU", "cpu")]
    assert all(t == "tpu" for _, t in placement[2:])
    assert result.plan.ops[0].reason.startswith(UNSPECIFIED_LIMITATION)
    assert "on-chip memory" in result.plan.ops[0].reason
    assert load_model(result.to_bytes())  # a valid compiled model


def test_sim_session_parses_the_source_once_and_keeps_the_model_it_compiled(
        monkeypatch, tmp_path):
    from coralrt import InferenceSession
    from coralrt._model import reader

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


# -- a cache entry is bound to what it was built from ----------------------------------

HW, C = 64, 32  # big enough that the cost model offloads each convolution


def conv_model(path, seed: int, segments: int = 1):
    """1x1 convolutions with weights drawn from ``seed`` (separated by DEQUANTIZE +
    QUANTIZE when ``segments`` > 1, so each is its own Edge TPU segment): models
    with one interface and different answers."""
    from coralrt.testing import ModelBuilder

    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    shape = (1, HW, HW, C)
    x = b.input("x", shape, np.uint8, scale=0.02, zero_point=128)
    for j in range(segments):
        if j:
            f = b.tensor(f"f{j}", shape, np.float32)
            b.op("DEQUANTIZE", [x], [f])
            x = b.tensor(f"q{j}", shape, np.uint8, scale=0.05, zero_point=128)
            b.op("QUANTIZE", [f], [x])
        w = b.constant(f"w{j}", rng.integers(0, 256, (C, 1, 1, C), dtype=np.uint8),
                       scale=0.002, zero_point=128)
        bias = b.constant(f"b{j}", rng.integers(-500, 500, C).astype(np.int32),
                          scale=0.00004, zero_point=0)
        y = b.tensor(f"y{j}", shape, np.uint8, scale=0.05, zero_point=128)
        b.op("CONV_2D", [x, w, bias], [y], stride_w=1, stride_h=1, padding="SAME")
        x = y
    b.output(x)
    path.write_bytes(b.build().to_bytes())
    return path


FEED = {"x": np.random.default_rng(7).integers(0, 256, (1, HW, HW, C), np.uint8)}


def outputs_of(path, **kw) -> tuple[dict, dict]:
    """(outputs on FEED, compile_info) of a fresh sim session."""
    with InferenceSession(path, target="sim", **kw) as sess:
        return sess.run(FEED), sess.compile_info


def reference(path) -> dict:
    return outputs_of(path, cache=CompileCache(enabled=False))[0]


def entry_files(cache: CompileCache, key: str):
    d = cache.path / key[:2]
    return d / f"{key}.bin", d / f"{key}.json"


def restore(cache: CompileCache, key: str, path, data: bytes) -> None:
    """Store ``data`` under ``key`` with a valid checksum and the metadata of the
    entry there: what a build that wrote broken bytes would have left."""
    meta = json.loads(entry_files(cache, key)[1].read_text())
    reserved = ("key", "source", "size", "crc32", "created", "format")
    cache.put(key, data, {k: v for k, v in meta.items() if k not in reserved},
              source=hashlib.sha256(path.read_bytes()).hexdigest())


def assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_entry_of_another_model_copied_over_is_rebuilt_with_a_warning(tmp_path, caplog):
    a, b = conv_model(tmp_path / "a.tflite", 1), conv_model(tmp_path / "b.tflite", 2)
    cache = CompileCache(tmp_path / "cache")
    info_a, info_b = outputs_of(a, cache=cache)[1], outputs_of(b, cache=cache)[1]
    assert info_a["segments"] == info_b["segments"] == 1  # Edge TPU programs in the cache
    key_a, key_b = info_a["key"], info_b["key"]
    want_a, want_b = reference(a), reference(b)
    assert any((want_a[n] != want_b[n]).any() for n in want_a)  # B's program answers wrongly
    for src, dst in zip(entry_files(cache, key_b), entry_files(cache, key_a)):
        dst.write_bytes(src.read_bytes())  # a sync tool, an import, a bug
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        got, info = outputs_of(a, cache=cache)
    assert info["cache_hit"] is False and info["key"] == key_a
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert key_a in warning and "rebuilding" in warning
    assert_same(got, want_a)
    again, info = outputs_of(a, cache=cache)  # the rebuilt entry serves A from now on
    assert info["cache_hit"] is True
    assert_same(again, want_a)


@pytest.mark.parametrize("field", ["key", "source"])
def test_entry_with_a_tampered_binding_field_is_rebuilt(tmp_path, caplog, field):
    a, b = conv_model(tmp_path / "a.tflite", 1), conv_model(tmp_path / "b.tflite", 2)
    cache = CompileCache(tmp_path / "cache")
    key_a, key_b = outputs_of(a, cache=cache)[1]["key"], outputs_of(b, cache=cache)[1]["key"]
    bin_a, json_a = entry_files(cache, key_a)
    bin_b, json_b = entry_files(cache, key_b)
    # B's entry in A's slot, its record edited to claim A's key (or A's model).
    meta_a, meta_b = json.loads(json_a.read_text()), json.loads(json_b.read_text())
    bin_a.write_bytes(bin_b.read_bytes())
    json_a.write_text(json.dumps({**meta_b, field: meta_a[field]}))
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        got, info = outputs_of(a, cache=cache)
    assert info["cache_hit"] is False
    assert any(key_a in r.getMessage() and "rebuilding" in r.getMessage()
               for r in caplog.records)
    assert_same(got, reference(a))


def _damage_segment(seg: bytes, how: str) -> bytes:
    if how == "body byte":
        return seg[:-10] + bytes([seg[-10] ^ 0x01]) + seg[-9:]
    if how == "truncated":
        return seg[:-64]
    if how == "header version":
        return seg[:8] + (seg_format.FORMAT_VERSION + 1).to_bytes(2, "little") + seg[10:]
    if how == "not a segment":
        return b"\0" * len(seg)
    raise AssertionError(how)


@pytest.mark.parametrize("segment", [0, 1])
@pytest.mark.parametrize("how", ["body byte", "truncated", "header version", "not a segment"])
def test_corrupt_segment_in_a_checksum_valid_entry_is_rebuilt(tmp_path, caplog, how,
                                                              segment):
    # An entry as a buggy build would write it: a valid flatbuffer, a valid
    # entry checksum, and a coralrt-segment that does not decode.
    from coralrt.errors import SegmentFormatError

    path = conv_model(tmp_path / "m.tflite", 3, segments=2)
    cache = CompileCache(tmp_path / "cache")
    want, info = outputs_of(path, cache=cache)
    key = info["key"]
    bin_path, _ = entry_files(cache, key)
    compiled = load_model(bin_path.read_bytes())
    ops = [op for op in compiled.main.operators if op.name == SEGMENT_OP]
    assert len(ops) == 2
    bad = _damage_segment(bytes(ops[segment].custom_options), how)
    with pytest.raises(SegmentFormatError):
        seg_format.decode(bad)
    ops[segment].custom_options = bad
    restore(cache, key, path, compiled.to_bytes())
    stored = bin_path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        got, info = outputs_of(path, cache=cache)
    assert info["cache_hit"] is False
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "corrupt cache entry" in warning and key in warning and "rebuilding" in warning
    assert_same(got, want)
    assert bin_path.read_bytes() != stored
    again, info = outputs_of(path, cache=cache)
    assert info["cache_hit"] is True
    assert_same(again, want)


def test_cached_entry_that_is_not_a_model_is_rebuilt(tmp_path, caplog):
    path = conv_model(tmp_path / "m.tflite", 4)
    cache = CompileCache(tmp_path / "cache")
    want, info = outputs_of(path, cache=cache)
    restore(cache, info["key"], path, b"TFL3 but not a model")
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        got, info = outputs_of(path, cache=cache)
    assert info["cache_hit"] is False and "does not load" in caplog.records[0].getMessage()
    assert_same(got, want)
    assert outputs_of(path, cache=cache)[1]["cache_hit"] is True


@pytest.mark.parametrize("garble", [{"summary": 5}, {"placement": [[1]]}, {"compiler": None}],
                         ids=["summary", "placement", "compiler"])
def test_entry_with_garbled_build_description_is_rebuilt_not_a_crash(tmp_path, caplog,
                                                                     garble):
    # The description of the build (outside the entry's checksum) ends up in
    # compile_info: a record edited into nonsense is a rebuild, never a crash.
    path = conv_model(tmp_path / "m.tflite", 6)
    cache = CompileCache(tmp_path / "cache")
    want, info = outputs_of(path, cache=cache)
    _, json_path = entry_files(cache, info["key"])
    json_path.write_text(json.dumps({**json.loads(json_path.read_text()), **garble}))
    with caplog.at_level(logging.WARNING, logger="coralrt.cache"):
        got, again = outputs_of(path, cache=cache)
    assert again["cache_hit"] is False and again["summary"] == info["summary"]
    assert "corrupt cache entry" in caplog.records[0].getMessage()
    assert_same(got, want)


def test_crc32_combine_is_zlibs():
    # The segment check combines CRC-32s instead of hashing the segment bodies
    # again; the combination is zlib's crc32_combine.
    import zlib

    from coralrt._formats.crc import crc32_combine

    rng = np.random.default_rng(0)
    for n1, n2 in [(0, 0), (0, 5), (7, 0), (1, 1), (100, 3000), (4096, 65537)]:
        a, b = rng.bytes(n1), rng.bytes(n2)
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_unreadable_entry_is_a_permission_problem_and_the_session_works(tmp_path, caplog):
    from test_cache import mode, permissions_enforced

    path = conv_model(tmp_path / "m.tflite", 5)
    cache = CompileCache(tmp_path / "cache")
    want, info = outputs_of(path, cache=cache)
    bin_path, json_path = entry_files(cache, info["key"])
    with mode(bin_path, 0), permissions_enforced(), \
            caplog.at_level(logging.WARNING, logger="coralrt"):
        got, info = outputs_of(path, cache=cache)
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not any("corrupt" in m for m in messages), messages
    assert any(str(bin_path) in m and "permission denied" in m for m in messages), messages
    assert info["cache_hit"] is False
    assert_same(got, want)
    assert outputs_of(path, cache=cache)[1]["cache_hit"] is True  # nothing was deleted
