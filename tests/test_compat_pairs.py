"""Compat mode against edgetpu_compiler: real plain/compiled pairs, the compat rules
on small built models (each side of each boundary), the pair matching and
``tools/compat_pairs.py``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import MODELS_DIR, REPO_ROOT, extra_model_paths, model_params

from coralrt._compile import compat_rules as C
from coralrt._compile import rules as R
from coralrt._compile.pairs import (
    PairError, compare_models, compare_pair, compiler_mapping, find_pairs, plain_for,
)
from coralrt._compile.partition import partition
from coralrt.testing import ModelBuilder

sys.path.insert(0, str(REPO_ROOT / "tools"))
import compat_pairs  # noqa: E402

EDGETPU_OP = "edgetpu-custom-op"


# -- every real pair ---------------------------------------------------------------------


def shared_pairs() -> list:
    if not MODELS_DIR.is_dir():
        return model_params([], width=2)
    pairs, _ = find_pairs([MODELS_DIR])
    return [pytest.param(plain, compiled, id=plain.name) for plain, compiled in pairs]


def _assert_agrees(plain, compiled):
    report = compare_pair(plain, compiled)
    assert report.error is None, report.error
    assert report.diffs == []
    assert report.agree and report.compat_tpu_ops == report.compiler_tpu_ops


@pytest.mark.parametrize("plain, compiled", shared_pairs())
def test_compat_maps_what_edgetpu_compiler_mapped_on_shared_pairs(plain, compiled):
    _assert_agrees(plain, compiled)


def test_shared_models_hold_the_expected_pairs():
    if not MODELS_DIR.is_dir():
        pytest.skip(f"{MODELS_DIR} is absent")
    pairs, _ = find_pairs([MODELS_DIR])
    names = {p.name for p, _ in pairs}
    assert {"deeplabv3_mnv2_dm05_pascal_quant.tflite", "keras_lstm_mnist_ptq.tflite",
            "mobilenet_v1_0.25_128_quant.tflite", "mobilenet_v2_1.0_224_quant.tflite",
            "split_concat.tflite"} <= names


@pytest.mark.parametrize("compiled", extra_model_paths(compiled=True))
def test_compat_maps_what_edgetpu_compiler_mapped_on_extra_pairs(compiled):
    plain = plain_for(compiled)
    if plain is None:
        pytest.skip(f"no plain model beside {compiled.name}")
    _assert_agrees(plain, compiled)


# -- small models -------------------------------------------------------------------------


def u8(b, name, shape, scale=0.1, zp=128):
    return b.tensor(name, shape, np.uint8, scale=scale, zero_point=zp)


def placements(model, mode="compat"):
    return {o.index: o for o in partition(model, mode).ops}


def tile_model(multiples, constant=True, shape=(1, 1, 1, 8)):
    b = ModelBuilder()
    x = b.input("x", shape, np.uint8, scale=0.1, zero_point=128)
    if constant:
        m = b.constant("multiples", np.array(multiples, np.int32))
    else:
        m = b.input("multiples", (len(multiples),), np.int32)
    out = tuple(d * k for d, k in zip(shape, multiples))
    y = u8(b, "y", out)
    b.op("TILE", [x, m], [y])
    b.output(y)
    return b.build()


def test_tile_maps_in_compat_mode_with_constant_multiples():
    assert placements(tile_model([1, 33, 33, 1]))[0].unit == "tpu"


def test_tile_stays_on_cpu_in_multi_mode():
    # TILE is an observation of edgetpu_compiler (a compat rule): multi mode keeps
    # the published table.
    op = placements(tile_model([1, 33, 33, 1]), "multi")[0]
    assert op.unit == "cpu" and op.reason.startswith(R.UNSUPPORTED_OP)


@pytest.mark.parametrize("multiples, constant, status, words", [
    # Non-constant multiples are int32 activations; tiling the batch gives batch 2.
    ([1, 4, 4, 1], False, R.UNSUPPORTED_TYPE, "INT32"),
    ([2, 4, 4, 1], True, R.UNSPECIFIED_LIMITATION, "batch size must be 1"),
])
def test_tile_limits(multiples, constant, status, words):
    op = placements(tile_model(multiples, constant))[0]
    assert op.unit == "cpu" and op.reason.startswith(status) and words in op.reason


def test_compat_rules_copy_the_registry_and_keep_plugin_rules():
    base = R.default_rules()
    base.add_op("TILE", R.OpSupport(1, (lambda v: "plugin: no",)))
    big = resize_model(LIMIT // 2, LIMIT)
    view = R.OpView(big.main, big.main.operators[0], 0)
    compat = C.compat_rules(base)
    assert base.check(view) is None and compat.check(view) is not None
    tile = tile_model([1, 2, 2, 1])
    assert compat.check(R.OpView(tile.main, tile.main.operators[0], 0)) == "plugin: no"


def resize_model(src, dst, op="RESIZE_BILINEAR", align=False, half=False, channels=4):
    b = ModelBuilder()
    x = b.input("x", (1, src, src, channels), np.uint8, scale=0.1, zero_point=128)
    size = b.constant("size", np.array([dst, dst], np.int32))
    y = u8(b, "y", (1, dst, dst, channels))
    b.op(op, [x, size], [y], align_corners=align, half_pixel_centers=half)
    b.output(y)
    return b.build()


LIMIT = C.RESIZE_OUTPUT_EXTENT_LIMIT


@pytest.mark.parametrize("op", ["RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"])
@pytest.mark.parametrize("src, dst, align, half, unit", [
    (LIMIT // 2, LIMIT, False, True, "cpu"),        # 2x to the limit
    ((LIMIT - 1) // 3, LIMIT - 1, False, False, "tpu"),   # 3x to one below it
    (33, 513, True, False, "cpu"),                  # DeepLab's final resize
    (24, 48, False, True, "tpu"),                   # MoveNet's upsampling
    (33, 33, True, False, "tpu"),                   # identity
    (LIMIT + 44, LIMIT + 44, False, False, "tpu"),  # identity beyond the limit: no resizing
])
def test_resize_output_extent_in_compat_mode(op, src, dst, align, half, unit):
    placed = placements(resize_model(src, dst, op, align, half))[0]
    assert placed.unit == unit, placed.reason
    if unit == "cpu":
        assert placed.reason.startswith(R.UNSPECIFIED_LIMITATION) and str(dst) in placed.reason


def test_resize_output_extent_is_compat_only():
    assert placements(resize_model(LIMIT // 2, LIMIT), "multi")[0].unit == "tpu"


@pytest.mark.parametrize("mode", ["compat", "multi"])
def test_resize_of_one_pixel_with_align_corners_stays_on_cpu(mode):
    # DeepLab's image pooling (1x1 -> 33x33, align_corners) stays on the CPU in every
    # DeepLab v3 pair: (out - 1) / (in - 1) is no ratio at all.
    placed = placements(resize_model(1, 33, align=True), mode)[0]
    assert placed.unit == "cpu" and "integer ratio" in placed.reason


def quantize_model(in_dtype, out_dtype, in_scale=0.1, out_scale=0.2):
    b = ModelBuilder()
    q_in = {} if in_dtype == np.float32 else {"scale": in_scale, "zero_point": 0}
    x = b.input("x", (1, 4, 4, 8), in_dtype, **q_in)
    y = b.tensor("y", (1, 4, 4, 8), out_dtype, scale=out_scale, zero_point=0)
    b.op("QUANTIZE", [x], [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("in_dtype, out_dtype, unit", [
    (np.uint8, np.uint8, "tpu"),    # requantize (DeepLab cityscapes, op 77)
    (np.int8, np.int8, "tpu"),      # requantize (MoveNet, op 104)
    (np.uint8, np.int8, "tpu"),     # 8-bit type change (keras LSTM, PoseNet, BodyPix)
    (np.float32, np.int8, "cpu"),   # from float (MoveNet input)
])
def test_quantize_maps_from_eight_bit_only(in_dtype, out_dtype, unit):
    assert placements(quantize_model(in_dtype, out_dtype))[0].unit == unit


def branch_model():
    """x -> RELU a -> ABS (no Edge TPU op) -> RELU c; a -> RELU d, after ABS in order."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8), np.uint8, scale=0.1, zero_point=128)
    a, cut, c, d = (u8(b, n, (1, 4, 4, 8)) for n in "a cut c d".split())
    b.op("RELU", [x], [a])
    b.op("ABS", [a], [cut])
    b.op("RELU", [cut], [c])
    b.op("RELU", [a], [d])
    b.output(c, d)
    return b.build()


