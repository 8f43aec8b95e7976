"""Each crash rule of validation is exactly as wide as the crash it prevents.

For every rule in coralrt/_model/quant_checks.py, xnnpack_checks.py,
op_checks.py and validate.py that exists because LiteRT dies on some
models, the tests build single-operator models on both sides of the rule's
boundary:

- just inside: validation accepts the model and LiteRT loads and runs it
  with both kernel sets (in a subprocess, which would die if the rule were
  too narrow);
- just outside: validation raises ModelError, and for one model per rule a
  subprocess shows that LiteRT really crashes there (SIGABRT / SIGSEGV).

Hypothesis draws the scales, betas and zero points; the boundaries are
computed here from the kernels' formulas (quoted in the rules' comments),
independently of the validation code.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import litert_module

from coralrt.errors import ModelError
from coralrt import load_model
from coralrt.testing import ModelBuilder
from coralrt._model.types import Model

F32 = np.float32
FLT_MIN = float(np.finfo(F32).tiny)
SETTINGS = settings(max_examples=int(os.environ.get("CORALRT_BOUNDS_EXAMPLES", "15")),
                    deadline=None, derandomize=bool(os.environ.get("CI")),
                    suppress_health_check=[HealthCheck.too_slow])

# -- LiteRT in a subprocess ------------------------------------------------------------------

_CHILD = r"""
import sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType

KERNELS = {"optimized": OpResolverType.AUTO, "reference": OpResolverType.BUILTIN_REF}
for line in sys.stdin:
    path, kernels = line.rstrip("\n").split("\t")
    try:
        # model_path maps the file read-only, as a deployed model would be.
        it = Interpreter(model_path=path, experimental_op_resolver_type=KERNELS[kernels],
                         num_threads=1)
        it.allocate_tensors()
        rng = np.random.default_rng(0)
        for d in it.get_input_details():
            dt = np.dtype(d["dtype"])
            if dt.kind in "iu":
                i = np.iinfo(dt)
                v = rng.integers(i.min, i.max, d["shape"], endpoint=True).astype(dt)
            elif dt.kind == "b":
                v = rng.integers(0, 2, d["shape"]).astype(bool)
            else:
                v = rng.standard_normal(d["shape"]).astype(dt)
            it.set_tensor(d["index"], v)
        it.invoke()
        for d in it.get_output_details():
            it.get_tensor(d["index"])
        answer = "ok"
    except Exception as e:
        answer = "error " + (str(e).splitlines() or [type(e).__name__])[0]
    sys.stdout.write(answer + "\n")
    sys.stdout.flush()
