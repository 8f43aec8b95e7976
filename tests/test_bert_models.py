"""The int8 BERT-style encoders of tests/support/bert_models.py: they are
deterministic, LiteRT runs them with its default and its reference kernels,
the int8 logits follow the float32 network they were calibrated from, and the
graph has the operator forms TensorFlow's converter emits for a quantized BERT."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from conftest import run_litert

from coralrt import load_model
from coralrt._model.types import TENSOR_TYPES
from support.bert_models import PRESETS, BertConfig, bert_encoder, build_bert

INT8, INT32 = TENSOR_TYPES["INT8"], TENSOR_TYPES["INT32"]
FLOAT32 = TENSOR_TYPES["FLOAT32"]

VARIANTS = {
    "tiny": PRESETS["tiny"],
    "wide": PRESETS["wide"],
    "tanh": dict(PRESETS["tiny"], gelu="tanh"),
}


@pytest.fixture(scope="module")
def built():
    return {name: build_bert(**kw) for name, kw in VARIANTS.items()}


def _ops(model_bytes):
    sg = load_model(model_bytes).main
    return sg, sg.operators


def _producer(ops):
    return {o: op for op in ops for o in op.outputs}


# -- determinism ---------------------------------------------------------------------

def test_same_arguments_same_bytes(built):
    assert bert_encoder(**PRESETS["tiny"]) == built["tiny"].tflite
    assert bert_encoder(**VARIANTS["tanh"]) == built["tanh"].tflite
    assert bert_encoder(**PRESETS["tiny"], seed=1) != built["tiny"].tflite
    assert bert_encoder(**PRESETS["tiny"], attention_scale="fold") != built["tiny"].tflite


def test_bad_configurations_raise():
    with pytest.raises(ValueError, match="multiple of heads"):
        BertConfig(hidden=130, heads=4)
    with pytest.raises(ValueError, match="gelu"):
        build_bert(gelu="erf")
    with pytest.raises(ValueError, match="attention_scale"):
        build_bert(attention_scale="div")


# -- LiteRT --------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_litert_runs_with_default_and_reference_kernels(built, name):
    m = built[name]
    ids = m.random_ids(2, seed=5)
    outs = {k: [run_litert(m.tflite, [x], kernels=k)[0] for x in ids]
            for k in ("optimized", "reference")}
    step = float(np.abs(m.float_logits(ids[0])).max()) / 64   # a few output steps
    for k, (a, b) in outs.items():
        assert a.shape == (1, m.config.classes) and a.dtype == np.float32, k
        assert np.isfinite(a).all() and np.isfinite(b).all(), k
        # The logits depend on the tokens.
        assert np.abs(a - b).max() > step, k
    for a, b in zip(outs["optimized"], outs["reference"]):
        # Both kernel sets compute the same integer graph: at most a few
        # rounding steps apart (measured: <= 0.18 for logits up to ~5).
        assert np.abs(a - b).max() < 0.1 * np.abs(a).max()


# -- agreement with the float network ------------------------------------------------

@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_int8_logits_follow_the_float_network(built, name):
    from conftest import litert_module
    Interpreter = litert_module().Interpreter
    m = built[name]
    interp = Interpreter(model_content=m.tflite)
    interp.allocate_tensors()
    (inp,), (out,) = interp.get_input_details(), interp.get_output_details()
    assert inp["name"] == "input_ids" and out["name"] == "logits"
    floats, quants = [], []
    for ids in m.random_ids(20, seed=3):
        interp.set_tensor(inp["index"], ids)
        interp.invoke()
        quants.append(interp.get_tensor(out["index"])[0].copy())
        floats.append(m.float_logits(ids)[0])
    f, q = np.array(floats), np.array(quants)
    agree = int((f.argmax(1) == q.argmax(1)).sum())
    err = np.abs(q - f).max(1) / np.abs(f).max(1)
    # Measured on these inputs: 19-20 of 20 top-1 agree; relative error per
    # input (max |q - f| / max |f|) mean 0.05-0.09, max 0.11-0.20.  Ranges
    # clipped to a third of the calibrated ones give 9 of 20 and mean 0.97.
    assert agree >= 17, (agree, f.argmax(1), q.argmax(1))
    assert err.mean() < 0.12 and err.max() < 0.35, err
    # The error is small next to how much the logits vary between inputs
    # (measured ratio 0.05-0.08), so the agreement is not that of a constant.
    assert np.abs(q - f).mean() < 0.3 * f.std(axis=0).mean()


# -- graph forms ---------------------------------------------------------------------

def test_tiny_operator_counts(built):
    _, ops = _ops(built["tiny"].tflite)
    assert Counter(op.name for op in ops) == {
        "GATHER": 1, "ADD": 15, "MEAN": 10, "SQUARED_DIFFERENCE": 5, "RSQRT": 5, "SUB": 5,
        "MUL": 12, "FULLY_CONNECTED": 13, "RESHAPE": 9, "TRANSPOSE": 8, "BATCH_MATMUL": 4,
        "SOFTMAX": 2, "GELU": 2, "STRIDED_SLICE": 1, "DEQUANTIZE": 1,
    }


@pytest.mark.parametrize("name", ["tiny", "wide"])
def test_encoder_operator_forms(built, name):
    cfg = built[name].config
    sg, ops = _ops(built[name].tflite)
    t = sg.tensors
    made_by = _producer(ops)
    (ids,), (logits,) = sg.inputs, sg.outputs
    assert t[ids].name == "input_ids" and t[ids].type == INT32
    assert t[ids].shape == (1, cfg.seq)
    assert t[logits].name == "logits" and t[logits].type == FLOAT32
    assert ops[-1].name == "DEQUANTIZE" and t[logits].shape == (1, cfg.classes)

    gather = ops[0]
    assert gather.name == "GATHER" and gather.inputs[1] == ids
    table = t[gather.inputs[0]]
    assert table.is_constant and table.type == INT8 and table.shape == (cfg.vocab, cfg.hidden)

    fcs = [op for op in ops if op.name == "FULLY_CONNECTED"]
    assert len(fcs) == 6 * cfg.layers + 1
    for op in fcs[:-1]:
        assert op.options["keep_num_dims"] is True and op.version >= 5
        assert len(t[op.outputs[0]].shape) == 3
    widths = sorted({t[op.outputs[0]].shape[-1] for op in fcs[:-1]})
    assert widths == [cfg.hidden, cfg.intermediate]
    assert fcs[-1].options["keep_num_dims"] is False
    assert t[fcs[-1].outputs[0]].shape == (1, cfg.classes)

    bmms = [op for op in ops if op.name == "BATCH_MATMUL"]
    assert len(bmms) == 2 * cfg.layers
    for op in bmms:
        assert all(not t[i].is_constant and i in made_by for i in op.inputs)
        assert t[op.outputs[0]].type == INT8 and len(t[op.outputs[0]].shape) == 4
    scores, context = bmms[0], bmms[1]
    assert scores.options["adj_y"] is True
    assert t[scores.outputs[0]].shape == (1, cfg.heads, cfg.seq, cfg.seq)
    assert made_by[context.inputs[0]].name == "SOFTMAX"
    assert t[context.outputs[0]].shape == (1, cfg.heads, cfg.seq, cfg.hidden // cfg.heads)
    for i in (*scores.inputs, context.inputs[1]):
        assert made_by[i].name == "TRANSPOSE"
        assert made_by[made_by[i].inputs[0]].name == "RESHAPE"

    gelus = [op for op in ops if op.name == "GELU"]
    assert len(gelus) == cfg.layers
    for op in gelus:
        assert op.options["approximate"] is False and t[op.inputs[0]].type == INT8
        assert made_by[op.inputs[0]].name == "FULLY_CONNECTED"
        assert t[op.outputs[0]].shape == (1, cfg.seq, cfg.intermediate)

    # 1 + 2 per layer LayerNorms, each MEAN -> SQUARED_DIFFERENCE -> MEAN -> ADD
    # epsilon -> RSQRT, with SUB(x, mean) scaled by the rsqrt.
    rsqrts = [op for op in ops if op.name == "RSQRT"]
    assert len(rsqrts) == 1 + 2 * cfg.layers
    for op in rsqrts:
        add_eps = made_by[op.inputs[0]]
        var = made_by[add_eps.inputs[0]]
        sqd = made_by[var.inputs[0]]
        mean = made_by[sqd.inputs[1]]
        assert (add_eps.name, var.name, sqd.name, mean.name) == (
            "ADD", "MEAN", "SQUARED_DIFFERENCE", "MEAN")
        assert t[add_eps.inputs[1]].is_constant
        assert var.options["keep_dims"] is True and mean.options["keep_dims"] is True
        assert t[mean.outputs[0]].shape == (1, cfg.seq, 1)
        assert all(t[i].type == INT8 for o in (sqd, op) for i in (*o.inputs, *o.outputs))
        users = [u for u in ops if op.outputs[0] in u.inputs]
        assert [u.name for u in users] == ["MUL"]
        centered = made_by[users[0].inputs[0]]
        assert centered.name == "SUB" and centered.inputs == [sqd.inputs[0], sqd.inputs[1]]

    head = [op.name for op in ops[-4:]]
    assert head == ["STRIDED_SLICE", "RESHAPE", "FULLY_CONNECTED", "DEQUANTIZE"]
    assert t[ops[-4].outputs[0]].shape == (1, 1, cfg.hidden)


def test_tanh_gelu_subgraph(built):
    cfg = built["tanh"].config
    sg, ops = _ops(built["tanh"].tflite)
    t = sg.tensors
    made_by = _producer(ops)
    names = Counter(op.name for op in ops)
    assert "GELU" not in names and names["TANH"] == cfg.layers
    for op in (op for op in ops if op.name == "TANH"):
        # tanh(sqrt(2/pi) * (x + 0.044715 * x^3)), x the intermediate FC output.
        scaled = made_by[op.inputs[0]]
        inner = made_by[scaled.inputs[0]]
        cubic = made_by[inner.inputs[1]]
        x3 = made_by[cubic.inputs[0]]
        x2 = made_by[x3.inputs[0]]
        x = inner.inputs[0]
        assert made_by[x].name == "FULLY_CONNECTED"
        assert t[x].shape == (1, cfg.seq, cfg.intermediate)
        assert [o.name for o in (scaled, inner, cubic, x3, x2)] == [
            "MUL", "ADD", "MUL", "MUL", "MUL"]
        assert x2.inputs == [x, x] and x3.inputs[1] == x
        for const, value in ((scaled.inputs[1], np.sqrt(2 / np.pi)),
                             (cubic.inputs[1], 0.044715)):
            q = t[const].quantization
            real = (t[const].data.astype(np.float64) - q.zero_point[0]) * q.scale[0]
            assert real == pytest.approx(value, rel=0.01)
        # The tanh output feeds ADD(., 1) whose result multiplies 0.5 * x.
        (plus_one,) = [u for u in ops if op.outputs[0] in u.inputs]
        (final,) = [u for u in ops if plus_one.outputs[0] in u.inputs]
        assert plus_one.name == "ADD" and final.name == "MUL"
        half_x = made_by[final.inputs[0]]
        assert half_x.name == "MUL" and half_x.inputs[0] == x
        assert [u.name for u in ops if final.outputs[0] in u.inputs] == ["FULLY_CONNECTED"]


def test_attention_scale_folded_into_query(built):
    folded = build_bert(**PRESETS["tiny"], attention_scale="fold")
    _, ops = _ops(folded.tflite)
    _, mul_ops = _ops(built["tiny"].tflite)
    made_by = _producer(ops)
    softmax_inputs = [made_by[op.inputs[0]].name for op in ops if op.name == "SOFTMAX"]
    assert softmax_inputs == ["BATCH_MATMUL"] * 2
    made_by = _producer(mul_ops)
    softmax_inputs = [made_by[op.inputs[0]].name for op in mul_ops if op.name == "SOFTMAX"]
    assert softmax_inputs == ["MUL"] * 2
    ids = folded.random_ids(1)[0]
    np.testing.assert_allclose(folded.float_logits(ids), built["tiny"].float_logits(ids),
                               rtol=1e-4, atol=1e-4)


# -- quantization --------------------------------------------------------------------

def test_quantization_parameters(built):
    sg, ops = _ops(built["tanh"].tflite)
    t = sg.tensors
    for op in ops:
        out = t[op.outputs[0]]
        if op.name == "DEQUANTIZE":
            continue
        assert out.type == INT8 and out.quantization.scale.size == 1, out.name
        if op.name == "SOFTMAX":
            assert out.quantization.params == (pytest.approx(1 / 256), -128)
        elif op.name == "TANH":
            assert out.quantization.params == (pytest.approx(1 / 128), 0)
        elif op.name in ("RESHAPE", "TRANSPOSE", "GATHER", "STRIDED_SLICE"):
            assert out.quantization.params == t[op.inputs[0]].quantization.params
        elif op.name in ("RSQRT", "SQUARED_DIFFERENCE"):
            # Non-negative values: the range starts at zero.
            assert out.quantization.params[1] == -128
        if op.name == "RSQRT":
            assert t[op.inputs[0]].quantization.params[1] == -128
        if op.name == "FULLY_CONNECTED":
            x, w, b = (t[i] for i in op.inputs)
            wq, bq = w.quantization, b.quantization
            assert w.type == INT8 and b.type == INT32
            assert wq.quantized_dimension == 0 and wq.scale.size == w.shape[0] > 1
            assert not wq.zero_point.any() and not bq.zero_point.any()
            assert np.abs(w.data.astype(int)).max(axis=1).min() == 127
            in_scale = x.quantization.params[0]
            np.testing.assert_allclose(bq.scale, in_scale * wq.scale, rtol=1e-6)
