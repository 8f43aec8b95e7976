"""Malformed models get a ModelError that says what is wrong and where."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_litert, shared_model

from coralrt.errors import CoralRTError, ModelError
from coralrt._model import flatbuf, load_model


def tree_of(name: str) -> dict:
    return flatbuf.decode(shared_model(name).read_bytes())


def load_tree(tree: dict):
    return load_model(flatbuf.encode(tree))


def test_error_classes():
    assert issubclass(ModelError, ValueError) and issubclass(ModelError, CoralRTError)


@pytest.mark.parametrize("name, match", [
    ("invalid/not_a_model.bin", "not a valid TFLite flatbuffer"),
    ("invalid/broken_model.tflite", "not a valid TFLite flatbuffer"),
    ("invalid/empty_model.tflite", "declares no outputs"),
])
def test_invalid_shared_files(name, match):
    with pytest.raises(ModelError, match=match):
        load_model(shared_model(name))


@pytest.mark.parametrize("length", [0, 3, 7, 8, 100, 5000, 260000, 500000])
def test_truncated_file(length):
    data = shared_model("mobilenet_v1_0.25_128_quant.tflite").read_bytes()
    with pytest.raises(ModelError):
        load_model(data[:length])


def test_missing_path_and_directory(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        load_model(tmp_path / "nope.tflite")
    with pytest.raises(ModelError, match="directory"):
        load_model(tmp_path)
    with pytest.raises(TypeError):
        load_model(12)


def test_operator_input_out_of_range():
    tree = tree_of("add_quantized_uint8.tflite")
    tree["subgraphs"][0]["operators"][1]["inputs"] = np.array([0, 99], np.int32)
    with pytest.raises(ModelError) as e:
        load_tree(tree)
    assert "input tensor index 99 is out of range" in str(e.value)
    assert e.value.where == "subgraph 0, operator 1 (ADD)"


def test_subgraph_output_out_of_range():
    tree = tree_of("add_quantized_uint8.tflite")
    tree["subgraphs"][0]["outputs"] = np.array([-4], np.int32)
    with pytest.raises(ModelError, match="output tensor index -4 is out of range"):
        load_tree(tree)


def test_buffer_index_out_of_range():
    tree = tree_of("mobilenet_v1_0.25_128_quant.tflite")
    tree["subgraphs"][0]["tensors"][5]["buffer"] = 10_000
    with pytest.raises(ModelError, match="buffer index 10000 is out of range") as e:
        load_tree(tree)
    assert e.value.where == "subgraph 0, tensor 5"


def test_opcode_index_out_of_range():
    tree = tree_of("add_quantized_uint8.tflite")
    tree["subgraphs"][0]["operators"][0]["opcode_index"] = 3
    with pytest.raises(ModelError, match="opcode index 3 is out of range"):
        load_tree(tree)


def test_unknown_builtin_code():
    tree = tree_of("add_quantized_uint8.tflite")
    tree["operator_codes"][0]["builtin_code"] = 4000
    with pytest.raises(ModelError, match="unknown builtin operator code 4000"):
        load_tree(tree)


def test_subgraph_index_in_options_out_of_range():
    tree = tree_of("add_quantized_uint8.tflite")
    tree["operator_codes"][0]["builtin_code"] = 119  # WHILE
    tree["operator_codes"][0]["deprecated_builtin_code"] = 119
    op = tree["subgraphs"][0]["operators"][0]
    op["builtin_options_type"] = 93  # WhileOptions
    op["builtin_options"] = {"cond_subgraph_index": 0, "body_subgraph_index": 5}
    with pytest.raises(ModelError, match="body_subgraph_index 5 is out of range"):
        load_tree(tree)


def test_signature_subgraph_out_of_range():
    tree = tree_of("multi_signatures.tflite")
    tree["signature_defs"][1]["subgraph_index"] = 2
    with pytest.raises(ModelError, match="subgraph index 2 is out of range") as e:
        load_tree(tree)
    assert "signature" in e.value.where


def test_constant_size_disagrees_with_shape():
    tree = tree_of("mobilenet_v1_0.25_128_quant.tflite")
    t = next(t for t in tree["subgraphs"][0]["tensors"]
             if "data" in tree["buffers"][t["buffer"]] and len(t["shape"]) == 4)
    t["shape"] = np.array([*t["shape"][:3], t["shape"][3] + 1], np.int32)
    with pytest.raises(ModelError, match="constant data has .* bytes but shape"):
        load_tree(tree)


def test_per_channel_count_disagrees_with_shape():
    tree = tree_of("mobilenet_v1_0.25_128_quant.tflite")
    t = tree["subgraphs"][0]["tensors"][0]
    t["quantization"]["scale"] = np.ones(7, np.float32)
    t["quantization"]["zero_point"] = np.zeros(7, np.int64)
    t["quantization"]["quantized_dimension"] = 3
    with pytest.raises(ModelError, match="7 per-channel scales for dimension 3"):
        load_tree(tree)


def test_scale_and_zero_point_counts_differ():
    tree = tree_of("add_quantized_uint8.tflite")
    q = tree["subgraphs"][0]["tensors"][0]["quantization"]
    q["zero_point"] = np.zeros(2, np.int64)
    with pytest.raises(ModelError, match="1 scales but 2 zero points"):
        load_tree(tree)


@pytest.mark.parametrize("field, value, match", [
    ("shape", [1, -8, 8, 3], "negative dimension"),
    ("type", 99, "unknown tensor type 99"),
])
def test_bad_tensor_fields(field, value, match):
    tree = tree_of("add_quantized_uint8.tflite")
    tree["subgraphs"][0]["tensors"][0][field] = value
    with pytest.raises(ModelError, match=match):
        load_tree(tree)


def test_wrong_schema_version():
    tree = tree_of("add_float.tflite")
    tree["version"] = 2
    with pytest.raises(ModelError, match="schema version 2"):
        load_tree(tree)


def test_model_without_subgraphs():
    tree = tree_of("add_float.tflite")
    tree["subgraphs"] = []
    with pytest.raises(ModelError, match="no subgraphs"):
        load_tree(tree)


def test_two_writers_of_one_tensor():
    tree = tree_of("add_quantized_uint8.tflite")
    ops = tree["subgraphs"][0]["operators"]
    ops[1]["outputs"] = np.array(ops[0]["outputs"])
    with pytest.raises(ModelError, match="is written by operators 0 and 1"):
        load_tree(tree)


@pytest.mark.parametrize("scale, zero_point, match", [
    # A negative scale is well defined, but ADD's kernel aborts on it.
    ([-0.5], [0], "output rescaling multiplier"),
    ([float("nan")], [0], "is 0 or not finite"),
    ([float("inf")], [0], "is 0 or not finite"),
    ([0.0], [0], "is 0 or not finite"),
])
def test_bad_quantization_parameters(scale, zero_point, match):
    tree = tree_of("add_quantized_uint8.tflite")
    q = tree["subgraphs"][0]["tensors"][1]["quantization"]
    q["scale"], q["zero_point"] = np.array(scale, np.float32), np.array(zero_point, np.int64)
    with pytest.raises(ModelError, match=match):
        load_tree(tree)


def test_add_output_scale_the_kernel_aborts_on():
    # add.cc: 2 * max(input scales) / (2^20 * output scale) must stay below 1
    # (tests/test_validation_bounds.py holds both sides of the boundary).
    tree = tree_of("add_quantized_uint8.tflite")
    sg = tree["subgraphs"][0]
    out = sg["operators"][1]["outputs"][0]  # UINT8 ADD (tensor 0 is a float tensor)
    sg["tensors"][out]["quantization"]["scale"] = np.array([1e-15], np.float32)
    with pytest.raises(ModelError, match="output rescaling multiplier .* is not in") as e:
        load_tree(tree)
    assert e.value.where == "subgraph 0, operator 1 (ADD)"


def test_split_count_must_match_outputs():
    tree = tree_of("split_concat.tflite")
    op = next(o for o in tree["subgraphs"][0]["operators"]
              if max(tree["operator_codes"][o["opcode_index"]].values(), key=int) == 49)  # SPLIT
    op["builtin_options"]["num_splits"] = 536870918
    with pytest.raises(ModelError, match="num_splits=536870918 but the operator has"):
        load_tree(tree)


def test_quantized_arithmetic_needs_quantization_parameters():
    # Without quantization the kernel reads scale 0: ADD's multiplier is infinite.
    tree = tree_of("add_quantized_uint8.tflite")
    tree["subgraphs"][0]["tensors"][2].pop("quantization")
    with pytest.raises(ModelError, match=r"output rescaling multiplier inf .*-> 0\)"):
        load_tree(tree)


def test_operator_may_not_write_a_subgraph_input():
    tree = tree_of("add_quantized_uint8.tflite")
    sg = tree["subgraphs"][0]
    sg["operators"][1]["outputs"] = np.array(sg["inputs"], np.int32)
    with pytest.raises(ModelError, match="also an input of the subgraph"):
        load_tree(tree)


def test_tensor_read_before_any_operator_writes_it():
    tree = tree_of("keras_lstm_mnist_ptq.tflite")
    sg = tree["subgraphs"][0]
    weight = sg["operators"][1]["inputs"][5]  # a recurrent weight of the LSTM
    sg["tensors"][weight]["buffer"] = 0       # no data any more: nothing writes it
    with pytest.raises(ModelError, match="is read before any operator writes it"):
        load_tree(tree)


def test_declared_output_shape_must_follow_the_input():
    tree = tree_of("keras_lstm_mnist_ptq.tflite")
    tree["subgraphs"][0]["tensors"][0]["shape"] = np.array([1, 10551324, 28], np.int32)
    with pytest.raises(ModelError, match=r"QUANTIZE output shape \[1, 28, 28\] differs"):
        load_tree(tree)


def test_broadcast_output_shape():
    tree = tree_of("add_quantized_uint8.tflite")
    tree["subgraphs"][0]["tensors"][2]["shape"] = np.array([1, 8, 8, 4], np.int32)
    with pytest.raises(ModelError, match="is not the broadcast shape"):
        load_tree(tree)


def test_lstm_state_shares_the_output_quantization():
    tree = tree_of("keras_lstm_mnist_ptq.tflite")
    sg = tree["subgraphs"][0]
    state = sg["operators"][1]["inputs"][18]
    sg["tensors"][state]["quantization"]["zero_point"] = np.array([-110], np.int64)
    with pytest.raises(ModelError, match="output state and output must share"):
        load_tree(tree)


# -- omitted (-1) inputs --------------------------------------------------------------------
# LiteRT hands an omitted input to the kernel as a null tensor; kernels that do not
# expect one (and the XNNPACK delegate) dereference it and kill the process.

def _with_inputs(tree: dict, op_index: int, inputs) -> dict:
    tree["subgraphs"][0]["operators"][op_index]["inputs"] = np.array(inputs, np.int32)
    return tree


def test_omitted_conv_filter_is_rejected():
    tree = tree_of("mobilenet_v1_0.25_128_quant.tflite")
    x, _, bias = tree["subgraphs"][0]["operators"][0]["inputs"]
    with pytest.raises(ModelError, match="input 1 of CONV_2D is -1") as e:
        load_tree(_with_inputs(tree, 0, [x, -1, bias]))
    assert e.value.where == "subgraph 0, operator 0 (CONV_2D)"


@pytest.mark.parametrize("name", ["mobilenet_v1_0.25_128_quant.tflite", "split_concat.tflite",
                                  "keras_lstm_mnist_ptq.tflite", "hello_world_int8.tflite",
                                  "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite"])
def test_every_required_input_set_to_minus_one_is_rejected(name):
    from coralrt._model.optional_inputs import OPTIONAL_INPUTS

    data = shared_model(name).read_bytes()
    model = load_model(data)
    for oi, op in enumerate(model.main.operators):
        if op.opcode.is_custom:
            continue
        for k, t in enumerate(op.inputs):
            if t < 0:
                continue
            tree = flatbuf.decode(data)
            inputs = list(op.inputs)
            inputs[k] = -1
            _with_inputs(tree, oi, inputs)
            if k in OPTIONAL_INPUTS[op.name] and not (op.name.endswith("LSTM") and k == 12):
                load_tree(tree)   # an optional input: never a false rejection
            else:
                with pytest.raises(ModelError, match=f"input {k} of {op.name} is -1"):
                    load_tree(tree)


def test_omitted_fully_connected_bias_runs():
    from coralrt import InferenceSession

    tree = tree_of("hello_world_int8.tflite")
    op = tree["subgraphs"][0]["operators"][0]
    x, w, _ = op["inputs"]
    data = flatbuf.encode(_with_inputs(tree, 0, [x, w, -1]))
    sess = InferenceSession(data, target="cpu")
    feeds = [np.full(sess.get_inputs()[0].shape, 3, np.int8)]
    got = list(sess.run(feeds).values())
    want = run_litert(data, feeds)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_lstm_input_gate_bias_may_be_omitted_only_without_input_gate():
    data = shared_model("keras_lstm_mnist_ptq.tflite").read_bytes()
    ins = list(load_model(data).main.operators[1].inputs)
    no_bias = [-1 if k == 12 else t for k, t in enumerate(ins)]
    # An input gate without its bias: the kernel reads the bias' dims (SIGSEGV).
    with pytest.raises(ModelError, match="input 12 of UNIDIRECTIONAL_SEQUENCE_LSTM is -1"):
        load_tree(_with_inputs(flatbuf.decode(data), 1, no_bias))
    # A CIFG LSTM (no input gate at all) is legal and LiteRT runs it.
    cifg = [-1 if k in (1, 5, 12) else t for k, t in enumerate(ins)]
    tree = _with_inputs(flatbuf.decode(data), 1, cifg)
    model = load_tree(tree)
    run_litert(flatbuf.encode(tree), [np.zeros((1, 28, 28), np.uint8)])
    assert model.main.operators[1].inputs[12] == -1


def _if_model(branch_reads_second: bool):
    from coralrt.testing import ModelBuilder
    from coralrt._model.types import Model

    def branch(op_name):
        b = ModelBuilder(name=op_name)
        x, y = b.input("x", (1, 4), np.float32), b.input("y", (1, 4), np.float32)
        o = b.tensor("o", (1, 4), np.float32)
        b.op(op_name, [x, y if branch_reads_second else x], [o])
        b.output(o)
        return b.build().main

    b = ModelBuilder()
    c, a = b.input("cond", (1,), np.bool_), b.input("a", (1, 4), np.float32)
    out = b.tensor("out", (1, 4), np.float32)
    b.op("IF", [c, a, -1], [out], then_subgraph_index=1, else_subgraph_index=2)
    b.output(out)
    main = b.build()
    return Model(subgraphs=[main.main, branch("ADD"), branch("SUB")],
                 buffers=main.buffers).to_bytes()


def test_if_input_may_be_omitted_only_when_no_branch_reads_it():
    data = _if_model(branch_reads_second=False)
    load_model(data)
    out = run_litert(data, [np.array([True]), np.ones((1, 4), np.float32)])
    assert out[0].tolist() == [[2, 2, 2, 2]]
    with pytest.raises(ModelError, match="input 2 of IF is -1"):
        load_model(_if_model(branch_reads_second=True))


def test_depthwise_conv_without_bias_is_not_rejected():
    # LiteRT's reference kernels and the simulated Edge TPU run it (only the
    # optimized CPU kernels crash on it, which validation cannot know about).
    tree = tree_of("mobilenet_v1_0.25_128_quant.tflite")
    x, w, _ = tree["subgraphs"][0]["operators"][1]["inputs"]
    data = flatbuf.encode(_with_inputs(tree, 1, [x, w]))
    load_model(data)
    run_litert(data, [np.zeros((1, 128, 128, 3), np.uint8)], kernels="reference")


def test_too_few_inputs_are_rejected():
    tree = tree_of("split_concat.tflite")
    ops = tree["subgraphs"][0]["operators"]
    oi = next(i for i, o in enumerate(ops)
              if max(tree["operator_codes"][o["opcode_index"]].values(), key=int) == 49)  # SPLIT
    with pytest.raises(ModelError, match="SPLIT has 1 input.* at least 2"):
        load_tree(_with_inputs(tree, oi, ops[oi]["inputs"][1:]))


def test_optional_input_tables_name_builtin_operators():
    from coralrt._model.optional_inputs import MIN_INPUTS, ONLY_WITH, OPTIONAL_INPUTS
    from coralrt._model.types import BUILTIN_NAMES

    names = set(BUILTIN_NAMES.values())
    assert set(OPTIONAL_INPUTS) <= names and set(MIN_INPUTS) <= names
    for op, rules in ONLY_WITH.items():
        assert set(rules) <= OPTIONAL_INPUTS[op]


# -- model defects are model errors ----------------------------------------------------------

def _sparse_reshape(stored, dim_metadata, traversal_order=(0,), block_map=None) -> bytes:
    from coralrt.testing import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 8), np.float32)
    s = b.constant("shape", np.array([2, 4], np.int32))
    y = b.tensor("y", (2, 4), np.float32)
    b.op("RESHAPE", [x, s], [y])
    b.output(y)
    model = b.build()
    t = model.main.tensors[s]
    t.buffer.data = np.frombuffer(np.array(stored, "<i4").tobytes(), np.uint8)
    t.extra["sparsity"] = {"traversal_order": np.array(traversal_order, np.int32),
                           "dim_metadata": dim_metadata}
    if block_map is not None:
        t.extra["sparsity"]["block_map"] = np.array(block_map, np.int32)
    return model.to_bytes()


def _csr(segments, indices) -> dict:
    return {"format": 1, "dense_size": 2,
            "array_segments_type": 1, "array_segments": {"values": np.array(segments, np.int32)},
            "array_indices_type": 1, "array_indices": {"values": np.array(indices, np.int32)}}


@pytest.mark.parametrize("encoding", ["dense", "csr", "blocked"])
def test_sparse_reshape_shape_that_litert_reads_correctly_runs(encoding, tmp_path):
    from coralrt import InferenceSession
    from coralrt._cli.inspect_cmd import model_report

    meta = {"dense": ([2, 4], [{"format": 0, "dense_size": 2}], (0,), None),
            "csr": ([2, 4], [_csr([0, 2], [0, 1])], (0,), None),
            "blocked": ([2, 4], [{"format": 0, "dense_size": 1},
                                 {"format": 0, "dense_size": 2}], (0, 1), [0])}[encoding]
    data = _sparse_reshape(*meta)
    path = tmp_path / "m.tflite"
    path.write_bytes(data)
    assert model_report(path)["operators"]
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    got = InferenceSession(data, target="cpu").run([x])["y"]
    assert np.array_equal(got, run_litert(data, [x])[0])
    assert got.shape == (2, 4)


@pytest.mark.parametrize("stored, meta, match", [
    # [0, 4] with the zero left out: the kernel reads one value past the data.
    ([4], _csr([0, 1], [1]), "stores 1 of its 2 values"),
    # Indices out of order: the kernel reads [2, 4], the model means [4, 2].
    ([2, 4], _csr([0, 2], [1, 0]), r"value \[4, 2\], but TFLite's RESHAPE reads"),
    ([2, 4], _csr([0, 2], [0, 5]), "invalid sparsity parameters"),
])
def test_sparse_reshape_shape_that_litert_misreads_is_rejected(stored, meta, match, tmp_path):
    from coralrt._cli.inspect_cmd import model_report

    path = tmp_path / "m.tflite"
    path.write_bytes(_sparse_reshape(stored, [meta]))
    with pytest.raises(ModelError, match=match):
        load_model(path)
    with pytest.raises(ModelError, match=match):
        model_report(path)


def _conv_model(extra_output: str) -> bytes:
    from coralrt.testing import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 4), np.uint8, scale=0.05, zero_point=128)
    w = b.constant("w", np.full((4, 1, 1, 4), 130, np.uint8), scale=0.01, zero_point=128)
    bias = b.constant("bias", np.arange(4, dtype=np.int32), scale=0.0005, zero_point=0)
    y = b.tensor("y", (1, 8, 8, 4), np.uint8, scale=0.05, zero_point=128)
    b.op("CONV_2D", [x, w, bias], [y], stride_w=1, stride_h=1, padding="SAME")
    extra = {"orphan": lambda: b.tensor("orphan", (1, 8, 8, 4), np.uint8, scale=0.05,
                                        zero_point=128),
             "constant": lambda: bias, "input": lambda: x}[extra_output]()
    b.output(y, extra)
    return b.build().to_bytes()


def test_output_that_nothing_writes_is_rejected():
    # LiteRT runs it but has no data for that output ("Tensor data is null").
    with pytest.raises(ModelError, match=r"output tensor 4 \('orphan'\) is not written by any "
                                         r"operator") as e:
        load_model(_conv_model("orphan"))
    assert e.value.where == "subgraph 0"


@pytest.mark.parametrize("target", ["cpu", "sim"])
@pytest.mark.parametrize("extra", ["constant", "input"])
def test_constant_and_input_outputs_run_on_every_target(extra, target):
    from coralrt import InferenceSession

    data = _conv_model(extra)
    feeds = [np.full((1, 8, 8, 4), 7, np.uint8)]
    want = run_litert(data, feeds, kernels="reference")
    got = list(InferenceSession(data, target=target, cpu_kernels="reference").run(feeds).values())
    assert [g.tolist() for g in got] == [w.tolist() for w in want]


def test_concatenation_output_must_be_the_concatenation_of_its_inputs():
    # Found by the rewiring fuzzer: the simulated Edge TPU ran a segment built on
    # the declared (wrong) size and never answered.
    tree = tree_of("split_concat.tflite")
    ops = tree["subgraphs"][0]["operators"]
    oi = next(i for i, o in enumerate(ops)
              if max(tree["operator_codes"][o["opcode_index"]].values(), key=int) == 2)  # CONCAT
    a, b, c = ops[oi]["inputs"]
    with pytest.raises(ModelError, match=r"CONCATENATION output shape \[1, 8, 8, 6\] is not "
                                         r"\[1, 8, 8, 5\]"):
        load_tree(_with_inputs(tree, oi, [c, b, c]))


def test_integer_lstm_weights_must_be_constants():
    # Found by the rewiring fuzzer: the INT8 LSTM kernel reads its weights and
    # biases at prepare time, when only constants have memory (SIGSEGV).
    from coralrt._model.types import Tensor

    model = load_model(shared_model("keras_lstm_mnist_ptq.tflite"))
    sg = model.main
    w = sg.tensors[sg.operators[1].inputs[7]]
    sg.tensors.append(Tensor("state_like", w.shape, w.type, quantization=w.quantization,
                             is_variable=True))
    sg.operators[1].inputs[7] = len(sg.tensors) - 1
    model.source = None
    with pytest.raises(ModelError, match="input 7 of the INT8 UNIDIRECTIONAL_SEQUENCE_LSTM is "
                                         "not a constant"):
        load_model(model.to_bytes())


def test_lstm_recurrent_weights_need_a_row_per_cell():
    tree = tree_of("keras_lstm_mnist_ptq.tflite")
    ins = list(tree["subgraphs"][0]["operators"][1]["inputs"])
    ins[7] = ins[18]   # the (1, 20) output state instead of (20, 20) weights
    with pytest.raises(ModelError, match=r"recurrent-to-cell weights of shape \[1, 20\] do "
                                         r"not have the 20 rows"):
        load_tree(_with_inputs(tree, 1, ins))


def test_an_operator_with_a_sparse_operand_stays_on_the_cpu_on_sim():
    # Segments carry dense constants only: a quantized RESHAPE whose shape operand is
    # sparse (stored in order, which LiteRT reads correctly) runs on the CPU under sim.
    from coralrt import InferenceSession, load_model
    from coralrt.testing import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 8), np.uint8, scale=0.5, zero_point=10)
    s = b.constant("shape", np.array([2, 4], np.int32))
    y = b.tensor("y", (2, 4), np.uint8, scale=0.5, zero_point=10)
    b.op("RESHAPE", [x, s], [y])
    b.output(y)
    model = b.build()
    model.main.tensors[s].extra["sparsity"] = {
        "traversal_order": np.array([0], np.int32),
        "dim_metadata": [{"format": 0, "dense_size": 2}]}
    data = model.to_bytes()
    assert load_model(data).main.tensors[s].extra.get("sparsity")
    sess = InferenceSession(data, target="sim")
    placement = sess.compile_info["placement"]
    assert placement[0][0] == "cpu" and "sparse" in placement[0][2]
    feed = np.arange(8, dtype=np.uint8).reshape(1, 8)
    assert np.array_equal(sess.run([feed])["y"], run_litert(data, [feed])[0])


# -- models LiteRT runs correctly are never refused -----------------------------------------
# Rules that used to be wider than any crash: each model below was refused
# and is accepted now, and runs on both targets like LiteRT.

def _runs_like_litert(data: bytes, feeds: list, sim: bool = True) -> None:
    from coralrt import InferenceSession

    load_model(data)
    got = list(InferenceSession(data, target="cpu").run(feeds).values())
    assert [g.tolist() for g in got] == [w.tolist() for w in run_litert(data, feeds)]
    if sim:
        got = list(InferenceSession(data, target="sim", cpu_kernels="reference")
                   .run(feeds).values())
        want = run_litert(data, feeds, kernels="reference")
        assert [g.tolist() for g in got] == [w.tolist() for w in want]


def _lstm_cell_gate(out_scale: float) -> bytes:
    """The shape of the AutoML video model's LSTM cell gate: a MUL whose output
    scale (here out_scale) is tiny, added to another product at a normal scale."""
    from coralrt.testing import ModelBuilder

    b = ModelBuilder()
    c = b.input("c", (1, 4, 4, 8), np.uint8, scale=0.0235294, zero_point=0)
    g = b.input("g", (1, 4, 4, 8), np.uint8, scale=0.00390625, zero_point=0)
    h = b.input("h", (1, 4, 4, 8), np.uint8, scale=5.0382832e-06, zero_point=124)
    m1 = b.tensor("m1", (1, 4, 4, 8), np.uint8, scale=out_scale, zero_point=0)
    m2 = b.tensor("m2", (1, 4, 4, 8), np.uint8, scale=1.2141535e-35, zero_point=0)
    s = b.tensor("s", (1, 4, 4, 8), np.uint8, scale=0.0235294, zero_point=0)
    b.op("MUL", [c, g], [m1])
    b.op("MUL", [g, h], [m2])
    b.op("ADD", [m1, m2], [s])
    b.output(s, m1)
    return b.build().to_bytes()


@pytest.mark.parametrize("out_scale", [2.972124e-35, 1e-20, 1e-9, 0.05])
def test_mul_with_a_tiny_output_scale_runs_on_every_target(out_scale):
    # The traffic model (automl_video_ondevice) has such a MUL (multiplier 3e30):
    # LiteRT runs it, and the simulator reproduces its reference kernel bit for bit.
    rng = np.random.default_rng(4)
    feeds = [rng.integers(0, 256, (1, 4, 4, 8), dtype=np.uint8) for _ in range(3)]
    _runs_like_litert(_lstm_cell_gate(out_scale), feeds)


def test_shape_signature_litert_ignores_is_accepted():
    # LiteRT uses a tensor's shape; a signature of another rank or with other
    # fixed sizes only limits which resizes it allows.
    for sig in ([1, 8], [1, 9, 8, 3]):
        tree = tree_of("add_float.tflite")
        tree["subgraphs"][0]["tensors"][1]["shape_signature"] = np.array(sig, np.int32)
        data = flatbuf.encode(tree)
        _runs_like_litert(data, [np.ones((1, 8, 8, 3), np.float32)], sim=False)


@pytest.mark.parametrize("zero_point", [300, -1, 2**32 + 5])
def test_zero_point_outside_the_type_range_is_refused_on_every_target(zero_point):
    # LiteRT's kernels disagree on such a zero point (reference ones abort on a
    # convolution, XNNPACK refuses it, the optimized builtins answer zeros), and
    # the simulated Edge TPU and the numpy backend keep to the quantization
    # spec: one refusal for all.  2**32 + 5 is 5 once LiteRT truncates it to
    # 32 bits, and refused all the same (the file's value is what it means).
    from coralrt import InferenceSession
    from coralrt.testing import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 8), np.uint8, scale=0.5, zero_point=zero_point)
    y = b.input("y", (1, 8), np.uint8, scale=0.5, zero_point=0)
    o = b.tensor("o", (1, 8), np.uint8, scale=1.0, zero_point=0)
    b.op("ADD", [x, y], [o])
    b.output(o)
    data = b.build().to_bytes()
    for target, extra in (("cpu", {}), ("cpu", {"cpu_kernels": "reference"}),
                          ("cpu", {"backend": "numpy"}), ("sim", {})):
        with pytest.raises(ModelError, match=rf"zero point {zero_point} is outside the UINT8 "
                                             r"range \[0, 255\]"):
            InferenceSession(data, target=target, **extra)


def test_high_rank_tensors_run():
    from coralrt.testing import ModelBuilder

    shape = (1,) * 18 + (2, 3)        # rank 20: the old limit was 16
    b = ModelBuilder()
    x = b.input("x", shape, np.float32)
    y = b.tensor("y", shape, np.float32)
    b.op("RELU", [x], [y])
    b.output(y)
    _runs_like_litert(b.build().to_bytes(), [np.linspace(-1, 1, 6, dtype=np.float32)
                                             .reshape(shape)], sim=False)


def test_model_without_operators_runs():
    from coralrt.testing import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 4), np.uint8, scale=0.5, zero_point=3)
    b.output(x)
    _runs_like_litert(b.build().to_bytes(), [np.arange(4, dtype=np.uint8).reshape(1, 4)])


def test_fully_connected_without_weight_columns_runs():
    # fully_connected.cc sizes the output from the input's outer dimensions.
    from coralrt.testing import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (2, 8), np.float32)
    w = b.input("w", (4, 0), np.float32)   # no elements, so no data: an input, not a constant
    o = b.tensor("o", (2, 4), np.float32)
    b.op("FULLY_CONNECTED", [x, w, -1], [o])
    b.output(o)
    _runs_like_litert(b.build().to_bytes(), [np.ones((2, 8), np.float32),
                                             np.ones((4, 0), np.float32)], sim=False)


@pytest.mark.parametrize("rank", [7, 9])
def test_reshape_to_more_than_six_dimensions_runs(rank):
    from coralrt.testing import ModelBuilder

    shape = (1,) * (rank - 2) + (2, 3)
    b = ModelBuilder()
    x = b.input("x", (6,), np.float32)
    s = b.constant("s", np.array(shape, np.int32))
    y = b.tensor("y", shape, np.float32)
    b.op("RESHAPE", [x, s], [y])
    b.output(y)
    _runs_like_litert(b.build().to_bytes(), [np.arange(6, dtype=np.float32)], sim=False)


def test_reshape_takes_the_option_when_the_shape_operand_is_not_an_int32_vector():
    # reshape.cc uses the shape operand only when it is a 1-D INT32 tensor.
    from coralrt.testing import ModelBuilder

    def model(shape_operand, new_shape):
        b = ModelBuilder()
        x = b.input("x", (1, 6), np.float32)
        s = b.constant("s", shape_operand)
        y = b.tensor("y", (2, 3), np.float32)
        b.op("RESHAPE", [x, s], [y], new_shape=new_shape)
        b.output(y)
        return b.build().to_bytes()

    _runs_like_litert(model(np.array([[2, 3]], np.int32), [2, 3]),
                      [np.arange(6, dtype=np.float32).reshape(1, 6)], sim=False)
    # The option is what the kernel checks: a wrong one is refused (as LiteRT does).
    with pytest.raises(ModelError, match=r"RESHAPE of 6 elements to \[4, 3\]"):
        load_model(model(np.array([2, 3], np.int64), [4, 3]))


def test_signature_naming_a_missing_tensor_is_still_refused():
    # LiteRT's signature API refuses it with an error and the model itself runs,
    # but coralrt's compiler maps signature tensors (found by fuzzing the sim target).
    tree = tree_of("multi_signatures.tflite")
    tree["signature_defs"][0]["inputs"][0]["tensor_index"] = 99
    data = flatbuf.encode(tree)
    run_litert(data, [np.ones((1,), np.float32)])
    with pytest.raises(ModelError, match="tensor index 99 of 'x' is out of range"):
        load_model(data)


def test_larger_constant_buffer_is_still_refused():
    # LiteRT ignores the extra bytes, but coralrt reads a constant by its shape.
    tree = tree_of("hello_world_int8.tflite")
    tree["subgraphs"][0]["tensors"][4]["shape"] = np.array([16, 8], np.int32)
    with pytest.raises(ModelError, match="constant data has 256 bytes but shape"):
        load_tree(tree)


@pytest.mark.parametrize("target", ["cpu", "sim"])
def test_a_signature_output_nothing_writes_is_refused(tmp_path, target):
    # Found by fuzzing: the simulator's compiler met a signature output that
    # no operator writes and failed with a raw KeyError.
    from coralrt import InferenceSession
    from coralrt._model.writer import write_model

    model = load_model(shared_model("keras_lstm_mnist_ptq.tflite"))
    sg = model.subgraphs[0]
    written = {k for op in sg.operators for k in op.outputs} | set(sg.inputs)
    loose = next(i for i, t in enumerate(sg.tensors)
                 if i not in written and not t.is_constant and not t.is_variable)
    model.signatures[0].outputs["output_0"] = loose
    path = tmp_path / "sig.tflite"
    path.write_bytes(write_model(model))
    with pytest.raises(ModelError, match="output 'output_0' .* is not written by any operator"):
        InferenceSession(path, target=target)
