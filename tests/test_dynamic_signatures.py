"""Declared shapes against computed ones where the shape signature is dynamic.

LiteRT resizes an operator's output to the shape it computes while preparing;
a dimension that is -1 in the tensor's shape_signature is where converters
leave that to it (a text embedder's CONCATENATION of token ids, declared [1],
computes [2]).  coralrt compares such a dimension no more than LiteRT does.
The yardstick runs in a child process, LiteRT alone.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import litert_module

from coralrt import InferenceSession, load_model
from coralrt.errors import ModelError, UnsupportedOperatorError
from coralrt.testing import ModelBuilder

TARGETS = [("cpu", {}), ("cpu", {"backend": "numpy"}), ("sim", {}),
           ("sim", {"backend": "numpy"})]

_CHILD = r"""
import json, sys, numpy as np
from ai_edge_litert.interpreter import Interpreter
it = Interpreter(model_path=sys.argv[1])
it.allocate_tensors()
for d, v in zip(it.get_input_details(), json.loads(sys.argv[2])):
    it.set_tensor(d["index"], np.array(v, d["dtype"]))
it.invoke()
print(json.dumps([[it.get_tensor(d["index"]).tolist(), [int(n) for n in d["shape"]]]
                  for d in it.get_output_details()]))
"""


def _litert_child(path, inputs) -> list:
    """LiteRT's outputs (value, shape after allocation) from a child process."""
    litert_module()     # skip without LiteRT
    r = subprocess.run([sys.executable, "-c", _CHILD, str(path),
                        json.dumps([np.asarray(v).tolist() for v in inputs])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"LiteRT failed (exit {r.returncode}): {r.stderr[-500:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _embedder_head(*, custom: str | None = None, declared=(1,), signature=(-1,)):
    """Token ids: [CLS] + input, then +1000 (a broadcasting ADD whose output is
    dynamic too), then optionally a custom operator nobody provides."""
    b = ModelBuilder()
    x = b.input("ids", (1,), np.int32)
    cls = b.constant("cls", np.array([101], np.int32))
    y = b.tensor("joined", declared, np.int32, shape_signature=signature)
    b.op("CONCATENATION", [cls, x], [y], axis=0)
    off = b.constant("offset", np.array([1000], np.int32))
    z = b.tensor("shifted", declared, np.int32, shape_signature=signature)
    b.op("ADD", [y, off], [z])
    if custom is None:
        b.output(z)
    else:
        e = b.tensor("embedding", (1, 8), np.float32, shape_signature=(-1, 8))
        b.op(custom, [z], [e])
        b.output(e)
    return b.build()


def test_concatenation_with_dynamic_signature_loads_and_runs_like_litert(tmp_path):
    model = _embedder_head()
    path = tmp_path / "embedder_head.tflite"
    path.write_bytes(model.to_bytes())
    ids = np.array([7], np.int32)
    (value, shape), = _litert_child(path, [ids])
    assert shape == [2]                         # LiteRT resized the declared [1]
    want = np.array(value, np.int32)
    load_model(path)                            # no ModelError
    for target, kw in TARGETS:
        session = InferenceSession(path, target=target, **kw)
        got = session.run([ids])
        np.testing.assert_array_equal(got["shifted"], want, err_msg=f"{target} {kw}")
        # The shape LiteRT reports after allocating, not the file's placeholder.
        assert list(session.get_outputs()[0].shape) == shape, (target, kw)


def test_static_signature_that_disagrees_is_still_refused():
    """Without -1 in the signature the declared shape is what coralrt plans from:
    the rule stays as wide as before there."""
    with pytest.raises(ModelError, match=r"CONCATENATION output shape \[1\] is not \[2\]"):
        load_model(_embedder_head(signature=(1,)).to_bytes())
    with pytest.raises(ModelError, match=r"CONCATENATION output shape \[1\] is not \[2\]"):
        load_model(_embedder_head(signature=None).to_bytes())


def test_dynamic_embedder_needing_a_missing_custom_op_is_reported_as_such(tmp_path):
    model = _embedder_head(custom="TextEncoderNobodyShips")
    path = tmp_path / "embedder.tflite"
    path.write_bytes(model.to_bytes())
    load_model(path)
    for target, kw in TARGETS:
        with pytest.raises(UnsupportedOperatorError) as e:
            InferenceSession(path, target=target, **kw).run([np.array([7], np.int32)])
        assert e.value.op_name == "TextEncoderNobodyShips", (target, kw)
        assert e.value.where == "operator 2", (target, kw)
        assert "is not provided by the CPU backend or by any installed coralrt plugin" \
            in str(e.value)
