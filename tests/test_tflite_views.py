"""``coralrt.tflite.Interpreter`` against LiteRT's ``Interpreter`` on the arrays
``tensor()`` hands out and on ``resize_tensor_input``: the same calls succeed
and the same calls raise, with the same outputs.

LiteRT refuses ``allocate_tensors()``, ``invoke()`` and
``resize_tensor_input()`` with RuntimeError while an array from ``tensor(i)()``
(or a slice or view of it) is referenced, and allows ``set_tensor`` and
``get_tensor`` then; its non-strict resize may change any dimension of an
input, zero included.  Every check runs both interpreters side by side.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from conftest import random_inputs, shared_model
from coralrt.tflite import Interpreter, load_delegate

litert = pytest.importorskip("ai_edge_litert.interpreter",
                             reason="ai-edge-litert is not installed: the tests compare "
                                    "against LiteRT")


def pair(name: str):
    path = str(shared_model(name))
    return Interpreter(model_path=path), litert.Interpreter(model_path=path)


def outcome(fn) -> str:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - what is compared
        return type(e).__name__
    return "ok"


def fill(it, seed: int = 0) -> None:
    for k, d in enumerate(it.get_input_details()):
        x = np.random.default_rng(seed + k).integers(0, 100, d["shape"]).astype(d["dtype"])
        it.set_tensor(d["index"], x)


# Ways to keep a reference to a tensor's memory: (name, function of the tensor() array).
HOLDS = [
    ("the array", lambda a: a),
    ("a slice", lambda a: a[0, :2]),
    ("a reshape", lambda a: a.reshape(-1)),
    ("a dtype view", lambda a: a.view(np.uint8)),
    ("np.asarray", lambda a: np.asarray(a)),
    ("a memoryview", lambda a: memoryview(a)),
]
CALLS = {
    "allocate_tensors": lambda it, i: it.allocate_tensors(),
    "invoke": lambda it, i: it.invoke(),
    "resize_tensor_input": lambda it, i: it.resize_tensor_input(i, [1, 8, 8, 3]),
    "set_tensor": lambda it, i: it.set_tensor(i, np.ones((1, 8, 8, 3), np.float32)),
    "get_tensor": lambda it, i: it.get_tensor(i),
}


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("which", ["input", "output"])
@pytest.mark.parametrize("how,hold", HOLDS, ids=[h for h, _ in HOLDS])
def test_a_held_tensor_array_blocks_the_same_calls_as_litert(how, hold, which, call):
    results = []
    for it in pair("add_float.tflite"):
        it.allocate_tensors()
        fill(it)
        it.invoke()
        d = (it.get_input_details() if which == "input" else it.get_output_details())[0]
        i = it.get_input_details()[0]["index"]
        held = hold(it.tensor(d["index"])())
        results.append(outcome(lambda: CALLS[call](it, i)))
        del held
        gc.collect()
        results.append(outcome(lambda: CALLS[call](it, i)))   # released: allowed again
    ours, theirs = results[:2], results[2:]
    assert ours == theirs, f"coralrt {ours}, LiteRT {theirs}"
    expected_blocked = call in ("allocate_tensors", "invoke", "resize_tensor_input")
    assert theirs == (["RuntimeError", "ok"] if expected_blocked else ["ok", "ok"])


def test_the_error_says_what_to_hold_instead():
    it = Interpreter(model_path=str(shared_model("add_float.tflite")))
    it.allocate_tensors()
    view = it.tensor(it.get_input_details()[0]["index"])()
    with pytest.raises(RuntimeError, match=r"tensor\(\).*'input'.*get_tensor\(\)"):
        it.invoke()
    del view


def test_functions_from_tensor_and_copies_may_be_held():
    """The pattern both document: hold the function, call it for each use."""
    outputs = []
    for it in pair("add_float.tflite"):
        it.allocate_tensors()
        inp = it.tensor(it.get_input_details()[0]["index"])
        out = it.tensor(it.get_output_details()[0]["index"])
        copies = []
        for k in range(3):
            inp().fill(float(k))
            it.invoke()
            copies.append(out().copy())
            copies.append(it.get_tensor(it.get_output_details()[0]["index"]))
        outputs.append(copies)
    for got, want in zip(*outputs):
        assert np.array_equal(got, want)


def test_a_view_cannot_carry_writes_across_a_resize():
    """Written through after a resize, an old view would feed nothing: both refuse
    the resize while it is alive, so the write cannot be lost silently."""
    for it in pair("hello_world_int8.tflite"):
        i = it.get_input_details()[0]["index"]
        it.allocate_tensors()
        view = it.tensor(i)()
        with pytest.raises(RuntimeError):
            it.resize_tensor_input(i, [3, 1])
        view[...] = 7
        del view
        it.resize_tensor_input(i, [3, 1])
        it.allocate_tensors()
        it.tensor(i)()[...] = 5                 # a fresh view of the new array
        it.invoke()
        assert it.get_tensor(i).tolist() == [[5], [5], [5]]


RESIZES = [
    ("add_float.tflite", [2, 8, 8, 3]),       # a fixed batch dimension
    ("add_float.tflite", [1, 4, 4, 3]),       # fixed spatial dimensions
    ("add_float.tflite", [1, 8, 8, 4]),       # a fixed channel dimension
    ("add_float.tflite", [0, 8, 8, 3]),       # batch 0
    ("add_quantized_int8.tflite", [3, 8, 8, 3]),
    ("hello_world_int8.tflite", [4, 1]),      # the -1 dimension
    ("hello_world_int8.tflite", [0, 1]),      # the -1 dimension, to 0
    ("hello_world_int8.tflite", [4, 2]),      # a fixed dimension too (FULLY_CONNECTED: 8 rows)
    ("hello_world_int8.tflite", [3, 0]),
    ("split_concat.tflite", [0, 8, 8, 6]),
    ("mobilenet_v1_0.25_128_quant.tflite", [1, 160, 160, 3]),
    ("mobilenet_v1_0.25_128_quant.tflite", [2, 128, 128, 3]),   # LiteRT: refused at allocate
]


@pytest.mark.parametrize("name,shape", RESIZES, ids=[f"{n}-{s}" for n, s in RESIZES])
def test_non_strict_resize_like_litert(name, shape):
    ours, theirs = pair(name)
    index = theirs.get_input_details()[0]["index"]
    steps = []
    for it in (ours, theirs):
        steps.append([outcome(lambda: it.resize_tensor_input(index, shape)),
                      outcome(it.allocate_tensors)])
    assert steps[0] == steps[1], f"coralrt {steps[0]}, LiteRT {steps[1]}"
    if steps[1][1] != "ok":
        assert steps[1][1] == "RuntimeError"
        for it in (ours, theirs):             # neither is ready to run
            with pytest.raises(RuntimeError):
                it.invoke()
        return
    for got, want in [(ours.get_input_details(), theirs.get_input_details()),
                      (ours.get_output_details(), theirs.get_output_details())]:
        for g, w in zip(got, want):
            assert g["shape"].tolist() == w["shape"].tolist()
            assert g["shape_signature"].tolist() == w["shape_signature"].tolist()
    for it in (ours, theirs):
        fill(it, seed=5)
        it.invoke()
    for d in theirs.get_output_details():
        got, want = ours.get_tensor(d["index"]), theirs.get_tensor(d["index"])
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_strict_resize_still_changes_only_the_dynamic_dimensions():
    for it in pair("add_float.tflite"):
        with pytest.raises(RuntimeError):
            it.resize_tensor_input(1, [2, 8, 8, 3], strict=True)
        it.resize_tensor_input(1, [1, 8, 8, 3], strict=True)    # unchanged: fine


def test_resizing_back_and_forth_reuses_one_model_copy():
    ours, theirs = pair("add_float.tflite")
    for shape in ([2, 8, 8, 3], [1, 8, 8, 3], [5, 8, 8, 3], [1, 4, 4, 3], [2, 8, 8, 3]):
        for it in (ours, theirs):
            it.resize_tensor_input(1, shape)
            it.allocate_tensors()
            fill(it, seed=sum(shape))
            it.invoke()
        assert np.array_equal(ours.get_tensor(2), theirs.get_tensor(2))
    assert ours.session is not ours._session          # runs a copy with dynamic dimensions
    assert ours.session.get_inputs()[0].shape_signature == (-1, -1, -1, 3)
    ours.close()


def test_a_change_of_rank_is_refused_at_allocate_with_the_reason():
    """LiteRT lets some models change an input's rank; coralrt keeps ranks and says so."""
    it = Interpreter(model_path=str(shared_model("add_float.tflite")))
    it.resize_tensor_input(1, [8, 8, 3])
    with pytest.raises(RuntimeError, match="rank 3; coralrt keeps the rank"):
        it.allocate_tensors()
    with pytest.raises(RuntimeError, match="not ready"):
        it.invoke()
    it.resize_tensor_input(1, [1, 8, 8, 3])
    it.allocate_tensors()
    it.invoke()


def test_on_the_simulated_edge_tpu_a_fixed_dimension_is_refused_at_allocate(monkeypatch):
    monkeypatch.setenv("CORALRT_TARGET", "sim")
    it = Interpreter(model_path=str(shared_model("mobilenet_v1_0.25_128_quant.tflite")),
                     experimental_delegates=[load_delegate("libedgetpu.so.1")])
    assert it.session.target == "sim"
    it.resize_tensor_input(0, [1, 160, 160, 3])
    with pytest.raises(RuntimeError, match="fixed"):
        it.allocate_tensors()
    it.resize_tensor_input(0, [1, 128, 128, 3])
    it.allocate_tensors()
    it.set_tensor(0, random_inputs(it.session.get_inputs(), seed=2)[0])
    it.invoke()
    it.close()
