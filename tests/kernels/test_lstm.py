"""UNIDIRECTIONAL_SEQUENCE_LSTM (fully integer) against LiteRT BUILTIN_REF.

The real reference is the LSTM of ``keras_lstm_mnist_ptq.tflite`` (cut out
with its weights and intermediates); generated variants cover other sizes,
sequence lengths, batch sizes, time-major input, CIFG, projection, cell and
projection clipping and cell-state scales 2^-9 .. 2^-15.  Everything is
compared bit for bit: gemmlowp's int16 sigmoid/tanh are reproduced exactly.

The state tensors persist across invocations in both runtimes, so several
consecutive runs of one prepared model are compared too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coralrt._formats.segment import build_segment
from coralrt import load_model
from coralrt.testing import ModelBuilder
from coralrt._model.extract import extract
from coralrt._sim.runner import SegmentRunner
from coralrt._sim.kernels import lstm as lstm_kernels

from .harness import check

# ../shared/models beside the repository (tests/kernels -> tests -> repository root).
REAL_MODEL = Path(__file__).resolve().parents[3] / "shared" / "models" / "keras_lstm_mnist_ptq.tflite"


def _run_both(data: bytes, batches: list[list[np.ndarray]]):
    """Run consecutive inputs through one LiteRT interpreter and one runner."""
    from conftest import litert_module
    Interpreter, OpResolverType = litert_module().Interpreter, litert_module().OpResolverType
    interp = Interpreter(model_content=data,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    interp.allocate_tensors()
    runner = SegmentRunner(build_segment(load_model(data)))
    for inputs in batches:
        for detail, value in zip(interp.get_input_details(), inputs):
            interp.set_tensor(detail["index"], value)
        interp.invoke()
        want = [interp.get_tensor(d["index"]) for d in interp.get_output_details()]
        got = runner.run(list(inputs))
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)


# -- the real model ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_lstm() -> bytes:
    if not REAL_MODEL.exists():
        pytest.skip(f"{REAL_MODEL} is not available")
    model = load_model(REAL_MODEL.read_bytes())
    return extract(model, [1]).model.to_bytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), kind=st.sampled_from(["uniform", "image", "extreme"]))
def test_real_model_lstm(real_lstm, seed, kind):
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        x = rng.integers(-128, 128, (1, 28, 28))
    elif kind == "image":      # mostly background (-128) with bright strokes, like MNIST
        x = np.where(rng.random((1, 28, 28)) < 0.2, rng.integers(0, 128, (1, 28, 28)), -128)
    else:
        x = rng.choice([-128, 127], (1, 28, 28))
    check(load_model(real_lstm), [x.astype(np.int8)])


def test_real_model_state_persists(real_lstm):
    rng = np.random.default_rng(7)
    runs = [[rng.integers(-128, 128, (1, 28, 28)).astype(np.int8)] for _ in range(3)]
    _run_both(real_lstm, runs)


def test_real_model_fixed_regression(real_lstm):
    x = (np.arange(28 * 28).reshape(1, 28, 28) % 256 - 128).astype(np.int8)
    want = check(load_model(real_lstm), [x])[0]
    # The first time step sees a zero state; the output must not be constant.
    assert len(np.unique(want)) > 5


# -- generated variants --------------------------------------------------------------------

def lstm_model(rng, *, batch, steps, n_input, n_cell, n_output, projection, cifg,
               time_major, cell_exp, cell_clip, proj_clip, proj_bias=True):
    """A single fully integer UNIDIRECTIONAL_SEQUENCE_LSTM built like the converter does."""
    b = ModelBuilder()
    sx = float(rng.uniform(0.004, 0.05))
    zx = int(rng.integers(-128, 128))
    sh = float(rng.uniform(0.004, 0.02))
    zh = int(rng.integers(-20, 21))
    x_shape = (steps, batch, n_input) if time_major else (batch, steps, n_input)
    x = b.input("x", x_shape, np.int8, scale=sx, zero_point=zx)

    def weights(name, rows, cols):
        w = rng.integers(-127, 128, (rows, cols)).astype(np.int8)
        return b.constant(name, w, scale=float(rng.uniform(0.002, 0.02)), zero_point=0)

    def bias(name, rows):
        return b.constant(name, rng.integers(-40000, 40000, rows).astype(np.int32),
                          scale=sx * 0.01, zero_point=0)

    gates = ("input", "forget", "cell", "output")
    w_x = [-1 if cifg and g == "input" else weights(f"wx_{g}", n_cell, n_input) for g in gates]
    w_h = [-1 if cifg and g == "input" else weights(f"wh_{g}", n_cell, n_output)
           for g in gates]
    biases = [-1 if cifg and g == "input" else bias(f"b_{g}", n_cell) for g in gates]
    hidden_scale = float(rng.uniform(0.004, 0.02))
    hidden_zp = int(rng.integers(-10, 11)) if projection else zh
    if projection:
        proj_w = weights("proj_w", n_output, n_cell)
        proj_b = (b.constant("proj_b", rng.integers(-3000, 3000, n_output).astype(np.int32),
                             scale=hidden_scale * 0.01, zero_point=0) if proj_bias else -1)
    else:
        proj_w = proj_b = -1
        hidden_scale = sh
    h_state = b.tensor("h_state", (batch, n_output), np.int8, scale=sh, zero_point=zh)
    c_state = b.tensor("c_state", (batch, n_cell), np.int16, scale=2.0 ** cell_exp,
                       zero_point=0)
    inter = [b.tensor(f"{g}_intermediate", (0,), np.float32) for g in gates]
    inter.append(b.tensor("hidden_intermediate", (0,), np.int8, scale=hidden_scale,
                          zero_point=hidden_zp))
    out_shape = (steps, batch, n_output) if time_major else (batch, steps, n_output)
    y = b.tensor("y", out_shape, np.int8, scale=sh, zero_point=zh)
    inputs = [x, *w_x, *w_h, -1, -1, -1, *biases, proj_w, proj_b, h_state, c_state,
              -1, -1, -1, -1]
    b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", inputs, [y], fused_activation_function="TANH",
         cell_clip=cell_clip, proj_clip=proj_clip, time_major=time_major)
    b.output(y)
    model = b.build()
    sg = model.main
    sg.operators[0].intermediates = inter
    sg.tensors[h_state].is_variable = True
    sg.tensors[c_state].is_variable = True
    return model, x_shape


@st.composite
def lstm_configs(draw):
    projection = draw(st.booleans())
    n_cell = draw(st.integers(1, 24))
    return dict(
        batch=draw(st.integers(1, 3)), steps=draw(st.integers(1, 10)),
        n_input=draw(st.integers(1, 40)), n_cell=n_cell,
        n_output=draw(st.integers(1, 16)) if projection else n_cell,
        projection=projection, cifg=draw(st.booleans()), time_major=draw(st.booleans()),
        cell_exp=draw(st.integers(-15, -9)),
        cell_clip=draw(st.sampled_from([0.0, 0.5, 3.0, 10.0])),
        proj_clip=draw(st.sampled_from([0.0, 0.3, 1.0])) if projection else 0.0,
        proj_bias=draw(st.booleans()),
    )


@settings(max_examples=400, deadline=None)
@given(cfg=lstm_configs(), seed=st.integers(0, 2**32 - 1))
def test_generated_lstm(cfg, seed):
    rng = np.random.default_rng(seed)
    model, x_shape = lstm_model(rng, **cfg)
    x = rng.integers(-128, 128, x_shape).astype(np.int8)
    check(model, [x])


@settings(max_examples=60, deadline=None)
@given(cfg=lstm_configs(), seed=st.integers(0, 2**32 - 1))
def test_generated_lstm_state_persists(cfg, seed):
    rng = np.random.default_rng(seed)
    model, x_shape = lstm_model(rng, **cfg)
    runs = [[rng.integers(-128, 128, x_shape).astype(np.int8)] for _ in range(3)]
    _run_both(model.to_bytes(), runs)


@pytest.mark.parametrize("cfg", [
    # Keras-like: no projection, batch-major, cell state 2^-12 with clip 10.
    dict(batch=1, steps=5, n_input=7, n_cell=6, n_output=6, projection=False, cifg=False,
         time_major=False, cell_exp=-12, cell_clip=10.0, proj_clip=0.0),
    dict(batch=2, steps=4, n_input=5, n_cell=8, n_output=3, projection=True, cifg=True,
         time_major=True, cell_exp=-11, cell_clip=0.0, proj_clip=0.5),
    dict(batch=3, steps=1, n_input=1, n_cell=1, n_output=1, projection=False, cifg=False,
         time_major=True, cell_exp=-15, cell_clip=0.0, proj_clip=0.0),
])
def test_generated_lstm_fixed(cfg):
    rng = np.random.default_rng(1234)
    model, x_shape = lstm_model(rng, **cfg)
    check(model, [rng.integers(-128, 128, x_shape).astype(np.int8)])


# -- the fixed-point activations on their own ----------------------------------------------

def test_activation_tables_close_to_float():
    # gemmlowp's int16 functions are not exactly monotonic (steps of a few lsb
    # where the exp barrel shifter switches terms); the LiteRT comparisons
    # above pin the exact values, this only guards the tables' layout.
    raw = np.arange(-32768, 32768)
    sig = lstm_kernels.sigmoid_q3_12().astype(np.int64)
    assert sig.shape == (65536,) and sig[32768] == 16384     # sigmoid(0) = 1/2
    np.testing.assert_allclose(sig / 32768, 1 / (1 + np.exp(-raw / 4096)), atol=2e-4)
    for bits in range(7):
        th = lstm_kernels.tanh_int16(bits).astype(np.int64)
        assert th[32768] == 0
        np.testing.assert_allclose(th / 32768, np.tanh(raw / 2.0 ** (15 - bits)), atol=4e-4)
