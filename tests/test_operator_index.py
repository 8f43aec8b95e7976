"""A CPU operator named in an error is named by its index in the user's model,
on every target: not by its index in the CPU step a compiled model cut out,
nor in the model the rewrites made."""

from __future__ import annotations

import numpy as np
import pytest

from coralrt import InferenceSession
from coralrt._cli.partition_cmd import rewritten
from coralrt._compile.partition import partition
from coralrt.errors import UnsupportedOperatorError
from coralrt.testing import ModelBuilder

MISSING = "NoSuchDecoderOp"


def _model():
    """CONV_2D, RESHAPE and a FULLY_CONNECTED over a matrix (which multi mode's
    exact rewrites turn into three operators), then the missing custom operator
    (operator 3) and an ADD."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 16, 16, 32), np.uint8, scale=0.05, zero_point=128)
    w = b.constant("w", rng.integers(100, 156, (64, 3, 3, 32)).astype(np.uint8), scale=0.01,
                   zero_point=128)
    bias = b.constant("b", rng.integers(-100, 100, 64).astype(np.int32), scale=0.0005,
                      zero_point=0)
    c = b.tensor("c", (1, 16, 16, 64), np.uint8, scale=0.1, zero_point=128)
    b.op("CONV_2D", [x, w, bias], [c], padding="SAME", stride_w=1, stride_h=1)
    r = b.tensor("r", (1, 256, 64), np.uint8, scale=0.1, zero_point=128)
    b.op("RESHAPE", [c, b.constant("shape", np.array([1, 256, 64], np.int32))], [r])
    fw = b.constant("fw", rng.integers(100, 156, (48, 64)).astype(np.uint8), scale=0.01,
                    zero_point=128)
    fb = b.constant("fb", rng.integers(-100, 100, 48).astype(np.int32), scale=0.001,
                    zero_point=0)
    f = b.tensor("f", (1, 256, 48), np.uint8, scale=0.1, zero_point=128)
    b.op("FULLY_CONNECTED", [r, fw, fb], [f], keep_num_dims=True)
    y = b.tensor("y", (1, 256, 48), np.uint8, scale=0.1, zero_point=128)
    b.op(MISSING, [f], [y])
    z = b.tensor("z", (1, 256, 48), np.uint8, scale=0.1, zero_point=128)
    b.op("ADD", [y, y], [z])
    b.output(z)
    return b.build()


CASES = [("cpu", {}), ("cpu", {"backend": "numpy"}),
         ("sim", {"partition_mode": "compat"}),
         ("sim", {"partition_mode": "compat", "backend": "numpy"}),
         ("sim", {}), ("sim", {"backend": "numpy"})]


def test_the_case_is_what_it_claims():
    """The missing operator sits behind an Edge TPU segment in both modes, and in
    multi mode behind a rewrite that renumbers it."""
    model = _model()
    for mode in ("compat", "multi"):
        plan = partition(rewritten(model, mode, None)[0], mode)
        assert plan.segments and plan.ops[0].unit == "tpu"
    multi = rewritten(model, "multi", None)[0]
    assert [op.name for op in multi.main.operators].index(MISSING) != 3


@pytest.mark.parametrize("target,options", CASES,
                         ids=[f"{t}-{'-'.join(map(str, o.values())) or 'default'}"
                              for t, o in CASES])
def test_missing_custom_operator_is_named_by_its_index_in_the_users_model(target, options):
    data = _model().to_bytes()
    for attempt in ("compiled", "from the cache"):
        with pytest.raises(UnsupportedOperatorError) as e:
            InferenceSession(data, target=target, **options)
        assert e.value.op_name == MISSING
        assert e.value.where == "operator 3", (attempt, str(e.value))
        assert str(e.value).startswith(f"operator 3: operator '{MISSING}' is not provided")
        # The CPU backend's own words are kept, without its node number (it
        # counts the operators of the piece it was given).
        assert "Node number" not in str(e.value)
