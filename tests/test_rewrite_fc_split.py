"""The fc_as_conv, split_wide and split_embedding rewrites: valid models, the same
outputs as the original in LiteRT, what maps before and after, the simulated
Edge TPU against LiteRT's reference kernels on the rewritten graphs, records,
and what the rewrites leave alone."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_litert

from coralrt._compile.checks import INPUT_WIDTH_LIMIT, WIDTH_LIMIT, WIDTH_LIMIT_GELU
from coralrt._compile.partition import partition
from coralrt._compile.rewrite.base import run_rewrites
from coralrt._compile.rewrite.fc_conv import FC_AS_CONV
from coralrt._compile.rewrite.split import SPLIT_EMBEDDING, SPLIT_WIDE, part_sizes
from coralrt._compile.rules import OpView, default_rules
from coralrt import load_model
from coralrt.testing import ModelBuilder
from kernels.harness import check

# -- models ---------------------------------------------------------------------------------


def _fc(b, rng, x, n, k, dtype, out_shape, *, keep=False, per_channel=True, act="NONE",
        name="y", in_scale=0.02):
    """An FC layer reading ``x`` (n wide) with k outputs; returns its output tensor."""
    if dtype == np.int8:
        ws = rng.uniform(0.002, 0.02, k).astype(np.float32) if per_channel \
            else np.float32(0.01)
        w = b.constant(f"{name}/w", rng.integers(-127, 128, (k, n)).astype(np.int8),
                       scale=ws, zero_point=0, axis=0)
        out_zp = 3
    else:
        ws = np.float32(0.01)
        w = b.constant(f"{name}/w", rng.integers(0, 256, (k, n)).astype(np.uint8),
                       scale=ws, zero_point=121)
        out_zp = 131
    bs = (np.float32(in_scale) * np.asarray(ws, np.float32)).astype(np.float32)
    bias = b.constant(f"{name}/b", rng.integers(-3000, 3000, k).astype(np.int32),
                      scale=bs, zero_point=0)
    y = b.tensor(name, out_shape, dtype, scale=in_scale * 0.01 * 40 * np.sqrt(n),
                 zero_point=out_zp)
    b.op("FULLY_CONNECTED", [x, w, bias], [y], version=4 if dtype == np.int8 else 1,
         keep_num_dims=keep, fused_activation_function=act)
    return y


def _input(b, shape, dtype):
    return b.input("x", shape, dtype, scale=0.02, zero_point=-5 if dtype == np.int8 else 120)


def fc_3d_int8(act="NONE"):
    """int8 per-channel FC, (1, 16, 64) input, keep_num_dims: (1, 16, 48) output."""
    rng, b = np.random.default_rng(1), ModelBuilder()
    x = _input(b, (1, 16, 64), np.int8)
    b.output(_fc(b, rng, x, 64, 48, np.int8, (1, 16, 48), keep=True, act=act))
    return b.build()


def fc_2d_uint8():
    """uint8 per-tensor FC, (16, 64) input: (16, 40) output."""
    rng, b = np.random.default_rng(2), ModelBuilder()
    x = _input(b, (16, 64), np.uint8)
    b.output(_fc(b, rng, x, 64, 40, np.uint8, (16, 40), per_channel=False))
    return b.build()


def fc_4d_int8_per_tensor():
    """int8 per-tensor weights, (1, 2, 8, 32) input flattened to 16 rows."""
    rng, b = np.random.default_rng(3), ModelBuilder()
    x = _input(b, (1, 2, 8, 32), np.int8)
    b.output(_fc(b, rng, x, 32, 24, np.int8, (16, 24), per_channel=False))
    return b.build()


def fc_vector(k=32, n=64, dtype=np.int8):
    rng, b = np.random.default_rng(4), ModelBuilder()
    x = _input(b, (1, n), dtype)
    b.output(_fc(b, rng, x, n, k, dtype, (1, k)))
    return b.build()


def fc_float():
    rng, b = np.random.default_rng(5), ModelBuilder()
    x = b.input("x", (16, 64), np.float32)
    w = b.constant("w", rng.standard_normal((32, 64)).astype(np.float32))
    y = b.tensor("y", (16, 32), np.float32)
    b.op("FULLY_CONNECTED", [x, w, -1], [y])
    b.output(y)
    return b.build()


def fc_gelu(k=3000, n=512):
    """int8 FC (1, n) -> (1, k) read by a builtin GELU."""
    rng, b = np.random.default_rng(6), ModelBuilder()
    x = _input(b, (1, n), np.int8)
    h = _fc(b, rng, x, n, k, np.int8, (1, k), name="h")
    g = b.tensor("g", (1, k), np.int8, scale=0.03, zero_point=-100)
    b.op("GELU", [h], [g], version=2)
    b.output(g)
    return b.build()


def conv_wide(k=5400, c=16):
    """A wide uint8 1x1 CONV_2D (per-tensor weights; LiteRT's quantized CONV_2D needs a
    bias)."""
    rng, b = np.random.default_rng(7), ModelBuilder()
    x = _input(b, (1, 2, 2, c), np.uint8)
    w = b.constant("w", rng.integers(0, 256, (k, 1, 1, c)).astype(np.uint8), scale=0.01,
                   zero_point=128)
    bias = b.constant("b", rng.integers(-3000, 3000, k).astype(np.int32),
                      scale=np.float32(0.02) * np.float32(0.01), zero_point=0)
    y = b.tensor("y", (1, 2, 2, k), np.uint8, scale=0.1, zero_point=128)
    b.op("CONV_2D", [x, w, bias], [y], padding="VALID", stride_w=1, stride_h=1)
    b.output(y)
    return b.build()


def embedding(width=768, then="add", dtype=np.int8):
    """GATHER of 16 ids from a constant (100, width) table, then an ADD of a constant
    (``then="add"``) or an FC over the 16 x width matrix (``then="fc"``)."""
    rng, b = np.random.default_rng(8), ModelBuilder()
    ids = b.input("ids", (16,), np.int32)
    lo, hi = (-128, 128) if dtype == np.int8 else (0, 256)
    zp = -2 if dtype == np.int8 else 126
    table = b.constant("table", rng.integers(lo, hi, (100, width)).astype(dtype),
                       scale=0.02, zero_point=zp)
    e = b.tensor("e", (16, width), dtype, scale=0.02, zero_point=zp)
    b.op("GATHER", [table, ids], [e], version=2 if dtype == np.int8 else 1, axis=0)
    if then == "add":
        pos = b.constant("pos", rng.integers(lo, hi, (16, width)).astype(dtype), scale=0.02,
                         zero_point=zp)
        y = b.tensor("y", (16, width), dtype, scale=0.04, zero_point=zp)
        b.op("ADD", [e, pos], [y], version=2 if dtype == np.int8 else 1)
    else:
        y = _fc(b, rng, e, width, 256, dtype, (16, 256))
    b.output(y)
    return b.build()


def _inputs(model, seed=0, count=1):
    rng = np.random.default_rng(seed)
    sets = []
    for _ in range(count):
        ins = []
        for t in (model.main.tensors[i] for i in model.main.inputs):
            if t.type_name == "INT32":
                ins.append(rng.integers(0, 100, t.shape).astype(np.int32))
            else:
                info = np.iinfo(t.dtype)
                ins.append(rng.integers(info.min, info.max + 1, t.shape).astype(t.dtype))
        sets.append(ins)
    return sets


def _rewrite(model, *rewrites):
    before = model.to_bytes()
    result = run_rewrites(model, list(rewrites))
    assert model.to_bytes() == before            # the caller's model is unchanged
    data = result.model.to_bytes()
    load_model(data)                             # coralrt's validation takes it
    return result, data


def _diff(a: bytes, b: bytes, kernels: str, inputs) -> np.ndarray:
    out = []
    for ins in inputs:
        x, y = run_litert(a, ins, kernels), run_litert(b, ins, kernels)
        assert [v.shape for v in x] == [v.shape for v in y]
        assert [v.dtype for v in x] == [v.dtype for v in y]
        out.append(np.concatenate([np.abs(p.astype(np.int64) - q.astype(np.int64)).ravel()
                                   for p, q in zip(x, y)]))
    return np.concatenate(out)


def _names(model):
    return [op.name for op in model.main.operators]


def _placements(model):
    return {o.index: o for o in partition(model, "multi").ops}


# -- fc_as_conv -----------------------------------------------------------------------------

FC_MODELS = {"int8_3d_keep_num_dims": fc_3d_int8, "uint8_2d": fc_2d_uint8,
             "int8_4d_per_tensor": fc_4d_int8_per_tensor,
             "int8_relu6": lambda: fc_3d_int8("RELU6")}


@pytest.mark.parametrize("build", FC_MODELS.values(), ids=FC_MODELS.keys())
def test_fc_as_conv_is_exact_with_default_kernels(build):
    model = build()
    result, data = _rewrite(model, FC_AS_CONV)
    assert _names(result.model) == ["RESHAPE", "CONV_2D", "RESHAPE"]
    inputs = _inputs(model, count=8)
    for kernels in ("optimized", "builtin"):
        assert _diff(model.to_bytes(), data, kernels, inputs).max() == 0
    # LiteRT's reference FULLY_CONNECTED rescales in double precision where the
    # convolution uses the fixed-point multiplier: measured at most 1 LSB on about
    # 0.1-0.3 % of the values of these models.
    d = _diff(model.to_bytes(), data, "reference", inputs)
    assert d.max() <= 1 and (d > 0).mean() < 0.01


@pytest.mark.parametrize("build", FC_MODELS.values(), ids=FC_MODELS.keys())
def test_fc_as_conv_maps_and_sim_matches_reference(build):
    model = build()
    before = _placements(model)
    assert before[0].unit == "cpu" and "not 1-D" in before[0].reason
    result, _ = _rewrite(model, FC_AS_CONV)
    assert all(o.unit == "tpu" for o in _placements(result.model).values())
    conv = result.model.main.operators[1]
    w = result.model.main.tensors[conv.inputs[1]]
    k, n = model.main.tensors[model.main.operators[0].inputs[1]].shape
    assert w.shape == (k, 1, 1, n)
    assert conv.version == (3 if w.type_name == "INT8" else 1)
    assert conv.options["padding"] == 1 and conv.options["stride_w"] == 1   # VALID
    check(result.model, _inputs(model, seed=5)[0])


def test_fc_as_conv_records():
    result, _ = _rewrite(fc_3d_int8(), FC_AS_CONV)
    (rec,) = result.records
    assert rec.rewrite == "fc_as_conv" and rec.exact
    assert rec.before == ("FULLY_CONNECTED 0",)
    assert rec.after == ("RESHAPE", "CONV_2D", "RESHAPE")
    assert "16x64" in rec.detail and result.applied == ["fc_as_conv"]


def test_fc_as_conv_leaves_vector_and_float_fcs_alone():
    for model in (fc_vector(), fc_vector(dtype=np.uint8), fc_float()):
        result = run_rewrites(model, [FC_AS_CONV])
        assert result.records == [] and _names(result.model) == ["FULLY_CONNECTED"]
    assert _placements(fc_vector())[0].unit == "tpu"


def test_fc_as_conv_leaves_non_constant_weights_alone():
    b = ModelBuilder()
    x = _input(b, (16, 64), np.int8)
    w = b.input("w", (32, 64), np.int8, scale=0.01, zero_point=0)
    y = b.tensor("y", (16, 32), np.int8, scale=0.5, zero_point=0)
    b.op("FULLY_CONNECTED", [x, w, -1], [y], version=4)
    b.output(y)
    assert run_rewrites(b.build(), [FC_AS_CONV]).records == []


# -- split_wide -----------------------------------------------------------------------------


def test_split_wide_fc_6000():
    model = fc_vector(k=6000, n=512)
    assert part_sizes(6000, 2) == [3000, 3000]
    before = _placements(model)
    assert before[0].unit == "cpu" and str(WIDTH_LIMIT) in before[0].reason
    assert "split_wide" in before[0].reason
    result, data = _rewrite(model, SPLIT_WIDE)
    assert _names(result.model) == ["FULLY_CONNECTED"] * 2 + ["CONCATENATION"]
    (rec,) = result.records
    assert rec.before == ("FULLY_CONNECTED 0",) and rec.exact
    assert rec.detail.startswith("6000 output split into 2 parts of 3000")
    sg = result.model.main
    assert [sg.tensors[op.outputs[0]].shape for op in sg.operators] == \
        [(1, 3000), (1, 3000), (1, 6000)]
    concat = sg.operators[2]
    assert concat.version == 2 and concat.options["axis"] == 1
    # Per-channel scales travel with their rows.
    w0 = model.main.tensors[model.main.operators[0].inputs[1]].quantization.scale
    w2 = sg.tensors[sg.operators[1].inputs[1]].quantization.scale
    assert np.array_equal(w2, w0[3000:])
    inputs = _inputs(model, count=4)
    for kernels in ("optimized", "reference"):
        assert _diff(model.to_bytes(), data, kernels, inputs).max() == 0
    assert all(o.unit == "tpu" for o in _placements(result.model).values())
    check(result.model, inputs[0])


def test_split_wide_fc_feeding_gelu_applies_gelu_per_part():
    model = fc_gelu(3000)
    before = _placements(model)
    assert before[0].unit == "cpu" and str(WIDTH_LIMIT_GELU) in before[0].reason
    result, data = _rewrite(model, SPLIT_WIDE)
    assert _names(result.model) == ["FULLY_CONNECTED"] * 2 + ["GELU"] * 2 + ["CONCATENATION"]
    (rec,) = result.records
    assert rec.before == ("FULLY_CONNECTED 0", "GELU 1")
    assert rec.detail.startswith("3000 output split into 2 parts of 1500")
    assert "GELU applied per part" in rec.detail
    sg = result.model.main
    g = model.main.tensors[model.main.outputs[0]]
    for op in sg.operators[2:4]:
        t = sg.tensors[op.outputs[0]]
        assert t.shape == (1, 1500) and t.quantization.params == g.quantization.params
    inputs = _inputs(model, count=4)
    for kernels in ("optimized", "reference"):
        assert _diff(model.to_bytes(), data, kernels, inputs).max() == 0
    after = _placements(result.model)
    assert [after[i].unit for i in range(4)] == ["tpu", "tpu", "cpu", "cpu"]
    # The CONCATENATION after the GELUs is supported, but alone it does not pay for a
    # round trip to the Edge TPU (the cost model leaves it on the CPU).
    assert after[4].reason.startswith("Not offloaded")
    assert default_rules().check(OpView(sg, sg.operators[4], 4)) is None
    # The simulated Edge TPU on the parts that map.
    check(result.model.extract([0, 1]), inputs[0])
    gelu_out = run_litert(result.model.extract([0, 1, 2, 3]).to_bytes(), inputs[0])
    check(result.model.extract([4]), gelu_out)


def test_split_wide_before_a_tanh_chain_concatenates_in_front_of_it():
    rng, b = np.random.default_rng(11), ModelBuilder()
    x = _input(b, (1, 64), np.int8)
    h = _fc(b, rng, x, 64, 3000, np.int8, (1, 3000), name="h")
    t = b.tensor("t", (1, 3000), np.int8, scale=1 / 128, zero_point=0)
    b.op("TANH", [h], [t], version=2)
    b.output(t)
    model = b.build()
    result, data = _rewrite(model, SPLIT_WIDE)
    assert _names(result.model) == ["FULLY_CONNECTED"] * 2 + ["CONCATENATION", "TANH"]
    assert "limit 2728" in result.records[0].detail
    assert _diff(model.to_bytes(), data, "reference", _inputs(model, count=2)).max() == 0
    check(result.model, _inputs(model)[0])


def test_split_wide_uint8_conv_and_uneven_parts():
    model = conv_wide(5400)
    assert _placements(model)[0].unit == "cpu"
    result, data = _rewrite(model, SPLIT_WIDE)
    sg = result.model.main
    assert [sg.tensors[op.outputs[0]].shape[-1] for op in sg.operators] == [2700, 2700, 5400]
    assert sg.operators[2].version == 1 and sg.operators[2].options["axis"] == 3
    inputs = _inputs(model, count=3)
    for kernels in ("optimized", "reference"):
        assert _diff(model.to_bytes(), data, kernels, inputs).max() == 0
    check(result.model, inputs[0])
    model = conv_wide(10753)                           # 3 parts: 3585, 3584, 3584
    result, data = _rewrite(model, SPLIT_WIDE)
    sg = result.model.main
    assert [sg.tensors[op.outputs[0]].shape[-1] for op in sg.operators[:3]] == \
        part_sizes(10753, 3) == [3585, 3584, 3584]
    assert "as equal as possible" in result.records[0].detail
    assert _diff(model.to_bytes(), data, "optimized", _inputs(model)).max() == 0


def test_fc_as_conv_then_split_wide():
    rng, b = np.random.default_rng(9), ModelBuilder()
    x = _input(b, (1, 4, 32), np.int8)
    b.output(_fc(b, rng, x, 32, 6000, np.int8, (1, 4, 6000), keep=True))
    model = b.build()
    result, data = _rewrite(model, FC_AS_CONV, SPLIT_WIDE)
    assert _names(result.model) == ["RESHAPE", "CONV_2D", "CONV_2D", "CONCATENATION",
                                    "RESHAPE"]
    assert [r.before for r in result.records] == [("FULLY_CONNECTED 0",),
                                                   ("CONV_2D (from FULLY_CONNECTED 0)",)]
    assert _diff(model.to_bytes(), data, "optimized", _inputs(model, count=2)).max() == 0
    assert all(o.unit == "tpu" for o in _placements(result.model).values())
    check(result.model, _inputs(model)[0])


def test_split_wide_leaves_narrow_layers_alone():
    for model in (fc_vector(k=WIDTH_LIMIT), fc_gelu(WIDTH_LIMIT_GELU, n=16), fc_float()):
        result = run_rewrites(model, [SPLIT_WIDE])
        assert result.records == [] and _names(result.model) == _names(model)


# -- split_embedding ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_split_embedding(dtype):
    model = embedding(dtype=dtype)
    rules = default_rules()
    assert rules.check(OpView(model.main, model.main.operators[1], 1)) is None  # ADD maps
    result, data = _rewrite(model, SPLIT_EMBEDDING)
    assert _names(result.model) == ["GATHER", "GATHER", "CONCATENATION", "ADD"]
    (rec,) = result.records
    assert rec.before == ("GATHER 0",) and rec.exact
    assert rec.detail.startswith("16x768 lookup split into 2 parts of 384")
    sg = result.model.main
    for op in sg.operators[:2]:
        assert sg.tensors[op.inputs[0]].shape == (100, 384)
        assert sg.tensors[op.outputs[0]].shape == (16, 384)
    assert sg.tensors[sg.operators[2].outputs[0]].shape == (16, 768)
    assert sg.operators[2].version == (2 if dtype == np.int8 else 1)
    inputs = _inputs(model, count=3)
    for kernels in ("optimized", "reference"):
        assert _diff(model.to_bytes(), data, kernels, inputs).max() == 0
    reasons = [rules.check(OpView(sg, op, i)) for i, op in enumerate(sg.operators)]
    assert reasons[0] is not None and reasons[1] is not None     # GATHER: CPU
    assert reasons[2] is None and reasons[3] is None             # CONCATENATION, ADD map
    gathered = run_litert(result.model.extract([0, 1]).to_bytes(), inputs[0])
    check(result.model.extract([2, 3]), gathered)


def test_split_embedding_with_fc_as_conv_maps():
    model = embedding(then="fc")
    # Alone, split_embedding waits: the FC over the 16 x 768 matrix does not map.
    assert run_rewrites(model, [SPLIT_EMBEDDING]).records == []
    result, data = _rewrite(model, FC_AS_CONV, SPLIT_EMBEDDING)
    assert result.applied == ["fc_as_conv", "split_embedding"]
    assert _names(result.model) == ["GATHER", "GATHER", "CONCATENATION", "RESHAPE",
                                    "CONV_2D", "RESHAPE"]
    assert _diff(model.to_bytes(), data, "optimized", _inputs(model, count=2)).max() == 0
    after = _placements(result.model)
    assert [after[i].unit for i in range(6)] == ["cpu"] * 2 + ["tpu"] * 4
    ins = _inputs(model)[0]
    check(result.model.extract([2, 3, 4, 5]),
          run_litert(result.model.extract([0, 1]).to_bytes(), ins))


def test_split_embedding_lookup_uneven():
    rng, b = np.random.default_rng(10), ModelBuilder()
    ids = b.input("ids", (16,), np.int32)
    table = b.constant("table", rng.integers(-128, 128, (100, 1100)).astype(np.int8),
                       scale=0.02, zero_point=0)
    e = b.tensor("e", (16, 1100), np.int8, scale=0.02, zero_point=0)
    b.op("EMBEDDING_LOOKUP", [ids, table], [e], version=2)
    y = b.tensor("y", (16, 1100), np.int8, scale=0.04, zero_point=0)
    b.op("ADD", [e, e], [y], version=2)
    b.output(y)
    model = b.build()
    result, data = _rewrite(model, SPLIT_EMBEDDING)
    assert _names(result.model) == ["EMBEDDING_LOOKUP"] * 3 + ["CONCATENATION", "ADD"]
    sg = result.model.main
    assert [sg.tensors[op.inputs[1]].shape for op in sg.operators[:3]] == \
        [(100, 367), (100, 367), (100, 366)]
    assert "as equal as possible" in result.records[0].detail
    for kernels in ("optimized", "reference"):
        assert _diff(model.to_bytes(), data, kernels, _inputs(model, count=2)).max() == 0


def test_split_embedding_leaves_narrow_embeddings_alone():
    model = embedding(width=INPUT_WIDTH_LIMIT)
    result = run_rewrites(model, [SPLIT_EMBEDDING])
    assert result.records == [] and _names(result.model) == ["GATHER", "ADD"]


def test_rewrite_attributes():
    for r, name, order in ((FC_AS_CONV, "fc_as_conv", 200), (SPLIT_WIDE, "split_wide", 300),
                           (SPLIT_EMBEDDING, "split_embedding", 310)):
        assert (r.name, r.version, r.exact, r.order) == (name, 1, True, order)
        assert r.description
