"""Edge TPU support rules and the partitioner."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import MODELS_DIR, model_params, random_inputs, run_litert, shared_model

from coralrt._cli.main import main
from coralrt._compile import rules as R
from coralrt._compile.pairs import compiler_mapping
from coralrt._compile.partition import partition
from coralrt.errors import ConfigError
from coralrt import load_model
from coralrt.testing import ModelBuilder
from coralrt._model.extract import extract


def compiled_pairs() -> list:
    """(plain, compiled) names for every compiled model whose plain model is present."""
    if not MODELS_DIR.is_dir():
        return model_params([])
    names = []
    for p in sorted((MODELS_DIR / "edgetpu").glob("*_edgetpu.tflite")):
        plain = p.name.replace("_edgetpu.tflite", ".tflite")
        if (MODELS_DIR / plain).is_file():
            names.append(plain)
    return model_params(names)


def cpu_ops_of_compiled(plain_name: str) -> set[int]:
    """Operators of the plain model that edgetpu_compiler left on the CPU."""
    compiled = "edgetpu/" + plain_name.replace(".tflite", "_edgetpu.tflite")
    return compiler_mapping(load_model(shared_model(plain_name)),
                            load_model(shared_model(compiled))).cpu


@pytest.mark.parametrize("name", compiled_pairs())
def test_compat_mode_maps_what_edgetpu_compiler_mapped(name):
    model = load_model(shared_model(name))
    plan = partition(model, "compat")
    want_cpu = cpu_ops_of_compiled(name)
    got_cpu = {o.index for o in plan.ops if o.unit == "cpu"}
    assert got_cpu == want_cpu
    assert len(plan.segments) == (1 if len(want_cpu) < len(model.main.operators) else 0)


def test_compat_cut_on_deeplab_names_each_reason():
    plan = partition(load_model(shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite")),
                     "compat")
    by = {o.index: o for o in plan.ops}
    assert by[64].opcode == "RESIZE_BILINEAR"
    assert by[64].reason.startswith(R.UNSPECIFIED_LIMITATION)
    # Supported operators after the cut stay on the CPU, as the compiler does.
    assert by[67].opcode == "CONV_2D" and by[67].reason == R.SECOND_SUBGRAPH
    assert by[71].reason.startswith(R.UNSUPPORTED_OP)
    assert plan.summary["tpu_ops"] == 64 and plan.summary["cpu_ops"] == 8


def test_multi_mode_maps_more_than_compat_and_segments_are_convex():
    model = load_model(shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite"))
    compat, multi = partition(model, "compat"), partition(model, "multi")
    assert set(compat.tpu_ops) < set(multi.tpu_ops)
    assert len(multi.segments) == 2
    sg = model.main
    producer = {t: i for i, op in enumerate(sg.operators) for t in op.outputs}
    seg_of = {o.index: o.segment for o in multi.ops}

    def ancestors(i, seen=None):
        seen = set() if seen is None else seen
        for t in sg.operators[i].inputs:
            p = producer.get(t)
            if p is not None and p not in seen:
                seen.add(p)
                ancestors(p, seen)
        return seen

    # No path leaves a segment through a CPU operator and comes back into it.
    for i, op in enumerate(sg.operators):
        if seg_of[i] is None:
            continue
        for a in ancestors(i):
            if seg_of[a] is None and any(seg_of[b] == seg_of[i] for b in ancestors(a)):
                pytest.fail(f"segment {seg_of[i]} is not convex at operator {i}")


@pytest.mark.parametrize("mode", ["compat", "multi"])
def test_segments_and_cpu_pieces_reproduce_the_model(mode):
    model = load_model(shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite"))
    plan = partition(model, mode)
    sg = model.main
    # Run each segment and each CPU operator as its own model, in plan order.
    steps: list[list[int]] = []
    done: set[int] = set()
    seg_by_op = {i: s for s in plan.segments for i in s.ops}
    for o in plan.ops:
        if o.index in done:
            continue
        ops = seg_by_op[o.index].ops if o.index in seg_by_op else [o.index]
        steps.append(ops)
        done.update(ops)
    feeds = random_inputs([sg.tensors[i] for i in sg.inputs], seed=4)
    values = dict(zip(sg.inputs, feeds))
    for ops in steps:
        piece = extract(model, ops)
        values.update(zip(piece.outputs, run_litert(piece.model.to_bytes(),
                                                    [values[t] for t in piece.inputs])))
    for t, want in zip(sg.outputs, run_litert(model.source, feeds)):
        np.testing.assert_array_equal(values[t], want)


def test_cost_model_drops_segments_that_only_move_data():
    plan = partition(load_model(shared_model(
        "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite")), "multi")
    reshapes = [o for o in plan.ops if o.opcode == "RESHAPE"]
    assert reshapes and all(o.unit == "cpu" and o.reason.startswith("Not offloaded")
                            for o in reshapes)
    post = next(o for o in plan.ops if o.opcode == "TFLite_Detection_PostProcess")
    assert post.reason.startswith(R.UNSUPPORTED_OP) and "custom operator" in post.reason


def big_fc_model(layers: int = 3, width: int = 1792) -> object:
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, width), np.uint8, scale=0.02, zero_point=128)
    for k in range(layers):
        w = b.constant(f"w{k}", rng.integers(0, 256, (width, width), dtype=np.uint8),
                       scale=0.001, zero_point=128)
        bias = b.constant(f"b{k}", np.zeros(width, np.int32), scale=0.00002, zero_point=0)
        y = b.tensor(f"y{k}", (1, width), np.uint8, scale=0.05, zero_point=128)
        b.op("FULLY_CONNECTED", [x, w, bias], [y])
        x = y
    b.output(x)
    return b.build()


def test_parameters_over_the_onchip_budget():
    model = big_fc_model()  # 3 x 3.1 MiB of weights: two fit in 8 MiB, three do not
    multi = partition(model, "multi")
    assert len(multi.segments) == 2
    assert all(s.parameter_bytes <= 8 * 2**20 for s in multi.segments)
    compat = partition(model, "compat")
    assert len(compat.segments) == 1
    total = 3 * (1792 * 1792 + 1792 * 4)
    assert compat.summary["off_chip_parameter_bytes"] == total - 8 * 2**20
    assert compat.summary["on_chip_parameter_bytes"] == 8 * 2**20


def one_op(name, in_shape, out_shape, dtype=np.uint8, *, extra_inputs=(), version=1,
           signature=None, **options):
    b = ModelBuilder()
    x = b.input("x", in_shape, dtype, scale=0.1, zero_point=0 if dtype != np.uint8 else 128,
                shape_signature=signature)
    ins = [x]
    for k, arr in enumerate(extra_inputs):
        ins.append(b.constant(f"c{k}", arr, scale=0.1 if arr.dtype == dtype else None,
                              zero_point=0))
    y = b.tensor("y", out_shape, dtype, scale=0.1, zero_point=0)
    b.op(name, ins, [y], version=version, **options)
    b.output(y)
    m = b.build()
    return R.default_rules().check(R.OpView(m.main, m.main.operators[0], 0))


@pytest.mark.parametrize("case, status, words", [
    (lambda: one_op("ADD", (1, 4, 4, 8), (1, 4, 4, 8), np.float32,
                    extra_inputs=[np.ones((1, 4, 4, 8), np.float32)]),
     R.UNSUPPORTED_TYPE, "FLOAT32"),
    (lambda: one_op("RELU", (1, 4, 4, 8), (1, 4, 4, 8), signature=(-1, 4, 4, 8)),
     R.UNSPECIFIED_LIMITATION, "dynamic shape"),
    (lambda: one_op("RELU", (2, 4, 4, 8), (2, 4, 4, 8)), R.UNSPECIFIED_LIMITATION,
     "innermost 3"),
    (lambda: one_op("MAX_POOL_2D", (1, 4, 4, 8), (1, 2, 2, 8), filter_width=2, filter_height=2,
                    stride_w=2, stride_h=2, fused_activation_function="RELU"),
     R.UNSPECIFIED_LIMITATION, "fused activation RELU"),
    (lambda: one_op("RELU", (1, 4, 4, 8), (1, 4, 4, 8), version=9), R.UNSUPPORTED_VERSION,
     "version 9"),
    (lambda: one_op("ARG_MAX", (1, 8), (1,), extra_inputs=[np.array(1, np.int32)]),
     R.UNSUPPORTED_OP, "ARG_MAX"),
    (lambda: one_op("SOFTMAX", (1, 20000), (1, 20000)), R.UNSPECIFIED_LIMITATION, "16000"),
    (lambda: one_op("SOFTMAX", (1, 4, 10), (1, 4, 10)), R.UNSPECIFIED_LIMITATION, "not 1-D"),
    (lambda: one_op("MEAN", (1, 4, 4, 8), (1, 4, 4), extra_inputs=[np.array([0], np.int32)]),
     R.UNSPECIFIED_LIMITATION, "batch dimension"),
    (lambda: one_op("MEAN", (1, 4, 4, 6), (1, 4, 4), extra_inputs=[np.array([3], np.int32)]),
     R.UNSPECIFIED_LIMITATION, "multiple of 4"),
    (lambda: one_op("STRIDED_SLICE", (1, 4, 4, 8), (1, 2, 4, 8), extra_inputs=[
        np.array([0, 0, 0, 0], np.int32), np.array([1, 4, 4, 8], np.int32),
        np.array([1, 2, 1, 1], np.int32)]), R.UNSPECIFIED_LIMITATION, "strides"),
    (lambda: one_op("CONCATENATION", (1, 4, 4, 8), (1, 4, 4, 16), axis=3,
                    extra_inputs=[np.full((1, 4, 4, 8), 3, np.uint8)]),
     R.UNSPECIFIED_LIMITATION, "all zeros"),
    (lambda: one_op("RESIZE_BILINEAR", (1, 3, 3, 8), (1, 7, 7, 8),
                    extra_inputs=[np.array([7, 7], np.int32)]),
     R.UNSPECIFIED_LIMITATION, "integer ratio"),
])
def test_rules_give_compiler_worded_reasons(case, status, words):
    reason = case()
    assert reason is not None and reason.startswith(status) and words in reason


@pytest.mark.parametrize("case", [
    lambda: one_op("RELU", (1, 4, 4, 8), (1, 4, 4, 8)),
    lambda: one_op("CONCATENATION", (1, 4, 4, 8), (1, 4, 4, 16), axis=3,
                   extra_inputs=[np.zeros((1, 4, 4, 8), np.uint8)]),
    lambda: one_op("RESIZE_BILINEAR", (1, 3, 3, 8), (1, 6, 6, 8),
                   extra_inputs=[np.array([6, 6], np.int32)]),
    lambda: one_op("SOFTMAX", (1, 1001), (1, 1001)),
    lambda: one_op("MEAN", (1, 4, 4, 8), (1, 8), extra_inputs=[np.array([1, 2], np.int32)]),
])
def test_rules_accept_supported_forms(case):
    assert case() is None


def test_rule_registry_takes_plugin_rules():
    rules = R.default_rules()
    assert "Sinh" not in rules
    rules.add_op("Sinh", R.OpSupport(max_version=1))
    b = ModelBuilder()
    x = b.input("x", (1, 8), np.int8, scale=0.1, zero_point=0)
    y = b.tensor("y", (1, 8), np.int8, scale=0.1, zero_point=0)
    b.op("Sinh", [x], [y])
    b.output(y)
    m = b.build()
    view = R.OpView(m.main, m.main.operators[0], 0)
    assert rules.check(view) is None
    rules.add_check("Sinh", lambda v: "Operation is otherwise supported: plugin says no")
    assert rules.check(view) == "Operation is otherwise supported: plugin says no"


def test_unknown_mode():
    with pytest.raises(ConfigError, match="unknown partition mode"):
        partition(load_model(shared_model("split_concat.tflite")), "fast")


def test_partition_cli_json(capsys):
    path = shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite")
    assert main(["partition", str(path), "--mode", "compat", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"ops", "segments", "summary", "rewrites"}
    op = data["ops"][64]
    assert set(op) >= {"index", "opcode", "target", "segment", "reason"}
    assert (op["opcode"], op["target"], op["segment"]) == ("RESIZE_BILINEAR", "cpu", None)
    assert data["ops"][0] == {"index": 0, "opcode": "CONV_2D", "target": "tpu", "segment": 0,
                              "reason": R.MAPPED}
    assert data["summary"]["tpu_ops"] == 64


def test_partition_cli_says_per_segment_what_multi_maps_beyond_compat(capsys):
    """Each multi-mode segment reports how many of its operators compat mode (what
    edgetpu_compiler would do) keeps on the CPU."""
    path = shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite")
    model = load_model(path)
    compat_tpu = set(partition(model, "compat").tpu_ops)
    assert main(["partition", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    want = [sum(1 for i in s["ops"] if i not in compat_tpu) for s in data["segments"]]
    assert [s["beyond_compat"] for s in data["segments"]] == want
    assert sum(want) > 0        # this model: multi mode maps the tail edgetpu_compiler cuts
    assert main(["partition", str(path)]) == 0
    out = capsys.readouterr().out
    assert "beyond compat" in out and "multi mode maps more than edgetpu_compiler" in out
    assert main(["partition", str(path), "--mode", "compat", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [s["beyond_compat"] for s in data["segments"]] == [None]


def test_partition_cli_text(capsys):
    path = shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite")
    assert main(["partition", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Number of operations that will run on Edge TPU: 70" in out
    assert "Number of Edge TPU subgraphs: 2" in out
    assert "ARG_MAX" in out and R.UNSUPPORTED_OP in out


def test_an_axis_operand_of_any_shape_is_read_flat():
    """LiteRT reads a reduction's axis operand as a flat list whatever its shape (a
    fuzzed BERT's MEAN got a 2-D one); the rules read it the same way."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8), np.int8, scale=0.1, zero_point=0)
    axes = b.constant("axes", np.array([[1, 2]], np.int32))
    y = b.tensor("y", (1, 1, 1, 8), np.int8, scale=0.1, zero_point=0)
    b.op("MEAN", [x, axes], [y], version=2, keep_dims=True)
    b.output(y)
    plan = partition(b.build(), "multi")
    assert plan.ops[0].unit == "tpu", plan.ops[0].reason