def test_supported_operator_after_a_cpu_operator_that_follows_tpu_work_stays_on_cpu():
    by = placements(branch_model())
    assert by[0].unit == "tpu" and by[1].unit == "cpu"
    assert by[2].unit == "cpu" and by[2].reason == R.SECOND_SUBGRAPH


def test_independent_branch_after_the_cut_in_model_order_still_maps():
    # MoveNet: operators 100-104 and 106-111 follow CPU operators 89-99 in model
    # order but do not depend on them, and edgetpu_compiler mapped them.
    assert placements(branch_model())[3].unit == "tpu"


def test_cpu_operator_fed_by_model_inputs_only_does_not_cut():
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8), np.float32)
    q, y, z = (u8(b, n, (1, 4, 4, 8)) for n in "q y z".split())
    b.op("QUANTIZE", [x], [q])
    b.op("RELU", [q], [y])
    b.op("RELU", [y], [z])
    b.output(z)
    by = placements(b.build())
    assert [by[i].unit for i in range(3)] == ["cpu", "tpu", "tpu"]


# -- matching a compiled model to its plain model ------------------------------------------


def plain_and_compiled(*, rename=False, keep_relu_on_cpu=False):
    """plain: x -> RELU a -> ABS y; compiled: custom op x -> a, then ABS."""
    p = ModelBuilder()
    x = p.input("x", (1, 4, 4, 8), np.uint8, scale=0.1, zero_point=128)
    a, y = u8(p, "a", (1, 4, 4, 8)), u8(p, "y", (1, 4, 4, 8))
    p.op("RELU", [x], [a])
    p.op("ABS", [a], [y])
    p.output(y)
    c = ModelBuilder()
    cx = c.input("x", (1, 4, 4, 8), np.uint8, scale=0.1, zero_point=128)
    ca = u8(c, "a_renamed" if rename else "a", (1, 4, 4, 8))
    cy = u8(c, "y", (1, 4, 4, 8))
    if keep_relu_on_cpu:
        c.op("RELU", [cx], [ca])
    else:
        c.op(EDGETPU_OP, [cx], [ca], custom_options=b"\0")
    c.op("ABS", [ca], [cy])
    c.output(cy)
    return p.build(), c.build()