"""


class LiteRT:
    """A long-lived LiteRT process; a crash answers ``signal N`` and restarts it."""

    def __init__(self):
        self.proc = None
        self.dir = tempfile.TemporaryDirectory()

    def run(self, data: bytes, kernels: str) -> str:
        path = os.path.join(self.dir.name, "m.tflite")
        with open(path, "wb") as f:
            f.write(data)
        if self.proc is None or self.proc.poll() is not None:
            litert_module()   # the child needs it: skip here, not a child that dies at import
            self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True)
        self.proc.stdin.write(f"{path}\t{kernels}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            return f"signal {-code}" if code < 0 else f"exit {code}"
        return line.rstrip("\n")

    def runs(self, data: bytes, data_error: str | None = None) -> None:
        """Assert that both kernel sets load and run ``data`` (``data_error``: an
        error the random inputs may legitimately cause at run time)."""
        for kernels in ("optimized", "reference"):
            answer = self.run(data, kernels)
            ok = answer == "ok" or (data_error is not None and data_error in answer)
            assert ok, f"LiteRT ({kernels}) on a model validation accepts: {answer}"

    def crashes(self, data: bytes, kernels: str, sig: int) -> None:
        answer = self.run(data, kernels)
        assert answer == f"signal {sig}", f"LiteRT ({kernels}) was expected to die: {answer}"

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        self.dir.cleanup()


@pytest.fixture(scope="module")
def litert():
    w = LiteRT()
    yield w
    w.close()


def refused(data: bytes, match: str) -> None:
    with pytest.raises(ModelError, match=match):
        load_model(data)


# -- single-operator models ----------------------------------------------------------------

_ZP = {"uint8": 128, "int8": 0, "int16": 0}


def binary(op: str, s1, s2, so, dtype="uint8", out_dtype=None, shapes=((1, 4, 4, 3),) * 2,
           out_shape=None, **options) -> bytes:
    dt = np.dtype(dtype)
    b = ModelBuilder()
    x = b.input("x", shapes[0], dt, scale=s1, zero_point=_ZP[dtype])
    y = b.input("y", shapes[1], dt, scale=s2, zero_point=_ZP[dtype])
    out_shape = out_shape or tuple(np.broadcast_shapes(*shapes))
    if out_dtype == "bool":
        o = b.tensor("o", out_shape, np.bool_)
    else:
        o = b.tensor("o", out_shape, dt, scale=so, zero_point=_ZP[dtype])
    b.op(op, [x, y], [o], **options)
    b.output(o)
    return b.build().to_bytes()


def unary(op: str, si, so, dtype="uint8", zi=None, zo=None, out_dtype=None, quantized=True,
          **options) -> bytes:
    b = ModelBuilder()
    q_in = dict(scale=si, zero_point=_ZP[dtype] if zi is None else zi) if quantized else {}
    x = b.input("x", (1, 8), np.dtype(dtype), **q_in)
    odt = np.dtype(out_dtype or dtype)
    o = b.tensor("o", (1, 8), odt, **({} if odt.kind == "f" else dict(
        scale=so, zero_point=_ZP.get(odt.name, 0) if zo is None else zo)))
    b.op(op, [x], [o], **options)
    b.output(o)
    return b.build().to_bytes()


def f32_after(x: float) -> float:
    return float(np.nextafter(F32(x), F32(np.inf)))


def f32_before(x: float) -> float:
    return float(np.nextafter(F32(x), F32(0)))


# Scales a converter could write: positive normal float32, well inside the range
# so that 2^-20 of them stays normal.
scales = st.floats(min_value=1e-25, max_value=1e25, allow_nan=False,
                   allow_infinity=False).map(lambda v: float(F32(v)))


# -- ADD / SUB: the output rescaling multiplier ---------------------------------------------
# add.cc / sub.cc: m_out = 2 * max(s1, s2) / (2^20 * s_out) (2^15 for general
# INT16) must be below 1 for QuantizeMultiplierSmallerThanOneExp; it is 1 at
# s_out = 2 * max / 2^20, exactly representable in float32.

def _edge(s1: float, s2: float, left_shift: int) -> float:
    return float(F32(2.0) * F32(max(s1, s2))) / 2.0**left_shift


@SETTINGS
@given(s1=scales, s2=scales, dtype=st.sampled_from(["uint8", "int8"]),
       op=st.sampled_from(["ADD", "SUB"]))
def test_add_sub_output_scale_boundary(litert, s1, s2, dtype, op):
    edge = _edge(s1, s2, 20)
    inside = binary(op, s1, s2, f32_after(edge), dtype)
    load_model(inside)
    litert.runs(inside)
    refused(binary(op, s1, s2, edge, dtype), "output rescaling multiplier")
    # Far below: ADD aborts; SUB takes multipliers above 1 but computes garbage.
    refused(binary(op, s1, s2, edge / 64, dtype), "output rescaling multiplier")


@SETTINGS
@given(s1=scales, s2=scales, op=st.sampled_from(["ADD", "SUB"]))
def test_int16_general_add_sub_output_scale_boundary(litert, s1, s2, op):
    # Without pot_scale_int16 the INT16 kernels take the general path, left shift 15.
    edge = _edge(s1, s2, 15)
    inside = binary(op, s1, s2, f32_after(edge), "int16", pot_scale_int16=False)
    load_model(inside)
    litert.runs(inside)
    refused(binary(op, s1, s2, edge, "int16", pot_scale_int16=False),
            "output rescaling multiplier")


def test_add_sub_crash_at_the_boundary(litert):
    litert.crashes(binary("ADD", 1.0, 0.5, _edge(1.0, 0.5, 20)), "reference", signal.SIGABRT)
    litert.crashes(binary("SUB", 1.0, 0.5, _edge(1.0, 0.5, 20)), "optimized", signal.SIGABRT)
    litert.crashes(binary("ADD", 0.02, 0.01, 1e-30, "int8"), "optimized", signal.SIGABRT)


@SETTINGS
@given(s1=scales, s2=scales, so=scales, dtype=st.sampled_from(["uint8", "int8"]))
def test_mul_takes_any_output_scale(litert, s1, s2, so, dtype):
    # mul.cc uses QuantizeMultiplier, which never aborts: a tiny multiplier is
    # flushed to 0, a huge one kept (the AutoML traffic model has 3e30).
    m = binary("MUL", s1, s2, so, dtype)
    load_model(m)
    litert.runs(m)


def test_sub_above_one_gives_position_dependent_results(litert):
    # Why SUB's output multipliers above 1 are refused although LiteRT does not
    # crash: the same pair of inputs gives different outputs at different
    # positions (measured: 255 in scalar tail elements, 8 elsewhere).
    from conftest import run_litert

    b = ModelBuilder()
    x = b.input("x", (1, 7), np.uint8, scale=0.02, zero_point=128)
    y = b.input("y", (1, 7), np.uint8, scale=0.01, zero_point=100)
    o = b.tensor("o", (1, 7), np.uint8, scale=1e-12, zero_point=7)
    b.op("SUB", [x, y], [o])
    b.output(o)
    data = b.build().to_bytes()
    refused(data, "above 1")
    assert litert.run(data, "reference") == "ok"
    out = run_litert(data, [np.full((1, 7), 200, np.uint8), np.full((1, 7), 10, np.uint8)],
                     kernels="reference")[0]
    assert len(set(out.ravel().tolist())) > 1, out


# -- SQUARED_DIFFERENCE (INT8) -------------------------------------------------------------
# squared_difference.cc: m_out = (2 max)^2 / (2^14 * s_out), in double over float.

def _sqdiff_m(s1: float, s2: float, so: float) -> float:
    twice = float(F32(2.0) * F32(max(s1, s2)))
    return twice * twice / float(F32(2.0**14) * F32(so))


@SETTINGS
@given(s1=st.floats(1e-12, 1e12).map(lambda v: float(F32(v))),
       s2=st.floats(1e-12, 1e12).map(lambda v: float(F32(v))))
def test_squared_difference_output_scale_boundary(litert, s1, s2):
    # The first float32 whose m the kernel takes: below 1, and not so close to 1
    # (within 2^-32) that QuantizeMultiplier rounds it up to a shift of 1, which
    # aborts too (found by Hypothesis: s1=1e-12, s2=3.6e11 gave m = 1 - 8e-11).
    def aborts(so: float) -> bool:
        m = _sqdiff_m(s1, s2, so)
        # QuantizeMultiplier: std::round(frexp fraction * 2^31) reaching 2^31 adds 1 to
        # the shift.
        return not m < 1.0 or math.floor(math.frexp(m)[0] * 2.0**31 + 0.5) == 2**31

    so = float(F32((2.0 * max(s1, s2)) ** 2 / 2.0**14))
    while aborts(so):
        so = f32_after(so)
    while not aborts(f32_before(so)):
        so = f32_before(so)
    inside = binary("SQUARED_DIFFERENCE", s1, s2, so, "int8")
    load_model(inside)
    litert.runs(inside)
    refused(binary("SQUARED_DIFFERENCE", s1, s2, f32_before(so), "int8"),
            "output rescaling multiplier")


# -- comparisons -------------------------------------------------------------------------
# comparisons.cc: an 8-bit input scale below 1 goes to
# QuantizeMultiplierSmallerThanOneExp, one of 1 or more to
# QuantizeMultiplierGreaterThanOne: exactly 1.0 aborts.

COMPARISONS = ["EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL"]


@pytest.mark.parametrize("op", COMPARISONS)
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_comparison_input_scale_one(litert, op, dtype):
    for s in (f32_before(1.0), f32_after(1.0), 2.0**-40, 2.0**40):
        inside = binary(op, s, 0.5, None, dtype, out_dtype="bool")
        load_model(inside)
        litert.runs(inside)
    refused(binary(op, 1.0, 0.5, None, dtype, out_dtype="bool"), "input 0 has scale 1")
    refused(binary(op, 0.5, 1.0, None, dtype, out_dtype="bool"), "input 1 has scale 1")


def test_comparisons_crash_on_scale_one(litert):
    litert.crashes(binary("LESS", 1.0, 0.5, None, "uint8", out_dtype="bool"), "reference",
                   signal.SIGABRT)
    # INT16 takes the scaled path only for (NOT_)EQUAL with a quantized first input.
    litert.crashes(binary("EQUAL", 0.5, 1.0, None, "int16", out_dtype="bool"), "optimized",
                   signal.SIGABRT)
    inside = binary("LESS", 1.0, 1.0, None, "int16", out_dtype="bool")
    load_model(inside)
    litert.runs(inside)


# -- SOFTMAX and LOG_SOFTMAX (reference kernels) ------------------------------------------
# activations.cc, PreprocessSoftmaxScaling: beta * s_in * 2^26 must be above 1.

@SETTINGS
@given(beta=st.floats(1e-3, 1e3).map(lambda v: float(F32(v))))
def test_softmax_input_scale_boundary(litert, beta):
    s = float(F32(2.0**-26 / beta))
    while not float(F32(beta)) * s * 2.0**26 > 1.0:
        s = f32_after(s)
    while float(F32(beta)) * f32_before(s) * 2.0**26 > 1.0:
        s = f32_before(s)
    inside = unary("SOFTMAX", s, 1 / 256, "uint8", zo=0, beta=beta)
    load_model(inside)
    litert.runs(inside)
    refused(unary("SOFTMAX", f32_before(s), 1 / 256, "uint8", zo=0, beta=beta),
            "at most 2\\^-26")


def test_softmax_crashes_below_the_boundary_with_reference_kernels(litert):
    outside = unary("SOFTMAX", 2.0**-26, 1 / 256, "uint8", zo=0, beta=1.0)
    litert.crashes(outside, "reference", signal.SIGABRT)
    assert litert.run(outside, "optimized") == "ok"   # the table-based kernel runs it
    refused(unary("SOFTMAX", 0.1, 1 / 256, "uint8", zo=0, beta=0.0), "beta 0")


def test_log_softmax_input_scale_boundary(litert):
    inside = unary("LOG_SOFTMAX", f32_after(2.0**-26), 16 / 256, "uint8", zo=255)
    load_model(inside)
    litert.runs(inside)
    outside = unary("LOG_SOFTMAX", 2.0**-26, 16 / 256, "uint8", zo=255)
    refused(outside, "at most 2\\^-26")
    litert.crashes(outside, "reference", signal.SIGABRT)


# -- the XNNPACK delegate's QUANTIZE and BATCH_MATMUL --------------------------------------
# xnnpack_delegate.cc, GetXNNPackDatatype: a scale that is not a positive
# normal float or a zero point outside the type's range is logged through a
# null context while the delegate picks operators.

_RANGE = {"uint8": (0, 255), "int8": (-128, 127)}


@SETTINGS
@given(dtype=st.sampled_from(["uint8", "int8"]), side=st.sampled_from(["in", "out"]),
       offset=st.integers(0, 300))
def test_quantize_zero_point_boundary(litert, dtype, side, offset):
    lo, hi = _RANGE[dtype]
    for zp, ok in ((lo + offset % (hi - lo + 1), True), (hi + 1 + offset, False),
                   (lo - 1 - offset, False)):
        model = unary("QUANTIZE", 0.5, 0.25, dtype, **({"zi": zp} if side == "in" else {"zo": zp}))
        if ok:
            load_model(model)
            litert.runs(model)
        else:
            refused(model, f"zero point {zp} is outside")


@pytest.mark.parametrize("op", ["QUANTIZE", "BATCH_MATMUL"])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_xnnpack_scale_must_be_normal(litert, op, dtype):
    def model(scale):
        if op == "QUANTIZE":
            return unary("QUANTIZE", scale, 0.5, dtype)
        return binary("BATCH_MATMUL", scale, 0.5, 0.5, dtype, shapes=((1, 4, 3), (1, 3, 3)),
                      out_shape=(1, 4, 3))

    inside = model(FLT_MIN)
    load_model(inside)
    if op == "QUANTIZE" or dtype == "int8":   # LiteRT has no uint8 BATCH_MATMUL kernel
        litert.runs(inside)
    outside = model(f32_before(FLT_MIN))
    refused(outside, "not a positive normal float")
    litert.crashes(outside, "optimized", signal.SIGSEGV)


def test_quantize_from_float_checks_the_output(litert):
    inside = unary("QUANTIZE", None, FLT_MIN, "float32", out_dtype="uint8", quantized=False)
    load_model(inside)
    litert.runs(inside)
    outside = unary("QUANTIZE", None, 0.5, "float32", out_dtype="uint8", quantized=False,
                    zo=256)
    refused(outside, "zero point 256")
    litert.crashes(outside, "optimized", signal.SIGSEGV)


# -- INT16 SQRT and LOG --------------------------------------------------------------------

@pytest.mark.parametrize("op", ["SQRT", "LOG"])
def test_int16_sqrt_log_need_quantization(litert, op):
    inside = unary(op, 0.5, 0.5, "int16")
    load_model(inside)
    litert.runs(inside, data_error="only defined for non-negative values")
    b = ModelBuilder()
    x = b.input("x", (1, 8), np.int16)
    o = b.tensor("o", (1, 8), np.int16)
    b.op(op, [x], [o])
    b.output(o)
    outside = b.build().to_bytes()
    refused(outside, "no quantization parameters")
    litert.crashes(outside, "reference", signal.SIGSEGV)


# -- broadcasting rank -------------------------------------------------------------------
# broadcast_loop.h, BroadcastBinaryOpSimple: TFLITE_CHECK_LE(dims_count, 8).

def _broadcast_model(op, rank, dtype="float32", padded=False):
    a = (1,) * (rank - 2) + (2, 3)
    b_shape = (2, 3) if padded else (1,) * (rank - 1) + (3,)
    b = ModelBuilder()
    dt = np.dtype(dtype)
    x, y = b.input("x", a, dt), b.input("y", b_shape, dt)
    o = b.tensor("o", a, np.bool_ if op in COMPARISONS else dt)
    b.op(op, [x, y], [o])
    b.output(o)
    return b.build().to_bytes()


@pytest.mark.parametrize("op", ["ADD", "MUL", "MAXIMUM", "LESS", "DIV"])
def test_broadcast_rank_boundary(litert, op):
    inside = _broadcast_model(op, 8)
    load_model(inside)
    litert.runs(inside)
    outside = _broadcast_model(op, 9)
    refused(outside, "above rank 8")
    litert.crashes(outside, "reference", signal.SIGABRT)


def test_broadcast_of_shapes_equal_up_to_leading_ones():
    # ADD and MUL compare shapes padded to one rank and find nothing to
    # broadcast; MAXIMUM does not, and ADD on INT32 does not either.
    load_model(_broadcast_model("ADD", 12, padded=True))
    load_model(_broadcast_model("MUL", 12, "int32", padded=True))
    refused(_broadcast_model("MAXIMUM", 9, padded=True), "above rank 8")
    refused(_broadcast_model("ADD", 9, "int32", padded=True), "above rank 8")


def test_padded_broadcasts_run_or_crash_as_validation_says(litert):
    litert.runs(_broadcast_model("ADD", 12, padded=True))
    litert.crashes(_broadcast_model("ADD", 9, "int32", padded=True), "optimized", signal.SIGABRT)


# -- graph-level rules ---------------------------------------------------------------------

def _while_model(cond: int, body: int) -> bytes:
    c = ModelBuilder(name="cond")
    i = c.input("i", (1,), np.float32)
    lim = c.constant("lim", np.array([10], np.float32))
    r = c.tensor("r", (1,), np.bool_)
    c.op("LESS", [i, lim], [r])
    c.output(r)
    bd = ModelBuilder(name="body")
    i2 = bd.input("i", (1,), np.float32)
    one = bd.constant("one", np.array([1], np.float32))
    r2 = bd.tensor("r", (1,), np.float32)
    bd.op("ADD", [i2, one], [r2])
    bd.output(r2)
    b = ModelBuilder()
    x = b.input("x", (1,), np.float32)
    o = b.tensor("o", (1,), np.float32)
    b.op("WHILE", [x], [o], cond_subgraph_index=cond, body_subgraph_index=body)
    b.output(o)
    parts = [b.build(), c.build(), bd.build()]
    return Model(subgraphs=[p.main for p in parts],
                 buffers=[buf for p in parts for buf in p.buffers]).to_bytes()


def test_subgraph_call_cycle(litert):
    inside = _while_model(1, 2)
    load_model(inside)
    litert.runs(inside)
    outside = _while_model(1, 0)        # the body is the main subgraph itself
    refused(outside, r"call each other in a cycle \(0 -> 0\)")
    litert.crashes(outside, "reference", signal.SIGSEGV)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_split_count_must_match_outputs(litert, num_splits):
    def model(n):
        b = ModelBuilder()
        x = b.input("x", (1, 6), np.float32)
        axis = b.constant("axis", np.array(1, np.int32))
        outs = [b.tensor(f"o{k}", (1, 3), np.float32) for k in range(2)]
        b.op("SPLIT", [axis, x], outs, num_splits=n)
        b.output(*outs)
        return b.build().to_bytes()

    load_model(model(2))
    litert.runs(model(2))
    refused(model(num_splits), f"num_splits={num_splits} but the operator has 2 outputs")
    litert.crashes(model(num_splits), "optimized", signal.SIGSEGV)


def test_an_operator_may_not_write_a_constant(litert):
    def model(write_constant: bool):
        b = ModelBuilder()
        x = b.input("x", (1, 4), np.float32)
        c = b.constant("c", np.ones((1, 4), np.float32))
        t = c if write_constant else b.tensor("t", (1, 4), np.float32)
        y = b.tensor("y", (1, 4), np.float32)
        b.op("ADD", [x, x], [t])
        b.op("ADD", [t, x], [y])
        b.output(y)
        return b.build().to_bytes()

    load_model(model(False))
    litert.runs(model(False))
    refused(model(True), "output tensor 1 is a constant")
    litert.crashes(model(True), "optimized", signal.SIGSEGV)


def test_element_count_boundary():
    # Not run: LiteRT needs gigabytes for these.  Measured with ai-edge-litert
    # 2.3: a (2, 2^30 + 8) uint8 RELU or ADD returns zeros (its C int element
    # count overflows); (2^29 + 16,) float32 (over 2 GiB, fewer elements) runs
    # correctly, so bytes are not the limit.
    def model(shape, dtype):
        b = ModelBuilder()
        x = b.input("x", shape, dtype)
        o = b.tensor("o", shape, dtype)
        b.op("RELU", [x], [o])
        b.output(o)
        return b.build()

    load_model(model((2**29 + 16,), np.float32))
    load_model(model((1, 2**31 - 1), np.uint8))
    with pytest.raises(ModelError, match="more than TFLite's kernels count"):
        load_model(model((2, 2**30), np.uint8))


def test_signature_subgraph_boundary():
    # Outside, LiteRT's signature runner for that signature dies with SIGSEGV
    # (measured with get_signature_runner on multi_signatures.tflite).
    from conftest import shared_model

    from coralrt._model import flatbuf

    tree = flatbuf.decode(shared_model("multi_signatures.tflite").read_bytes())
    tree["signature_defs"][1]["subgraph_index"] = 1
    load_model(flatbuf.encode(tree))
    tree["signature_defs"][1]["subgraph_index"] = 2
    refused(flatbuf.encode(tree), "subgraph index 2 is out of range")


def test_boundaries_are_float32_exact():
    # The edges used above are exact in float32, so "just inside" is one ulp away.
    for s1, s2 in ((1.0, 0.5), (3e-7, 2e5)):
        edge = _edge(s1, s2, 20)
        assert float(F32(edge)) == edge and math.isfinite(edge)
