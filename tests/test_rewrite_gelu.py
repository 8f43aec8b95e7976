"""The ``gelu`` rewrite: GELU (builtin or tanh form) as I-GELU in 8-bit models."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import run_litert
from kernels.harness import check

from coralrt._compile.partition import partition
from coralrt._compile.rewrite import run_rewrites
from coralrt._compile.rewrite.gelu import (
    FLOAT_MAX_ERROR, GELU_REWRITE, float_max_error, gelu_exact, igelu_float,
)
from coralrt import load_model
from coralrt.testing import ModelBuilder

SHAPE = (1, 16, 64)
EMITTED = ("MUL", "TANH", "MUL", "ADD", "MUL", "MUL", "ADD", "MUL", "ADD", "MUL")
QMIN = {np.int8: -128, np.uint8: 0}

# x in [-8, 8) and y in [-0.17, 8]: a typical FC output and its GELU.
X_SCALE = 16.0 / 255.0
Y_SCALE = 8.17 / 255.0
X_ZP = {np.int8: 0, np.uint8: 128}
Y_ZP = {np.int8: -123, np.uint8: 5}

# Measured on those models, every input code, against gelu_exact of the
# dequantized input (int8 and uint8 give the same figures): in output units.
REWRITTEN_MAX_UNITS = 0.85          # measured 0.842 (0.0270)
ORIGINAL_MAX_UNITS = 0.5            # measured 0.499: LiteRT's GELU table rounds once
FLOAT_ONLY_MAX = 0.0182             # what the approximation alone costs on [-8, 8]
TANH_FORM_MAX_UNITS = 1.55          # measured 1.53 (0.0490): the converter's graph as is


def every_code(dtype, shape=SHAPE) -> np.ndarray:
    """All 256 codes, repeated to fill ``shape``."""
    codes = np.arange(256, dtype=np.uint8).view(dtype)
    return np.resize(codes, shape).astype(dtype)


def dequant(model, t: int, values) -> np.ndarray:
    scale, zp = model.main.tensors[t].quantization.params
    return scale * (np.asarray(values, np.float64) - zp)


def gelu_model(dtype, *, count: int = 1, float_model: bool = False):
    """x -> GELU -> y (``count`` GELUs in a chain, each after an identity MUL)."""
    b = ModelBuilder()
    if float_model:
        x = b.input("x", SHAPE, np.float32)
    else:
        x = b.input("x", SHAPE, dtype, scale=X_SCALE, zero_point=X_ZP[dtype])
    for k in range(count):
        if k:
            one = b.tensor(f"one{k}", (1,), dtype, scale=1.0 / 127, zero_point=0,
                           data=np.array([127], dtype))
            z = b.tensor(f"z{k}", SHAPE, dtype, scale=X_SCALE, zero_point=X_ZP[dtype])
            b.op("MUL", [x, one], [z], version=2)
            x = z
        if float_model:
            y = b.tensor(f"y{k}", SHAPE, np.float32)
        else:
            y = b.tensor(f"y{k}", SHAPE, dtype, scale=Y_SCALE, zero_point=Y_ZP[dtype])
        b.op("GELU", [x], [y], version=1 if float_model else 2)
        x = y
    b.output(x)
    return b.build()


class _Graph:
    """Builds a quantized chain whose intermediate ranges come from float
    evaluation over every input code."""

    def __init__(self, dtype):
        self.b, self.dtype = ModelBuilder(), dtype
        self.x = self.b.input("x", SHAPE, dtype, scale=X_SCALE, zero_point=X_ZP[dtype])
        self.values = {self.x: X_SCALE * (every_code(dtype).astype(np.float64) - X_ZP[dtype])}
        self.k = 0

    def const(self, value, shape=()):
        self.k += 1
        if self.dtype == np.int8:
            code, scale = 127, value / 127
        else:
            code, scale = 255, value / 255
        data = np.full(shape, code, self.dtype)
        t = self.b.tensor(f"c{self.k}", shape, self.dtype, scale=scale, zero_point=0,
                          data=data)
        self.values[t] = np.float64(value)
        return t

    def _out(self, name, value, quant=None):
        if quant is None:
            lo, hi = min(float(value.min()), 0.0), max(float(value.max()), 0.0)
            scale = (hi - lo) / 255
            quant = (scale, int(round(QMIN[self.dtype] - lo / scale)))
        t = self.b.tensor(name, SHAPE, self.dtype, scale=quant[0], zero_point=quant[1])
        self.values[t] = value
        return t

    def op(self, name, a, b=None, quant=None):
        va = self.values[a]
        vb = None if b is None else self.values[b]
        value = {"MUL": lambda: va * vb, "ADD": lambda: va + vb,
                 "POW": lambda: va ** vb, "TANH": lambda: np.tanh(va)}[name]()
        if name == "TANH":
            quant = (1 / 128, 0 if self.dtype == np.int8 else 128)
        out = self._out(f"t{len(self.values)}", value, quant)
        self.b.op(name, [a] if b is None else [a, b], [out], version=2)
        return out


GAIN, CUBIC = math.sqrt(2 / math.pi), 0.044715


def tanh_form_model(dtype, variant: str = "tf", *, extra_output: bool = False):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in a few arrangements."""
    g = _Graph(dtype)
    x = g.x
    y_quant = (Y_SCALE, Y_ZP[dtype])
    if variant == "tf":                  # cube by MULs, constants right, 0.5 first
        x3 = g.op("MUL", g.op("MUL", x, x), x)
        inner = g.op("ADD", x, g.op("MUL", x3, g.const(CUBIC)))
        th = g.op("TANH", g.op("MUL", inner, g.const(GAIN)))
        bracket = g.op("ADD", th, g.const(1.0))
        y = g.op("MUL", g.op("MUL", x, g.const(0.5)), bracket, y_quant)
    elif variant == "pow":               # POW, constants left, 0.5 last, 1-element shapes
        x3 = g.op("POW", x, g.const(3.0, (1,)))
        inner = g.op("ADD", g.op("MUL", g.const(CUBIC, (1,)), x3), x)
        th = g.op("TANH", g.op("MUL", g.const(GAIN), inner))
        bracket = g.op("ADD", g.const(1.0, (1,)), th)
        y = g.op("MUL", g.const(0.5), g.op("MUL", x, bracket), y_quant)
    else:                                # x (x x), 0.5 on the bracket
        x3 = g.op("MUL", x, g.op("MUL", x, x))
        inner = g.op("ADD", x, g.op("MUL", g.const(CUBIC), x3))
        th = g.op("TANH", g.op("MUL", inner, g.const(GAIN)))
        half = g.op("MUL", g.op("ADD", th, g.const(1.0)), g.const(0.5))
        y = g.op("MUL", half, x, y_quant)
    g.b.output(y)
    if extra_output:
        g.b.output(th)
    return g.b.build()


