"""The rewrite stage: choosing rewrites, running them, the graph editor, plugins,
sessions and the cache key, and the reasons and limits the rules give the
operators rewrites are for.  The built-in rewrites have their own tests
(test_rewrite_gelu.py, test_rewrite_fc_split.py)."""

from __future__ import annotations

import numpy as np
import pytest

import coralrt
from coralrt import InferenceSession
from coralrt._compile.checks import WIDTH_LIMIT, WIDTH_LIMIT_GELU
from coralrt.plugins import NativeCompiler
from coralrt._compile.partition import partition
from coralrt._compile.rewrite import (
    GraphEditor, RewriteRecord, run_rewrites, select_rewrites,
)
from coralrt.errors import ConfigError, ModelError, SegmentNotMapped
from coralrt import load_model
from coralrt.testing import ModelBuilder
from coralrt.plugins._rewrite_registry import RewriteRegistry

Q = dict(scale=0.05, zero_point=0)


class AbsAsMaximum:
    """ABS of an int8 tensor with zero point 0 -> MAXIMUM(x, x * -1): the Edge TPU
    has no ABS.  Exact: x * -1 is requantized by 1/127 * 127."""

    name = "abs_as_maximum"
    version = 1
    exact = True
    order = 500
    description = "ABS -> MAXIMUM(x, -x) for int8 tensors with zero point 0"

    def apply(self, editor):
        records = []
        for i, op in editor.each("ABS"):
            x, y = op.inputs[0], op.outputs[0]
            q = editor.quant(x)
            if editor.tensor(x).dtype != np.int8 or q is None or q[1] != 0 \
                    or editor.quant(y) != q:
                continue
            minus = editor.add_constant("minus_one", np.array([-127], np.int8),
                                        scale=1 / 127, zero_point=0)
            neg = editor.like(x, f"{editor.tensor(x).name}_negated")
            editor.replace([i], [editor.make_op("MUL", [x, minus], [neg]),
                                 editor.make_op("MAXIMUM", [x, neg], [y])])
            records.append(RewriteRecord(self.name, (editor.label(i),), ("MUL", "MAXIMUM")))
        return records


class AbsPlugin:
    @coralrt.hookimpl
    def coralrt_register_rewrites(self, registry):
        registry.add(AbsAsMaximum())


def abs_model(dtype=np.int8, zero_point: int = 0) -> bytes:
    """x -> ADD(x, x) -> ABS -> ADD(., .): the ABS sits between two mappable operators."""
    b = ModelBuilder()
    q = dict(scale=0.05, zero_point=zero_point)
    x = b.input("x", (1, 8, 8, 16), dtype, **q)
    a = b.tensor("a", (1, 8, 8, 16), dtype, **q)
    m = b.tensor("m", (1, 8, 8, 16), dtype, **q)
    y = b.tensor("y", (1, 8, 8, 16), dtype, **q)
    b.op("ADD", [x, x], [a], version=2)
    b.op("ABS", [a], [m], version=2)
    b.op("ADD", [m, m], [y], version=2)
    b.output(y)
    return b.build().to_bytes()


def _x(dtype=np.int8):
    info = np.iinfo(dtype)
    return np.random.default_rng(0).integers(info.min, info.max + 1, (1, 8, 8, 16)).astype(dtype)


# -- choosing -------------------------------------------------------------------------------


class Named:
    def __init__(self, name, exact=True, order=0):
        self.name, self.exact, self.order, self.version = name, exact, order, 1
        self.description = name

    def apply(self, editor):
        return []


