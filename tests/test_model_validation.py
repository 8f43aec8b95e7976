"""Malformed models get a ModelError that says what is wrong and where."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_model

from coralrt.errors import CoralRTError, ModelError
from coralrt.model import flatbuf, load_model


def tree_of(name: str) -> dict:
    return flatbuf.decode(shared_model(name).read_bytes())


def load_tree(tree: dict):
    return load_model(flatbuf.encode(tree))


def test_error_classes():
    assert issubclass(ModelError, ValueError) and issubclass(ModelError, CoralRTError)


@pytest.mark.parametrize("name, match", [
    ("invalid/not_a_model.bin", "not a valid TFLite flatbuffer"),
    ("invalid/broken_model.tflite", "not a valid TFLite flatbuffer"),
    ("invalid/empty_model.tflite", "no operators"),
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
    ("shape_signature", [1, 8], "does not have the rank"),
    ("shape_signature", [1, 9, 8, 3], "disagrees with shape"),
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
    ([-0.5], [0], "negative or not finite"),
    ([float("nan")], [0], "negative or not finite"),
    ([0.0], [0], "scale is 0"),
    ([0.004], [300], r"zero point \[300\] is outside the UINT8 range"),
])
def test_bad_quantization_parameters(scale, zero_point, match):
    tree = tree_of("add_quantized_uint8.tflite")
    q = tree["subgraphs"][0]["tensors"][1]["quantization"]
    q["scale"], q["zero_point"] = np.array(scale, np.float32), np.array(zero_point, np.int64)
    with pytest.raises(ModelError, match=match):
        load_tree(tree)


def test_scale_ratio_beyond_fixed_point_range():
    tree = tree_of("add_quantized_uint8.tflite")
    sg = tree["subgraphs"][0]
    out = sg["operators"][1]["outputs"][0]  # UINT8 ADD (tensor 0 is a float tensor)
    sg["tensors"][out]["quantization"]["scale"] = np.array([1e-15], np.float32)
    with pytest.raises(ModelError, match="differ by a factor of"):
        load_tree(tree)


def test_split_count_must_match_outputs():
    tree = tree_of("split_concat.tflite")
    op = next(o for o in tree["subgraphs"][0]["operators"]
              if max(tree["operator_codes"][o["opcode_index"]].values(), key=int) == 49)  # SPLIT
    op["builtin_options"]["num_splits"] = 536870918
    with pytest.raises(ModelError, match="num_splits=536870918 but the operator has"):
        load_tree(tree)


def test_quantized_arithmetic_needs_quantization_parameters():
    tree = tree_of("add_quantized_uint8.tflite")
    tree["subgraphs"][0]["tensors"][2].pop("quantization")
    with pytest.raises(ModelError, match=r"UINT8 tensor 2 \('output'\) has no quantization"):
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