def rewrite(model):
    return run_rewrites(model, [GELU_REWRITE])


def names(model) -> list[str]:
    return [op.name for op in model.main.operators]


def errors(model, rewritten, dtype):
    """(max |rewritten - GELU|, max |original - GELU|, max |rewritten - I-GELU|) in
    float, over every input code; the original only when LiteRT runs it."""
    codes = every_code(dtype)
    x = dequant(model, model.main.inputs[0], codes)
    y_t = rewritten.main.outputs[0]
    new = dequant(rewritten, y_t, run_litert(rewritten.to_bytes(), [codes],
                                             kernels="reference")[0])
    orig = None
    if "POW" not in names(model):
        orig = dequant(model, model.main.outputs[0],
                       run_litert(model.to_bytes(), [codes], kernels="reference")[0])
        orig = float(np.abs(orig - gelu_exact(x)).max())
    return (float(np.abs(new - gelu_exact(x)).max()), orig,
            float(np.abs(new - igelu_float(x)).max()))


# -- 1: no GELU left, valid TFLite, every new operator on the Edge TPU ------------------

@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_builtin_gelu_replaced_and_mapped(dtype):
    model = gelu_model(dtype)
    result = rewrite(model)
    new = result.model
    assert names(new) == list(EMITTED)
    assert "GELU" not in names(new) and "MINIMUM" not in names(model)
    # the output tensor is the GELU's own, with its quantization
    y = new.main.tensors[new.main.outputs[0]]
    assert y.name == "y0" and y.quantization.params == pytest.approx((Y_SCALE, Y_ZP[dtype]))
    assert new.main.operators[-1].outputs == new.main.outputs
    data = new.to_bytes()
    load_model(data)
    codes = every_code(dtype)
    ref = run_litert(data, [codes], kernels="reference")[0]
    opt = run_litert(data, [codes])[0]
    assert ref.dtype == dtype and ref.shape == SHAPE
    np.testing.assert_array_equal(opt, ref)
    plan = partition(new, "multi")
    assert [(o.unit, o.reason) for o in plan.ops if o.unit != "tpu"] == []
    assert len(plan.ops) == len(EMITTED)
    assert model.main.operators[0].name == "GELU"          # the caller's model is as it was