def test_select_rewrites_by_spec():
    available = {r.name: r for r in (Named("b", order=2), Named("a", order=2),
                                     Named("approx", exact=False, order=1))}
    assert [r.name for r in select_rewrites("exact", available)] == ["a", "b"]
    assert [r.name for r in select_rewrites("auto", available)] == ["approx", "a", "b"]
    assert select_rewrites("none", available) == [] == select_rewrites(None, available)
    # A list runs in the rewrites' own order, not the list's; duplicates once.
    assert [r.name for r in select_rewrites(["b", "approx", "b"], available)] == \
        ["approx", "b"]
    assert [r.name for r in select_rewrites("b, a", available)] == ["a", "b"]
    with pytest.raises(ConfigError, match=r"unknown rewrite\(s\) 'c'.*a, approx, b"):
        select_rewrites(["a", "c"], available)
    with pytest.raises(ConfigError, match="empty list"):
        select_rewrites(",", available)


def test_record_lines():
    r = RewriteRecord("gelu", ("GELU 7",), ("MUL", "TANH", "MUL", "MUL", "ADD"),
                      detail="int8", exact=False)
    assert r.line() == "GELU 7 -> MUL, TANH, 2 x MUL, ADD (rewrite gelu): int8 [approximation]"
    assert RewriteRecord("fc_as_conv", ("FULLY_CONNECTED 12",), ("CONV_2D",)).line() == \
        "FULLY_CONNECTED 12 -> CONV_2D (rewrite fc_as_conv)"


# -- running and editing --------------------------------------------------------------------


def test_run_rewrites_leaves_the_model_given_alone():
    model = load_model(abs_model())
    before = model.to_bytes()
    result = run_rewrites(model, [AbsAsMaximum()])
    assert model.to_bytes() == before
    assert [op.name for op in model.main.operators] == ["ADD", "ABS", "ADD"]
    assert [op.name for op in result.model.main.operators] == ["ADD", "MUL", "MAXIMUM", "ADD"]
    assert result.lines() == ["ABS 1 -> MUL, MAXIMUM (rewrite abs_as_maximum)"]
    assert result.applied == ["abs_as_maximum"]
    assert result.origin == [0, 1, 1, 2]
    # The same answers in LiteRT, bit for bit.
    from conftest import run_litert
    x = _x()
    assert np.array_equal(run_litert(result.model.to_bytes(), [x])[0],
                          run_litert(model.to_bytes(), [x])[0])


def test_rewrites_that_do_not_apply_change_nothing():
    model = load_model(abs_model(zero_point=3))          # not zero point 0: left alone
    result = run_rewrites(model, [AbsAsMaximum()])
    assert result.records == [] and result.applied == []
    assert [op.name for op in result.model.main.operators] == ["ADD", "ABS", "ADD"]


def test_editor_drops_what_nothing_uses_and_keeps_signatures():
    model = load_model(abs_model())
    editor = GraphEditor(model)
    x = editor.model.main.inputs[0]
    a = editor.ops[0].outputs[0]
    # Replace ADD -> ABS -> ADD by one ADD(x, x) into the output: a, m and the ABS go.
    y = editor.ops[2].outputs[0]
    editor.replace([0, 1, 2], [editor.make_op("ADD", [x, x], [y], version=2)])
    editor.commit()
    sg = editor.model.main
    assert [op.name for op in sg.operators] == ["ADD"]
    assert len(sg.tensors) == 2 and a not in sg.operators[0].inputs
    assert sg.tensors[sg.outputs[0]].name == "y"


def test_editor_refuses_to_orphan_a_tensor_still_read():
    editor = GraphEditor(load_model(abs_model()))
    with pytest.raises(ModelError, match="still read"):
        editor.replace([0], [])                      # the ABS still reads ADD's output
    a, m = editor.ops[1].inputs[0], editor.ops[1].outputs[0]
    editor.replace([1], [editor.make_op("RELU", [a], [m])])
    with pytest.raises(ModelError, match="replaced twice"):
        editor.replace([1], [editor.make_op("RELU", [a], [m])])


