"""UNIDIRECTIONAL_SEQUENCE_LSTM's output and state types.

LiteRT's kernel checks neither: it writes its output and states with the
types of the arithmetic it picks (float32, or int8/int8/int16 for the fully
integer LSTM) into buffers sized by the declared types.  Validation requires
the output's type and states at least as wide (coralrt/_model/io_checks.py);
the crashes it guards are shown in a child process, and the LSTMs LiteRT
runs correctly (the real Keras model, float, hybrid, wider states) still load.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import shared_model
from support.litert_child import litert_outcome

from coralrt import InferenceSession
from coralrt.errors import ModelError
from coralrt.testing import ModelBuilder
from coralrt._model import load_model
from coralrt._model.writer import write_model
from coralrt._model.types import TENSOR_TYPES

HAVE_LITERT = importlib.util.find_spec("ai_edge_litert") is not None
KERAS_LSTM = "keras_lstm_mnist_ptq.tflite"


def _lstm(kind: str = "integer", *, batch: int = 1, steps: int = 4, n_input: int = 8,
          n_cell: int = 8) -> bytes:
    """One UNIDIRECTIONAL_SEQUENCE_LSTM (no peepholes, projection or layer norm):
    ``integer`` (int8 input and weights, int8/int16 states, the 5 intermediates
    the converter writes), ``hybrid`` (float32 input, int8 weights) or ``float``."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    integer, float_io = kind == "integer", kind != "integer"
    act = dict(scale=0.02, zero_point=3) if integer else {}
    x = b.input("x", (batch, steps, n_input), np.float32 if float_io else np.int8, **act)

    def weights(name, cols):
        if kind == "float":
            return b.constant(name, rng.uniform(-0.5, 0.5, (n_cell, cols)).astype(np.float32))
        return b.constant(name, rng.integers(-127, 128, (n_cell, cols)).astype(np.int8),
                          scale=0.01, zero_point=0)

    def bias(name):
        if integer:
            return b.constant(name, rng.integers(-4000, 4000, n_cell).astype(np.int32),
                              scale=0.0002, zero_point=0)
        return b.constant(name, rng.uniform(-0.5, 0.5, n_cell).astype(np.float32))

    gates = ("i", "f", "c", "o")
    w_x = [weights(f"wx_{g}", n_input) for g in gates]
    w_h = [weights(f"wh_{g}", n_cell) for g in gates]
    biases = [bias(f"b_{g}") for g in gates]
    h = b.tensor("h_state", (batch, n_cell), np.int8 if integer else np.float32, **act)
    c = b.tensor("c_state", (batch, n_cell), np.int16 if integer else np.float32,
                 **(dict(scale=2.0 ** -11, zero_point=0) if integer else {}))
    inter = ([b.tensor(f"{g}_intermediate", (0,), np.float32) for g in gates]
             + [b.tensor("hidden_intermediate", (0,), np.int8, **act)]) if integer else []
    y = b.tensor("y", (batch, steps, n_cell), np.int8 if integer else np.float32, **act)
    b.op("UNIDIRECTIONAL_SEQUENCE_LSTM",
         [x, *w_x, *w_h, -1, -1, -1, *biases, -1, -1, h, c, -1, -1, -1, -1], [y],
         fused_activation_function="TANH", cell_clip=0.0, proj_clip=0.0, time_major=False)
    b.output(y)
    model = b.build()
    sg = model.main
    sg.operators[0].intermediates = inter
    sg.tensors[h].is_variable = sg.tensors[c].is_variable = True
    return write_model(model)


def _retyped(data: bytes, name: str, type_name: str) -> bytes:
    model = load_model(data)
    next(t for t in model.main.tensors if t.name == name).type = TENSOR_TYPES[type_name]
    return write_model(model)




# -- refused -------------------------------------------------------------------------------


@pytest.mark.parametrize("type_name", ["STRING", "INT4", "UINT32", "FLOAT64", "FLOAT32",
                                       "UINT8"])
def test_an_output_typed_unlike_the_integer_lstm_writes_is_refused(type_name):
    data = _retyped(_lstm(), "y", type_name)
    with pytest.raises(ModelError, match=rf"output type {type_name} is not INT8, the type "
                                         rf"LiteRT's integer UNIDIRECTIONAL_SEQUENCE_LSTM"):
        load_model(data)