@pytest.mark.parametrize("variant", ["tf", "pow", "bracket"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_tanh_form_replaced_and_mapped(dtype, variant):
    model = tanh_form_model(dtype, variant)
    result = rewrite(model)
    new = result.model
    assert names(new) == list(EMITTED)
    assert [t.name for t in new.main.tensors if t.buffer is None and "/igelu/" not in t.name] \
        == ["x", model.main.tensors[model.main.outputs[0]].name]
    plan = partition(new, "multi")
    assert all(o.unit == "tpu" for o in plan.ops), [o.reason for o in plan.ops]
    (record,) = result.records
    assert len(record.before) == len(model.main.operators)
    assert sum(b.startswith("TANH ") for b in record.before) == 1
    worst, orig, _ = errors(model, new, dtype)
    assert worst <= REWRITTEN_MAX_UNITS * Y_SCALE
    if orig is not None:                 # the tanh form as quantized ops: 1.53 units
        assert worst < orig <= TANH_FORM_MAX_UNITS * Y_SCALE


def test_float_gelu_left_alone():
    model = gelu_model(np.float32, float_model=True)
    result = rewrite(model)
    assert result.records == [] and names(result.model) == ["GELU"]


def test_float_tanh_form_left_alone():
    b = ModelBuilder()
    x = b.input("x", SHAPE, np.float32)
    k = 0

    def op(name, *ins):
        nonlocal k
        k += 1
        out = b.tensor(f"t{k}", SHAPE, np.float32)
        b.op(name, list(ins), [out])
        return out

    def c(v):
        return b.tensor(f"c{v}", (), np.float32, data=np.array(v, np.float32))
    x3 = op("MUL", op("MUL", x, x), x)
    th = op("TANH", op("MUL", op("ADD", x, op("MUL", x3, c(CUBIC))), c(GAIN)))
    b.output(op("MUL", op("MUL", x, c(0.5)), op("ADD", th, c(1.0))))
    model = b.build()
    assert rewrite(model).records == []


@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_pattern_with_an_escaping_intermediate_left_alone(dtype):
    model = tanh_form_model(dtype, "tf", extra_output=True)
    result = rewrite(model)
    assert result.records == []
    assert names(result.model) == names(model)


def test_pattern_with_wrong_constants_left_alone():
    model = tanh_form_model(np.int8, "tf")
    sg = model.main
    # sqrt(2/pi) -> 0.7: no longer the GELU polynomial
    for t in sg.tensors:
        if t.buffer is not None and t.quantization.params[0] == pytest.approx(GAIN / 127):
            t.quantization.scale = np.array([0.7 / 127], np.float32)
    assert rewrite(model).records == []


# -- 2: accuracy over every input code --------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_accuracy_against_exact_gelu(dtype):
    model = gelu_model(dtype)
    new = rewrite(model).model
    worst, orig, vs_igelu = errors(model, new, dtype)
    # rewritten: 0.842 output units (0.0270) at most; LiteRT's GELU: 0.499 (0.0158)
    assert worst <= REWRITTEN_MAX_UNITS * Y_SCALE
    assert worst <= 0.0271
    assert orig <= ORIGINAL_MAX_UNITS * Y_SCALE
    assert worst > orig                  # it is an approximation
    # the approximation itself accounts for most of it: the quantized graph stays
    # within 0.62 output units of the float I-GELU (measured 0.614)
    assert vs_igelu <= 0.62 * Y_SCALE
    x = np.linspace(-8, 8, 20001)
    assert np.abs(igelu_float(x) - gelu_exact(x)).max() <= FLOAT_ONLY_MAX


@pytest.mark.parametrize("lo, hi", [(-1.0, 1.0), (-3.0, 3.0), (-6.0, 12.0), (-40.0, 40.0)])
def test_accuracy_across_input_ranges(lo, hi):
    """Other input ranges: within the float approximation's error on the range plus
    one output unit (output quantized over GELU's own range)."""
    dtype = np.int8
    sx = (hi - lo) / 255
    zx = int(round(-128 - lo / sx))
    y_lo = -0.17 if lo < -0.75 else float(gelu_exact(lo))
    so = (float(gelu_exact(hi)) - y_lo) / 255
    zo = int(round(-128 - y_lo / so))
    b = ModelBuilder()
    x = b.input("x", SHAPE, dtype, scale=sx, zero_point=zx)
    y = b.tensor("y", SHAPE, dtype, scale=so, zero_point=zo)
    b.op("GELU", [x], [y], version=2)
    b.output(y)
    model = b.build()
    new = rewrite(model).model
    codes = every_code(dtype)
    xs = sx * (codes.astype(np.float64) - zx)
    got = so * (run_litert(new.to_bytes(), [codes], kernels="reference")[0].astype(float) - zo)
    grid = np.linspace(lo, hi, 20001)
    approx = np.abs(igelu_float(grid) - gelu_exact(grid)).max()
    assert np.abs(got - gelu_exact(xs)).max() <= approx + 1.0 * so
    check(new, [codes])


def test_extremes_are_exact():
    """Large inputs pass through, very negative ones give 0, 0 gives 0."""
    dtype = np.int8
    new = rewrite(gelu_model(dtype)).model
    codes = every_code(dtype)
    got = dequant(new, new.main.outputs[0],
                  run_litert(new.to_bytes(), [codes], kernels="reference")[0])
    x = dequant(new, new.main.inputs[0], codes)
    assert np.all(got[x == 0] == 0.0)
    far = x <= -2.6
    assert np.all(np.abs(got[far]) <= 0.5 * Y_SCALE + 1e-9)
    big = x >= 3.0
    assert np.all(np.abs(got[big] - x[big]) <= 0.5 * Y_SCALE + 1e-9)


# -- 3: the simulated Edge TPU agrees with LiteRT's reference kernels bit for bit -------

@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_simulator_bit_exact(dtype):
    check(rewrite(gelu_model(dtype)).model, [every_code(dtype)])
    check(rewrite(tanh_form_model(dtype, "bracket")).model, [every_code(dtype)])


def test_small_input_scale_still_saturates_the_sign():
    """An input scale of 0.001: the sign gain is raised so the lowest codes saturate."""
    dtype = np.int8
    b = ModelBuilder()
    x = b.input("x", SHAPE, dtype, scale=0.001, zero_point=0)
    y = b.tensor("y", SHAPE, dtype, scale=0.0008, zero_point=-60)
    b.op("GELU", [x], [y], version=2)
    b.output(y)
    new = rewrite(b.build()).model
    sg = new.main
    sign_in = next(t for t, tensor in enumerate(sg.tensors) if tensor.name.endswith("sign_in"))
    sign = next(t for t, tensor in enumerate(sg.tensors) if tensor.name.endswith("/sign"))
    codes = every_code(dtype)
    sg.outputs = [sign_in, sign, *sg.outputs]
    t_codes, s_codes, _ = run_litert(new.to_bytes(), [codes], kernels="reference")
    assert set(np.unique(s_codes[codes > 0])) == {127}
    assert set(np.unique(s_codes[codes < 0])) == {-127}
    assert set(np.unique(s_codes[codes == 0])) == {0}
    assert set(np.unique(t_codes[codes != 0])) <= {127, -128}
    check(new, [codes])


# -- 4: records ----------------------------------------------------------------------------

def test_records_one_per_gelu():
    model = gelu_model(np.int8, count=3)
    assert names(model) == ["GELU", "MUL", "GELU", "MUL", "GELU"]
    result = rewrite(model)
    assert names(result.model) == [*EMITTED, "MUL", *EMITTED, "MUL", *EMITTED]
    assert [r.before for r in result.records] == [("GELU 0",), ("GELU 2",), ("GELU 4",)]
    for r in result.records:
        assert r.rewrite == "gelu" and r.exact is False
        assert r.after == EMITTED
        assert "[approximation]" in r.line()
    assert result.applied == ["gelu"]
    assert result.origin == [0] * 10 + [1] + [2] * 10 + [3] + [4] * 10
    codes = every_code(np.int8)
    run_litert(result.model.to_bytes(), [codes])


def test_rewrite_contract():
    r = GELU_REWRITE
    assert (r.name, r.version, r.exact, r.order) == ("gelu", 1, False, 100)
    assert isinstance(r.description, str) and r.description


# -- 5: the float helpers ----------------------------------------------------------------

def test_float_error_figure():
    worst, where = float_max_error(-10.0, 10.0)
    assert float(f"{worst:.3g}") == FLOAT_MAX_ERROR
    assert abs(abs(where) - 2.35) < 0.01
    x = np.linspace(-10, 10, 400_001)
    assert float(f"{np.abs(igelu_float(x) - gelu_exact(x)).max():.3g}") == FLOAT_MAX_ERROR


def test_float_helpers():
    x = np.array([-3.0, -1.0, 0.0, 0.5, 1.0, 3.0])
    want = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x])
    np.testing.assert_allclose(gelu_exact(x), want, rtol=0, atol=1e-15)
    assert igelu_float(0.0) == 0.0
    # beyond the clip the approximation is x (or 0) exactly
    np.testing.assert_allclose(igelu_float(np.array([4.0, -4.0])), [4.0, 0.0], atol=1e-12)
    assert abs(float(igelu_float(1.0)) - float(gelu_exact(1.0))) < FLOAT_MAX_ERROR