def test_editor_sorts_new_operators_into_a_valid_order():
    """New operators put where the last replaced one was may read a tensor made
    later; the commit sorts them."""
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.int8, **Q)
    p = b.tensor("p", (1, 4), np.int8, **Q)
    q = b.tensor("q", (1, 4), np.int8, **Q)
    b.op("RELU", [x], [p])
    b.op("RELU6", [x], [q])
    b.output(p, q)
    editor = GraphEditor(b.build())
    r = editor.like(x, "r")
    # Replace the RELU (index 0) by RELU(RELU6 output): it must now run after RELU6.
    editor.replace([0], [editor.make_op("RELU", [q], [p])])
    editor.commit()
    assert [editor.model.main.tensors[op.outputs[0]].name
            for op in editor.model.main.operators] == ["q", "p"]
    assert r >= 0


# -- plugins, sessions, cache ---------------------------------------------------------------


def test_a_plugin_rewrite_runs_in_a_session_and_maps_the_operator():
    data = abs_model()
    x = _x()
    want = InferenceSession(data, "cpu").run(x)
    plain = InferenceSession(data, "sim", plugins=[AbsPlugin()], rewrites="none")
    assert plain.compile_info["rewrites"] == []
    # Without the rewrite the ABS cuts the model; the ADDs alone do not pay for the
    # USB round trips.
    assert [row[0] for row in plain.compile_info["placement"]] == ["cpu"] * 3
    assert "no ABS operator" in plain.compile_info["placement"][1][2]
    sess = InferenceSession(data, "sim", plugins=[AbsPlugin()])     # "exact" by default
    assert sess.compile_info["rewrites"] == ["ABS 1 -> MUL, MAXIMUM (rewrite abs_as_maximum)"]
    assert [row[0] for row in sess.compile_info["placement"]] == ["tpu"] * 4
    assert sess.compile_info["key"] != plain.compile_info["key"]
    for out in (sess.run(x), plain.run(x)):
        assert out.keys() == want.keys()
        assert all(np.array_equal(out[k], want[k]) for k in want)
    # The cache hit says what was rewritten too.
    again = InferenceSession(data, "sim", plugins=[AbsPlugin()])
    assert again.compile_info["cache_hit"]
    assert again.compile_info["rewrites"] == sess.compile_info["rewrites"]


def test_compat_mode_and_the_cpu_target_do_not_rewrite():
    data = abs_model()
    compat = InferenceSession(data, "sim", plugins=[AbsPlugin()], partition_mode="compat")
    assert compat.compile_info["rewrites"] == []
    asked = InferenceSession(data, "sim", plugins=[AbsPlugin()], partition_mode="compat",
                             rewrites=["abs_as_maximum"])
    assert len(asked.compile_info["rewrites"]) == 1
    cpu = InferenceSession(data, "cpu", plugins=[AbsPlugin()], rewrites="auto")
    assert cpu.compile_info is None
    assert [op.name for op in cpu.model.main.operators] == ["ADD", "ABS", "ADD"]


def test_a_misspelt_rewrite_fails_on_every_target():
    for target in ("cpu", "sim"):
        with pytest.raises(ConfigError, match="unknown rewrite"):
            InferenceSession(abs_model(), target, rewrites=["abs_as_maximun"])


def test_rewrite_registry_checks_what_it_is_given():
    registry = RewriteRegistry()
    registry.add(AbsAsMaximum(), plugin="one")
    bad = Named("x")
    bad.exact = "yes"
    with pytest.raises(ConfigError, match="exact must be a bool"):
        registry.add(bad)
    with pytest.raises(ConfigError, match="has no 'name'"):
        registry.add(object())
    with pytest.raises(ConfigError, match="two plugins provide rewrite 'abs_as_maximum'"):
        registry.add(AbsAsMaximum(), plugin="two")
    assert registry.summary() == {"rewrites": ["abs_as_maximum"]}


# -- what the rules say ---------------------------------------------------------------------