def test_compiler_mapping_from_the_cpu_operators_of_the_compiled_model():
    m = compiler_mapping(*plain_and_compiled())
    assert (m.tpu, m.cpu, m.segments, m.notes) == ({0}, {1}, [{0}], [])


def test_compiler_mapping_with_renamed_segment_tensors_checks_shapes():
    m = compiler_mapping(*plain_and_compiled(rename=True))
    assert (m.tpu, m.cpu, m.segments) == ({0}, {1}, [None])
    assert "renamed" in m.notes[0]


def test_compiler_mapping_refuses_a_compiled_model_of_another_model():
    plain, _ = plain_and_compiled()
    other = ModelBuilder()
    x = other.input("x", (1, 4, 4, 8), np.uint8, scale=0.1, zero_point=128)
    y = u8(other, "y", (1, 4, 4, 8))
    other.op("LOGISTIC", [x], [y])
    other.output(y)
    with pytest.raises(PairError, match="LOGISTIC"):
        compiler_mapping(plain, other.build())


def test_disagreement_names_each_operator():
    report = compare_models(*plain_and_compiled(keep_relu_on_cpu=True))
    assert not report.agree
    assert (report.compiler_tpu_ops, report.compat_tpu_ops) == (0, 1)
    [d] = report.diffs
    assert (d.index, d.opcode, d.edgetpu_compiler, d.compat, d.reason) == (
        0, "RELU", "cpu", "tpu", R.MAPPED)


def _chain(names, compiled_units):
    """plain: x -> names[0] -> names[1] ...; compiled: the operators whose unit is
    "tpu" replaced by one edgetpu-custom-op (a prefix), the rest kept."""
    p, c = ModelBuilder(), ModelBuilder()
    px = p.input("x", (1, 4, 4, 8), np.uint8, scale=0.1, zero_point=128)
    cx = c.input("x", (1, 4, 4, 8), np.uint8, scale=0.1, zero_point=128)
    n_tpu = compiled_units.count("tpu")
    assert compiled_units[:n_tpu] == ["tpu"] * n_tpu
    prev_p, prev_c = px, cx
    for k, name in enumerate(names):
        t_p, t_c = u8(p, f"t{k}", (1, 4, 4, 8)), u8(c, f"t{k}", (1, 4, 4, 8))
        p.op(name, [prev_p], [t_p])
        if k >= n_tpu:
            c.op(name, [prev_c], [t_c])
        elif k == n_tpu - 1:
            c.op(EDGETPU_OP, [cx], [t_c], custom_options=b"\0")
        prev_p, prev_c = t_p, t_c
    p.output(prev_p)
    c.output(prev_c)
    return p.build(), c.build()


