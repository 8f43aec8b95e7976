"""``session.profile()`` counts the model's operators each Edge TPU step runs, not the one
compiled operator that carries them."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_model

from coralrt import InferenceSession, load_model


@pytest.mark.parametrize("name", ["mobilenet_v2_1.0_224_quant.tflite",
                                  "deeplabv3_mnv2_dm05_pascal_quant.tflite"])
def test_profile_counts_the_operators_a_segment_covers(name):
    path = shared_model(name)
    total = len(load_model(path).main.operators)
    with InferenceSession(path, target="sim") as sess:
        sess.run([np.zeros(sess.get_inputs()[0].shape, np.uint8)])
        rows = sess.profile()
        placement = sess.compile_info["placement"]
    assert sum(r["operators"] for r in rows) == total       # 66 / 72: every operator once
    tpu = [r["operators"] for r in rows if r["kind"] == "tpu"]
    assert tpu == [sum(1 for p in placement if p[0] == "tpu" and p[1] == k)
                   for k in range(len(tpu))]
    assert min(tpu) > 1