def _fc(width: int, gelu: bool = False):
    b = ModelBuilder()
    x = b.input("x", (1, 64), np.int8, **Q)
    w = b.constant("w", np.ones((width, 64), np.int8), scale=0.01, zero_point=0)
    y = b.tensor("y", (1, width), np.int8, **Q)
    b.op("FULLY_CONNECTED", [x, w, -1], [y], version=4)
    if gelu:
        g = b.tensor("g", (1, width), np.int8, **Q)
        b.op("GELU", [y], [g], version=2)
        y = g
    b.output(y)
    return b.build()


def test_layer_width_limits():
    fits = partition(_fc(WIDTH_LIMIT), "multi")
    assert fits.ops[0].unit == "tpu"
    wide = partition(_fc(WIDTH_LIMIT + 1), "multi")
    assert wide.ops[0].unit == "cpu"
    assert f"{WIDTH_LIMIT + 1} outputs exceed the {WIDTH_LIMIT}" in wide.ops[0].reason
    assert "split_wide" in wide.ops[0].reason
    gelu = partition(_fc(WIDTH_LIMIT_GELU + 1, gelu=True), "multi")
    assert f"exceed the {WIDTH_LIMIT_GELU}" in gelu.ops[0].reason
    assert "followed by GELU" in gelu.ops[0].reason
    assert "exceed" not in partition(_fc(WIDTH_LIMIT_GELU, gelu=True), "multi").ops[0].reason
    assert "gelu rewrite" in gelu.ops[1].reason


def test_the_native_compiler_refuses_too_wide_layers():
    with pytest.raises(SegmentNotMapped) as e:
        NativeCompiler().compile_segment(_fc(WIDTH_LIMIT + 1))
    assert e.value.cpu_ops == [0] and "exceed" in e.value.reasons[0]
    NativeCompiler().compile_segment(_fc(64))


def test_batch_matmul_of_two_activations_says_why_it_stays_on_the_cpu():
    b = ModelBuilder()
    x = b.input("x", (1, 4, 8), np.int8, **Q)
    z = b.input("z", (1, 8, 4), np.int8, **Q)
    y = b.tensor("y", (1, 4, 4), np.int8, **Q)
    b.op("BATCH_MATMUL", [x, z], [y])
    b.output(y)
    reason = partition(b.build(), "multi").ops[0].reason
    assert reason.startswith("Operation not supported: the Edge TPU has no BATCH_MATMUL")
    assert "both operands are activations" in reason


# -- the partition command ------------------------------------------------------------------


def _fc_matrix_model(path):
    b = ModelBuilder()
    x = b.input("x", (1, 16, 64), np.int8, **Q)
    w = b.constant("w", np.arange(32 * 64).reshape(32, 64) % 7 - 3, np.int8,
                   scale=np.full(32, 0.01, np.float32), zero_point=0, axis=0)
    bias = b.constant("bias", np.zeros(32, np.int32), scale=np.full(32, 0.0005, np.float32),
                      zero_point=0)
    y = b.tensor("y", (1, 16, 32), np.int8, **Q)
    b.op("FULLY_CONNECTED", [x, w, bias], [y], version=5, keep_num_dims=True)
    b.output(y)
    path.write_bytes(b.build().to_bytes())
    return str(path)