def test_each_disagreement_says_why_in_both_directions():
    # The compiler mapped ABS, which coralrt keeps on the CPU: coralrt's reason.
    report = compare_models(*_chain(["RELU", "ABS"], ["tpu", "tpu"]))
    [d] = report.diffs
    assert (d.index, d.edgetpu_compiler, d.compat) == (1, "tpu", "cpu")
    assert d.why == ("Google's compiler mapped it; coralrt keeps it on the CPU because: "
                     + d.reason)
    assert d.reason.startswith(R.UNSUPPORTED_OP)
    # The compiler left both RELUs on the CPU: the first for no stated reason, the
    # second after it.
    report = compare_models(*_chain(["RELU", "RELU6"], ["cpu", "cpu"]))
    first, second = report.diffs
    assert "passes every check coralrt applies to it: eight_bit, static_shapes" in first.why
    assert first.why.startswith("Google's compiler left it on the CPU; coralrt maps it "
                                "because RELU (version 1, the Edge TPU takes up to 3)")
    assert second.why.startswith("Google's compiler left it on the CPU, after operator 0 "
                                 "(RELU) upstream; coralrt maps it because it maps operator 0")


# -- the tool -----------------------------------------------------------------------------


def write_pair(folder: Path, stem: str, **kw) -> None:
    plain, compiled = plain_and_compiled(**kw)
    (folder / "edgetpu").mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.tflite").write_bytes(plain.to_bytes())
    (folder / "edgetpu" / f"{stem}_edgetpu.tflite").write_bytes(compiled.to_bytes())


def test_tool_agreeing_pairs_exit_zero(tmp_path, capsys):
    write_pair(tmp_path, "good")
    (tmp_path / "lonely_edgetpu.tflite").write_bytes(plain_and_compiled()[1].to_bytes())
    assert compat_pairs.main([str(tmp_path), "-v"]) == 0
    out = capsys.readouterr().out
    assert "agree" in out and "good.tflite" in out and "1/2, compat 1/2" in out
    assert "skipped" in out and "lonely_edgetpu.tflite" in out


def test_tool_disagreement_exits_one_and_lists_the_operator(tmp_path, capsys):
    write_pair(tmp_path, "good")
    write_pair(tmp_path, "bad", keep_relu_on_cpu=True)
    assert compat_pairs.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    line = next(s for s in out.splitlines() if s.lstrip().startswith("op "))
    assert "RELU" in line and "edgetpu_compiler: cpu" in line and "compat: tpu" in line
    assert R.MAPPED in line
    assert compat_pairs.main([str(tmp_path), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["agree"] is False
    bad = next(p for p in data["pairs"] if p["plain"].endswith("bad.tflite"))
    [diff] = bad["diffs"]
    assert diff == {"index": 0, "opcode": "RELU", "edgetpu_compiler": "cpu",
                    "compat": "tpu", "reason": R.MAPPED, "why": diff["why"]}
    assert diff["why"].startswith("Google's compiler left it on the CPU; coralrt maps it "
                                  "because RELU")


def test_tool_reports_a_pair_it_cannot_match(tmp_path, capsys):
    plain, _ = plain_and_compiled()
    other = ModelBuilder()
    x = other.input("x", (1, 4, 4, 8), np.uint8, scale=0.1, zero_point=128)
    y = u8(other, "y", (1, 4, 4, 8))
    other.op("LOGISTIC", [x], [y])
    other.output(y)
    (tmp_path / "m.tflite").write_bytes(plain.to_bytes())
    (tmp_path / "m_edgetpu.tflite").write_bytes(other.build().to_bytes())
    assert compat_pairs.main([str(tmp_path)]) == 1
    assert "ERROR" in capsys.readouterr().out


def test_tool_without_pairs_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit) as e:
        compat_pairs.main([str(tmp_path)])
    assert e.value.code == 2
