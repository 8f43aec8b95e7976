"""The model layer on real TFLite files: reading, writing, cutting."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from conftest import model_params, random_inputs, run_litert, shared_model, shared_model_names

from coralrt.errors import ModelError
from coralrt import Model, load_model
from coralrt.testing import ModelBuilder
from coralrt._model.extract import boundary, extract

# Plain models LiteRT can run by itself (no third-party custom op).
RUNNABLE = [n for n in ("add_float.tflite", "add_quantized_int8.tflite",
                        "add_quantized_uint8.tflite", "deeplabv3_mnv2_dm05_pascal_quant.tflite",
                        "hello_world_int8.tflite", "keras_lstm_mnist_ptq.tflite",
                        "mobilenet_v1_0.25_128_quant.tflite", "mobilenet_v2_1.0_224_quant.tflite",
                        "multi_signatures.tflite", "split_concat.tflite",
                        "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite")]


def op_counts(model: Model) -> dict[str, int]:
    return dict(collections.Counter(op.name for op in model.main.operators))


@pytest.mark.parametrize("name", shared_model_names())
def test_reads_every_shared_model(name):
    path = shared_model(name)
    m = load_model(path)
    assert m.source == path.read_bytes()
    assert m.subgraphs and m.main.operators
    for sg in m.subgraphs:
        for t in sg.tensors:
            assert all(isinstance(d, int) and d >= 0 for d in t.shape)
            if t.is_constant and t.dtype is not None:
                assert t.data.shape == t.shape
        for op in sg.operators:
            assert op.name
            assert all(-1 <= i < len(sg.tensors) for i in op.inputs)
    assert m.is_edgetpu_compiled == name.endswith("_edgetpu.tflite")


@pytest.mark.parametrize("name", shared_model_names(compiled=True))
def test_compiled_models_carry_the_edgetpu_op(name):
    m = load_model(shared_model(name))
    ops = [op for op in m.main.operators if op.opcode.is_custom]
    assert ops and all(op.name == "edgetpu-custom-op" for op in ops)
    for op in ops:
        assert len(op.custom_options) > 1000  # a DWN1 package, not an empty blob


def test_manifest_facts():
    v1 = load_model(shared_model("mobilenet_v1_0.25_128_quant.tflite"))
    assert op_counts(v1) == {"CONV_2D": 15, "DEPTHWISE_CONV_2D": 13, "AVERAGE_POOL_2D": 1,
                             "RESHAPE": 1, "SOFTMAX": 1}
    inp = v1.main.tensors[v1.main.inputs[0]]
    assert (inp.name, inp.shape, inp.type_name) == ("input", (1, 128, 128, 3), "UINT8")
    assert inp.quantization.params == (0.0078125, 128)
    conv = v1.main.operators[0]
    assert conv.options_type == "Conv2DOptions"
    assert conv.options["stride_w"] == 2 and conv.options["padding"] == 0  # SAME

    v2 = load_model(shared_model("mobilenet_v2_1.0_224_quant.tflite"))
    assert len(v2.main.operators) == 66 and op_counts(v2)["ADD"] == 10
    assert len(load_model(shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite")).main.operators) == 72

    head = load_model(shared_model("ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite"))
    assert len(head.main.inputs) == 12 and "TFLite_Detection_PostProcess" in op_counts(head)
    pp = next(op for op in head.main.operators if op.opcode.is_custom)
    assert len(pp.custom_options) > 0 and pp.custom_options_format == 0

    sc = load_model(shared_model("split_concat.tflite"))
    assert (len(sc.main.inputs), len(sc.main.outputs)) == (3, 5)

    ms = load_model(shared_model("multi_signatures.tflite"))
    assert sorted(s.key for s in ms.signatures) == ["add", "sub"] and len(ms.subgraphs) == 2

    hw = load_model(shared_model("hello_world_int8.tflite"))
    assert hw.main.tensors[hw.main.inputs[0]].shape_signature == (-1, 1)
    assert {m.name for m in hw.metadata} >= {"min_runtime_version"}


def test_constant_data_is_a_zero_copy_view():
    m = load_model(shared_model("mobilenet_v1_0.25_128_quant.tflite"))
    weights = next(t for t in m.main.tensors if t.is_constant and t.data.ndim == 4)
    source = np.frombuffer(m.source, np.uint8)
    assert np.shares_memory(weights.data, source)
    assert not weights.data.flags.writeable


@pytest.mark.parametrize("name", model_params(RUNNABLE))
def test_round_trip_gives_identical_outputs(name):
    data = shared_model(name).read_bytes()
    m = load_model(data)
    rewritten = m.to_bytes()
    feeds = random_inputs([m.main.tensors[i] for i in m.main.inputs], seed=3)
    for want, got in zip(run_litert(data, feeds), run_litert(rewritten, feeds)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", shared_model_names())
def test_round_trip_keeps_structure(name):
    m = load_model(shared_model(name))
    again = load_model(m.to_bytes())
    assert len(again.subgraphs) == len(m.subgraphs)
    for a, b in zip(m.subgraphs, again.subgraphs):
        assert (a.inputs, a.outputs) == (b.inputs, b.outputs)
        assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
        assert [t.shape for t in a.tensors] == [t.shape for t in b.tensors]
        for ta, tb in zip(a.tensors, b.tensors):
            assert (ta.quantization is None) == (tb.quantization is None)
            if ta.quantization is not None:
                np.testing.assert_array_equal(ta.quantization.scale, tb.quantization.scale)
                np.testing.assert_array_equal(ta.quantization.zero_point,
                                              tb.quantization.zero_point)
            if ta.is_constant:
                np.testing.assert_array_equal(ta.buffer.data, tb.buffer.data)
        for oa, ob in zip(a.operators, b.operators):
            assert (oa.opcode, oa.inputs, oa.outputs, oa.options) == \
                   (ob.opcode, ob.inputs, ob.outputs, ob.options)
            assert (oa.custom_options is None) == (ob.custom_options is None)
            if oa.custom_options is not None:
                assert bytes(oa.custom_options) == bytes(ob.custom_options)
    assert [s.key for s in again.signatures] == [s.key for s in m.signatures]
    assert [(d.name, bytes(d.buffer.data)) for d in again.metadata] == \
           [(d.name, bytes(d.buffer.data)) for d in m.metadata]


def per_channel_conv_model(seed: int = 0) -> Model:
    rng = np.random.default_rng(seed)
    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 3), np.int8, scale=0.05, zero_point=-3)
    wscale = rng.uniform(0.002, 0.02, 4).astype(np.float32)
    w = b.constant("w", rng.integers(-127, 128, (4, 3, 3, 3)).astype(np.int8), scale=wscale,
                   zero_point=0, axis=0)
    bias = b.constant("b", rng.integers(-500, 500, 4).astype(np.int32), scale=0.05 * wscale,
                      zero_point=0, axis=0)
    y = b.tensor("y", (1, 6, 6, 4), np.int8, scale=0.1, zero_point=5)
    b.op("CONV_2D", [x, w, bias], [y], version=3, stride_w=1, stride_h=1, padding="SAME")
    b.output(y)
    return b.build()


def test_per_channel_quantization_is_written_and_read():
    m = per_channel_conv_model()
    again = load_model(m.to_bytes())
    w = again.main.tensors[1]
    assert w.quantization.per_channel and w.quantization.quantized_dimension == 0
    np.testing.assert_array_equal(w.quantization.scale, m.main.tensors[1].quantization.scale)
    assert w.quantization.params == (0.0, 0)
    x = random_inputs([again.main.tensors[0]], seed=1)
    (out,) = run_litert(m.to_bytes(), x, kernels="reference")
    assert out.shape == (1, 6, 6, 4) and len(np.unique(out)) > 10


@pytest.mark.parametrize("name", model_params([
    "mobilenet_v1_0.25_128_quant.tflite", "deeplabv3_mnv2_dm05_pascal_quant.tflite",
    "keras_lstm_mnist_ptq.tflite", "split_concat.tflite",
    "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite",
    "mobilenet_v2_1.0_224_quant.tflite"]))
@pytest.mark.parametrize("seed", [0, 1])
def test_pieces_run_in_order_reproduce_the_model(name, seed):
    m = load_model(shared_model(name))
    sg = m.main
    n = len(sg.operators)
    rng = np.random.default_rng(seed)
    k = min(n - 1, 3)
    cuts = [0, *sorted(rng.choice(np.arange(1, n), size=k, replace=False).tolist()), n]
    feeds = random_inputs([sg.tensors[i] for i in sg.inputs], seed=seed)
    whole = run_litert(m.source, feeds)
    values = dict(zip(sg.inputs, feeds))
    for a, b in zip(cuts, cuts[1:]):
        piece = extract(m, range(a, b))
        again = load_model(piece.model.to_bytes())  # a valid standalone model
        assert len(again.main.operators) == b - a
        outs = run_litert(piece.model.to_bytes(), [values[t] for t in piece.inputs])
        values.update(zip(piece.outputs, outs))
    for t, want in zip(sg.outputs, whole):
        np.testing.assert_array_equal(values[t], want)


def test_boundary_of_one_operator():
    m = load_model(shared_model("split_concat.tflite"))
    sg = m.main
    first = sg.operators[0]
    ins, outs = boundary(sg, [0])
    assert set(ins) == {t for t in first.inputs if not sg.tensors[t].is_constant}
    assert set(outs) <= set(first.outputs) and outs
    piece = m.extract([0])
    assert [op.name for op in piece.main.operators] == [first.name]


def test_extract_rejects_bad_selections():
    m = load_model(shared_model("add_quantized_uint8.tflite"))
    with pytest.raises(ModelError, match="empty"):
        extract(m, [])
    with pytest.raises(ModelError, match=r"\[7\] are out of range"):
        extract(m, [0, 7])