def test_partition_command_rewrites(tmp_path, capsys):
    import json

    from coralrt._cli.main import main
    path = _fc_matrix_model(tmp_path / "fc.tflite")
    assert main(["partition", path, "--rewrites", "none"]) == 0
    out = capsys.readouterr().out
    assert "not 1-D" in out and "rewrites (" not in out
    assert main(["partition", path]) == 0                       # "exact" in multi mode
    out = capsys.readouterr().out
    assert "FULLY_CONNECTED 0 -> RESHAPE, CONV_2D, RESHAPE (rewrite fc_as_conv)" in out
    assert "Number of operations that will run on Edge TPU: 3" in out
    assert main(["partition", path, "--mode", "compat"]) == 0   # "none" in compat mode
    assert "rewrites (" not in capsys.readouterr().out
    assert main(["partition", path, "--json", "--rewrites", "fc_as_conv"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["rewrite"] for r in data["rewrites"]] == ["fc_as_conv"]
    assert data["rewrites"][0]["exact"] is True
    assert main(["partition", path, "--rewrites", "fc_as_cnv"]) != 0
    assert "unknown rewrite(s) 'fc_as_cnv'" in capsys.readouterr().err


def test_a_failing_rewrite_is_skipped_with_a_warning(caplog):
    class Broken:
        name, version, exact, order = "broken", 1, True, 400
        description = "adds a tensor, queues a replacement, then fails"

        def apply(self, editor):
            t = editor.like(editor.ops[0].outputs[0], "half_made")
            op = editor.ops[1]
            editor.replace([1], [editor.make_op("RELU", [op.inputs[0]], [t]),
                                 editor.make_op("RELU", [t], [op.outputs[0]])])
            raise RuntimeError("out of ideas")

    class Plugin:
        @coralrt.hookimpl
        def coralrt_register_rewrites(self, registry):
            registry.add(Broken())
            registry.add(AbsAsMaximum())

    model = load_model(abs_model())
    result = run_rewrites(model, [Broken(), AbsAsMaximum()])
    assert result.failed == {"broken": "RuntimeError: out of ideas"}
    assert result.applied == ["abs_as_maximum"]
    assert "half_made" not in {t.name for t in result.model.main.tensors}
    with caplog.at_level("WARNING", logger="coralrt.compile"):
        sess = InferenceSession(abs_model(), "sim", plugins=[Plugin()])
    assert "rewrite broken failed on this model and was skipped" in caplog.text
    assert len(sess.compile_info["rewrites"]) == 1
    x = _x()
    want = InferenceSession(abs_model(), "cpu").run(x)
    assert all(np.array_equal(sess.run(x)[k], want[k]) for k in want)


def test_partition_picture_lists_the_rewrites(tmp_path, capsys):
    from coralrt._cli.main import main
    path = _fc_matrix_model(tmp_path / "fc.tflite")
    page = tmp_path / "plan.html"
    assert main(["partition", path, "--html", str(page)]) == 0
    text = page.read_text()
    assert "<h2>Rewrites</h2>" in text
    assert "FULLY_CONNECTED 0 -&gt; RESHAPE, CONV_2D, RESHAPE (rewrite fc_as_conv)" in text
    assert main(["partition", path, "--rewrites", "none", "--html", str(page)]) == 0
    assert "<h2>Rewrites</h2>" not in page.read_text()


@pytest.mark.needs_litert("the rewrite is bit-identical to LiteRT's default FULLY_CONNECTED; "
                          "the numpy backend follows the reference kernel, 1 LSB apart")
def test_compile_command_rewrites(tmp_path, capsys):
    import json

    from coralrt._cli.main import main
    path = _fc_matrix_model(tmp_path / "fc.tflite")
    out = tmp_path / "fc_coralrt.tflite"
    assert main(["compile", path, "-o", str(out), "--json"]) == 0     # exact by default
    data = json.loads(capsys.readouterr().out)
    assert [r["rewrite"] for r in data["rewrites"]] == ["fc_as_conv"]
    assert data["summary"]["tpu_ops"] == 3
    x = np.random.default_rng(0).integers(-128, 128, (1, 16, 64)).astype(np.int8)
    sess = InferenceSession(str(out), "sim")              # the compiled, rewritten model
    want = InferenceSession(path, "cpu").run(x)
    assert all(np.array_equal(sess.run(x)[k], want[k]) for k in want)
    assert main(["compile", path, "-o", str(out), "--force", "--json", "--rewrites",
                 "none"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rewrites"] == [] and data["summary"]["tpu_ops"] == 0