@pytest.mark.parametrize("kind", ["float", "hybrid"])
def test_a_float_lstm_output_must_be_float32(kind):
    with pytest.raises(ModelError, match=rf"output type INT8 is not FLOAT32, the type "
                                         rf"LiteRT's {kind} UNIDIRECTIONAL_SEQUENCE_LSTM"):
        load_model(_retyped(_lstm(kind), "y", "INT8"))


@pytest.mark.parametrize("state,type_name", [("c_state", "INT8"), ("c_state", "UINT8"),
                                             ("c_state", "BOOL"), ("c_state", "INT4"),
                                             ("h_state", "INT4")])
def test_a_state_narrower_than_the_kernel_writes_is_refused(state, type_name):
    with pytest.raises(ModelError, match=rf"state \(input 1[89]\) of type {type_name} is "
                                         rf"narrower than the INT(8|16) values"):
        load_model(_retyped(_lstm(), state, type_name))


@pytest.mark.parametrize("target", ["cpu", "numpy", "sim"])
def test_the_real_lstm_with_a_retyped_output_is_refused_on_every_target(tmp_path, target):
    # The model fuzzer's case, with the LSTM's output as the model's output
    # (the RESHAPE after it is refused for its own reason).
    model = load_model(shared_model(KERAS_LSTM))
    sg = model.main
    k = next(i for i, op in enumerate(sg.operators) if op.name == "UNIDIRECTIONAL_SEQUENCE_LSTM")
    sg.operators = sg.operators[:k + 1]
    sg.outputs = [sg.operators[k].outputs[0]]
    model.signatures = []
    sg.tensors[sg.outputs[0]].type = TENSOR_TYPES["UINT32"]
    path = tmp_path / "lstm.tflite"
    path.write_bytes(write_model(model))
    kwargs = {"backend": "numpy"} if target == "numpy" else {}
    with pytest.raises(ModelError, match="output type UINT32 is not INT8"):
        InferenceSession(path, target="sim" if target == "sim" else "cpu", **kwargs)


@pytest.mark.skipif(not HAVE_LITERT, reason="ai-edge-litert is not installed")
@pytest.mark.parametrize("kernels", ["optimized", "reference"])
@pytest.mark.parametrize("case", ["STRING output", "INT8 cell state"])
def test_litert_itself_dies_on_what_is_refused(tmp_path, kernels, case):
    if case == "STRING output":
        data = _retyped(_lstm(), "y", "STRING")
    else:   # enough cells for the int16 writes to leave the arena's padding
        data = _retyped(_lstm(batch=4, steps=8, n_input=64, n_cell=256), "c_state", "INT8")
    path = tmp_path / "lstm.tflite"
    path.write_bytes(data)
    assert litert_outcome(path, kernels).startswith("died")


# -- still accepted ------------------------------------------------------------------------


@pytest.mark.skipif(not HAVE_LITERT, reason="ai-edge-litert is not installed")
@pytest.mark.parametrize("kind", ["integer", "hybrid", "float"])
def test_consistently_typed_lstms_run(tmp_path, kind):
    path = tmp_path / f"{kind}.tflite"
    path.write_bytes(_lstm(kind))
    session = InferenceSession(path, target="cpu")
    info = session.get_inputs()[0]
    out = list(session.run([np.ones(info.shape, info.dtype)]).values())[0]
    assert out.dtype == (np.int8 if kind == "integer" else np.float32)
    assert out.shape == (1, 4, 8)


@pytest.mark.skipif(not HAVE_LITERT, reason="ai-edge-litert is not installed")
@pytest.mark.parametrize("type_name", ["INT32", "FLOAT32"])
def test_a_wider_cell_state_is_accepted(tmp_path, type_name):
    # The kernel reads the state back with its own type: LiteRT's answer is the
    # int16 model's.
    want = InferenceSession(_lstm(), target="cpu")
    path = tmp_path / "wide.tflite"
    path.write_bytes(_retyped(_lstm(), "c_state", type_name))
    got = InferenceSession(path, target="cpu")
    x = np.arange(32, dtype=np.int8).reshape(1, 4, 8)
    np.testing.assert_array_equal(list(got.run([x]).values())[0],
                                  list(want.run([x]).values())[0])
