"""Types and zero points that make LiteRT's kernels write past a buffer or abort
are refused before any kernel runs, on every target; the same operators with
consistent types run and agree with LiteRT.

The refused models were measured to crash LiteRT (see coralrt/_model/io_checks.py
and the zero-point rule in coralrt/_model/validate.py); the crash itself is
shown here in a child process, so that the refusal is known to guard a real
failure and not a habit of our own.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
from conftest import MODELS_DIR, REPO_ROOT, run_litert
from support.litert_child import litert_outcome

from coralrt import InferenceSession
from coralrt.errors import ModelError
from coralrt.testing import ModelBuilder
from coralrt._model.reader import load_model
from coralrt._model.writer import write_model

HAVE_LITERT = importlib.util.find_spec("ai_edge_litert") is not None

N = 4096
I32 = np.int32


def _i32(v):
    return np.asarray(v, I32)


def _single(op: str, a, b) -> bytes:
    """One ``op`` reading an ``a`` tensor into a ``b`` output (same element count)."""
    m = ModelBuilder()
    if op == "RESHAPE":
        x = m.input("x", (1, N), a)
        y = m.tensor("y", (N,), b)
        m.op(op, [x, m.constant("s", _i32([N]))], [y], new_shape=[N])
    elif op == "SQUEEZE":
        x = m.input("x", (1, N), a)
        y = m.tensor("y", (N,), b)
        m.op(op, [x], [y], squeeze_dims=[0])
    elif op in ("SUM", "MEAN", "REDUCE_MAX"):
        x = m.input("x", (64, 64), a)
        y = m.tensor("y", (64,), b)
        m.op(op, [x, m.constant("ax", _i32([1]))], [y])
    elif op == "CUMSUM":
        x = m.input("x", (N,), a)
        y = m.tensor("y", (N,), b)
        m.op(op, [x, m.constant("ax", _i32(0))], [y])
    elif op == "SEGMENT_SUM":
        x = m.input("x", (N,), a)
        y = m.tensor("y", (N,), b)
        m.op(op, [x, m.constant("s", _i32(np.arange(N)))], [y])
    elif op == "UNSORTED_SEGMENT_MAX":
        x = m.input("x", (N,), a)
        y = m.tensor("y", (N,), b)
        m.op(op, [x, m.constant("s", _i32(np.arange(N))), m.constant("n", _i32([N]))], [y])
    elif op == "EMBEDDING_LOOKUP":
        x = m.input("x", (64, 64), a)
        y = m.tensor("y", (64, 64), b)
        m.op(op, [m.constant("i", _i32(np.arange(64))), x], [y])
    else:
        raise KeyError(op)
    m.output(y)
    return write_model(m.build())


IO_OPS = ["RESHAPE", "SQUEEZE", "SUM", "MEAN", "REDUCE_MAX", "CUMSUM", "SEGMENT_SUM",
          "UNSORTED_SEGMENT_MAX", "EMBEDDING_LOOKUP"]



@pytest.mark.parametrize("op", IO_OPS)
@pytest.mark.parametrize("target", ["cpu", "numpy", "sim"])
def test_an_output_typed_unlike_what_the_kernel_writes_is_refused(tmp_path, op, target):
    path = tmp_path / f"{op}.tflite"
    path.write_bytes(_single(op, np.int32, np.uint8))
    kwargs = {"backend": "numpy"} if target == "numpy" else {}
    with pytest.raises(ModelError, match=rf"\({op}\): output type UINT8 differs from input"):
        InferenceSession(path, target="cpu" if target == "numpy" else target, **kwargs)


def test_an_equally_wide_type_is_refused_too(tmp_path):
    # int8 -> uint8 reinterprets bits; LiteRT's two kernel sets answer an int8
    # SUM into uint8 differently (128 and 0), so there is nothing to match.
    for op in ("RESHAPE", "SUM"):
        path = tmp_path / f"{op}.tflite"
        path.write_bytes(_single(op, np.int8, np.uint8))
        with pytest.raises(ModelError, match="differs from input"):
            InferenceSession(path, target="cpu")


@pytest.mark.skipif(not HAVE_LITERT, reason="ai-edge-litert is not installed")
@pytest.mark.parametrize("op,kernels", [("UNSORTED_SEGMENT_MAX", "optimized"),
                                        ("SEGMENT_SUM", "optimized")])
def test_litert_itself_dies_on_what_is_refused(tmp_path, op, kernels):
    path = tmp_path / f"{op}.tflite"
    path.write_bytes(_single(op, np.int32, np.uint8))
    assert litert_outcome(path, kernels).startswith("died")


@pytest.mark.needs_litert("the CPU target runs these operators with LiteRT")
@pytest.mark.parametrize("op", IO_OPS)
def test_consistent_types_still_run_and_match_litert(tmp_path, op):
    dtype = np.float32 if op in ("MEAN", "CUMSUM", "SEGMENT_SUM") else np.int32
    data = _single(op, dtype, dtype)
    session = InferenceSession(data, target="cpu")
    shape = session.get_inputs()[0].shape
    x = (np.arange(np.prod(shape)).reshape(shape) % 7).astype(dtype)
    got = list(session.run([x]).values())[0]
    assert got.dtype == dtype
    assert np.array_equal(got, run_litert(data, [x])[0])


@pytest.mark.needs_litert("the CPU target runs EMBEDDING_LOOKUP with LiteRT")
def test_the_hybrid_embedding_lookup_keeps_its_float_output(tmp_path):
    m = ModelBuilder()
    table = m.input("t", (8, 4), np.uint8, scale=0.5, zero_point=0)
    y = m.tensor("y", (8, 4), np.float32)
    m.op("EMBEDDING_LOOKUP", [m.constant("i", _i32(np.arange(8))), table], [y])
    m.output(y)
    path = tmp_path / "hybrid.tflite"
    path.write_bytes(write_model(m.build()))
    InferenceSession(path, target="cpu")   # accepted: 8-bit table, float32 output


# -- a real model, rewired or with one flipped zero point ---------------------------------

pytestmark_models = pytest.mark.skipif(not MODELS_DIR.is_dir(),
                                       reason=f"test models folder {MODELS_DIR} is absent")
MOBILENET = "mobilenet_v1_0.25_128_quant.tflite"


def _rewired_reshape(tmp_path):
    """MobileNet's final RESHAPE reading the int32 bias of the last convolution
    (1001 elements, like its uint8 output)."""
    model = load_model(MODELS_DIR / MOBILENET)
    sg = model.subgraphs[0]
    reshape = next(op for op in sg.operators if op.name == "RESHAPE")
    out = sg.tensors[reshape.outputs[0]]
    n = int(np.prod(out.shape))
    bias = next(k for k, t in enumerate(sg.tensors)
                if t.type_name == "INT32" and t.is_constant and int(np.prod(t.shape)) == n)
    reshape.inputs[0] = bias
    path = tmp_path / "rewired.tflite"
    path.write_bytes(write_model(model))
    return path


@pytestmark_models
@pytest.mark.parametrize("target", ["cpu", "numpy", "sim"])
def test_a_reshape_rewired_to_an_int32_bias_is_refused(tmp_path, target):
    path = _rewired_reshape(tmp_path)
    kwargs = {"backend": "numpy"} if target == "numpy" else {}
    with pytest.raises(ModelError, match=r"RESHAPE\): output type UINT8 differs from input "
                                         r"0's type INT32"):
        InferenceSession(path, target="cpu" if target == "numpy" else target, **kwargs)


@pytestmark_models
def test_coralrt_run_on_the_rewired_reshape_fails_cleanly(tmp_path):
    path = _rewired_reshape(tmp_path)
    r = subprocess.run([sys.executable, "-m", "coralrt", "run", str(path)], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode not in (0, -11), r.stdout[-500:]
    assert "differs from input 0's type INT32" in r.stderr
    assert "Traceback" not in r.stderr


def _flipped_zero_point(tmp_path, zp: int):
    model = load_model(MODELS_DIR / MOBILENET)
    sg = model.subgraphs[0]
    conv = next(op for op in sg.operators if op.name == "CONV_2D")
    q = sg.tensors[conv.outputs[0]].quantization
    q.zero_point = np.full_like(q.zero_point, zp)
    path = tmp_path / f"zp{zp}.tflite"
    path.write_bytes(write_model(model))
    return path


@pytestmark_models
@pytest.mark.parametrize("zp", [36192, 352, -1])
@pytest.mark.parametrize("target", ["cpu", "cpu-reference", "numpy", "sim"])
def test_a_zero_point_outside_the_type_is_refused_on_every_path(tmp_path, zp, target):
    path = _flipped_zero_point(tmp_path, zp)
    kwargs = {"backend": "numpy"} if target == "numpy" else {}
    if target == "cpu-reference":
        kwargs = {"cpu_kernels": "reference"}
    with pytest.raises(ModelError, match=rf"zero point {zp} is outside the UINT8 range"):
        InferenceSession(path, target="sim" if target == "sim" else "cpu", **kwargs)


@pytestmark_models
@pytest.mark.parametrize("zp", [0, 255])
def test_zero_points_at_the_ends_of_the_range_run(tmp_path, zp):
    path = _flipped_zero_point(tmp_path, zp)
    session = InferenceSession(path, target="cpu")
    shape = session.get_inputs()[0].shape
    out = list(session.run([np.full(shape, 128, np.uint8)]).values())[0]
    assert out.shape[-1] == 1001


# -- convolutions: LiteRT refuses these itself; every target refuses them too --------------


def _conv(op: str, base, x_type: str | None = None, y_type: str | None = None) -> bytes:
    """A 1x1 ``op`` on a 1x4x4x8 ``base`` (uint8 or float32) tensor, its input
    and output then retyped to ``x_type`` and ``y_type``."""
    from coralrt._model.types import TENSOR_TYPES
    m = ModelBuilder()
    q = {"scale": 0.05, "zero_point": 100} if base == np.uint8 else {}
    x = m.input("x", (1, 4, 4, 8), base, **q)
    shape = (8, 1, 1, 8) if op == "CONV_2D" else (1, 1, 1, 8)
    if base == np.uint8:
        w = m.constant("w", np.full(shape, 130, np.uint8), scale=0.01, zero_point=128)
        bias = m.constant("b", np.zeros(8, I32), scale=0.0005, zero_point=0)
    else:
        w = m.constant("w", np.full(shape, 0.5, np.float32))
        bias = m.constant("b", np.zeros(8, np.float32))
    y = m.tensor("y", (1, 4, 4, 8), base, **q)
    extra = {"depth_multiplier": 1} if op == "DEPTHWISE_CONV_2D" else {}
    m.op(op, [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1, **extra)
    m.output(y)
    model = m.build()
    for name, type_name in (("x", x_type), ("y", y_type)):
        if type_name is not None:
            next(t for t in model.main.tensors if t.name == name).type = TENSOR_TYPES[type_name]
    return write_model(model)


CONV_MISMATCHES = [(np.uint8, None, "INT16"), (np.uint8, None, "FLOAT64"),
                   (np.uint8, "INT8", None), (np.float32, None, "FLOAT16"),
                   (np.uint8, "INT32", "INT32")]


@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D"])
@pytest.mark.parametrize("base,x_type,y_type", CONV_MISMATCHES)
@pytest.mark.parametrize("target", ["cpu", "numpy", "sim"])
def test_a_convolution_typed_as_litert_refuses_is_refused_on_every_target(
        tmp_path, op, base, x_type, y_type, target):
    # Found by the model fuzzer: LiteRT refused a uint8 CONV_2D with an INT16
    # output (conv.cc: "output->type != input_type") while the simulated Edge
    # TPU and the NumPy backend ran it.
    path = tmp_path / f"{op}.tflite"
    path.write_bytes(_conv(op, base, x_type, y_type))
    kwargs = {"backend": "numpy"} if target == "numpy" else {}
    with pytest.raises(ModelError, match=rf"\({op}\): (input|output) type .* LiteRT refuses "
                                         rf"the model too"):
        InferenceSession(path, target="cpu" if target == "numpy" else target, **kwargs)


@pytest.mark.skipif(not HAVE_LITERT, reason="ai-edge-litert is not installed")
@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D"])
@pytest.mark.parametrize("base,x_type,y_type", CONV_MISMATCHES)
@pytest.mark.parametrize("kernels", ["optimized", "reference"])
def test_litert_refuses_those_convolutions_itself(op, base, x_type, y_type, kernels):
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    kind = OpResolverType.BUILTIN_REF if kernels == "reference" else OpResolverType.AUTO
    it = Interpreter(model_content=_conv(op, base, x_type, y_type),
                     experimental_op_resolver_type=kind)
    with pytest.raises(RuntimeError, match="failed to prepare"):
        it.allocate_tensors()


@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D"])
@pytest.mark.parametrize("base", [np.uint8, np.float32])
def test_consistently_typed_convolutions_still_load(op, base):
    load_model(_conv(op, base))
