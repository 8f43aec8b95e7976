"""A whole-image detector end to end: SSD MobileNet v1 (COCO) on the kite picture.

The yardstick is LiteRT itself on the same input tensor: ``cpu`` must give
its default kernels' outputs, ``sim`` (the simulated Edge TPU, whose integer
arithmetic follows the reference kernels) the reference kernels' outputs, bit
for bit; the detections are then the decoding of those outputs (the YOLO detector:
tests/test_vision_yolo_real.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_litert, shared_image, shared_model

from coralrt import InferenceSession, vision
from coralrt._cli.main import main

Image = pytest.importorskip("PIL.Image", reason="Pillow decodes the test images (dev extra)")

SSD = "detect/coco_ssd_mobilenet_v1_1.0_quant_2018_06_29.tflite"
KITES = "kite_and_cold.jpg"
COCO_PERSON, COCO_KITE = 0, 37


@pytest.fixture(scope="module")
def kite_tensor():
    path = shared_model(SSD)
    sess = InferenceSession(path, target="cpu")
    tensor, placement, _ = vision.prepare(sess.get_inputs()[0], shared_image(KITES))
    return path, tensor, placement


@pytest.mark.parametrize("target, kernels", [("cpu", "optimized"), ("sim", "reference")])
def test_ssd_outputs_are_litert_s(kite_tensor, target, kernels):
    path, tensor, placement = kite_tensor
    want = run_litert(path.read_bytes(), [tensor], kernels)
    with InferenceSession(path, target=target) as sess:
        got = list(sess.run([tensor]).values())
        if target == "sim":
            assert [r["kind"] for r in sess.profile()] == ["tpu", "cpu"]
        assert [a.shape for a in got] == [a.shape for a in want] == \
            [(1, 10, 4), (1, 10), (1, 10), (1,)]
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
        dets = vision.detections_from_outputs(sess, dict(zip("bcsn", got)), placement, 0.5)
    n = int(want[3][0])
    keep = [i for i in np.argsort(-want[2][0, :n], kind="stable") if want[2][0, i] >= 0.5]
    assert [(d.id, d.score) for d in dets] == [(int(want[1][0, i]), float(want[2][0, i]))
                                               for i in keep]
    w, h = placement.image_size
    for d, i in zip(dets, keep):
        ymin, xmin, ymax, xmax = want[0][0, i]
        assert d.bbox.astuple() == pytest.approx(
            (max(xmin, 0) * w, max(ymin, 0) * h, min(xmax, 1) * w, min(ymax, 1) * h),
            abs=1e-3)


@pytest.mark.parametrize("target", ["cpu", "sim"])
def test_kites_and_people_are_found(target):
    labels = vision.read_labels(shared_image("coco_labels.txt"))
    with InferenceSession(shared_model(SSD), target=target) as sess:
        dets = vision.detect(sess, shared_image(KITES), threshold=0.5, labels=labels)
    kinds = {d.label for d in dets}
    assert kinds == {"person", "kite"}, dets
    assert sum(d.id == COCO_KITE for d in dets) >= 2 and sum(d.id == COCO_PERSON for d in dets) >= 3
    kites = [d.bbox for d in dets if d.id == COCO_KITE]
    assert all(b.ymax < 450 for b in kites)        # in the sky, above the horizon (y ~ 430)


def test_run_image_detect_save_draws_the_boxes(capsys, tmp_path):
    out_png = tmp_path / "kites.png"
    image = shared_image(KITES)
    assert main(["run", str(shared_model(SSD)), "--target", "sim", "--image", str(image),
                 "--labels", str(shared_image("coco_labels.txt")), "--task", "detect",
                 "--save", str(out_png), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["task"] == "detect" and r["saved"] == str(out_png)
    assert {d["label"] for d in r["detections"]} == {"person", "kite"}
    with Image.open(out_png) as drawn, Image.open(image) as original:
        assert drawn.size == original.size
        a = np.asarray(drawn.convert("RGB"), np.int16)
        b = np.asarray(original.convert("RGB"), np.int16)
    changed = (a != b).any(axis=-1)
    for d in r["detections"]:                       # each box's outline is drawn
        xmin, ymin, xmax, ymax = (int(round(v)) for v in d["box"])
        assert changed[ymin:ymax + 1, xmin].mean() > 0.8, d
    assert changed.mean() < 0.1                     # outlines, not filled boxes
    assert r["estimate_ms"]["edgetpu"] > 0          # sim: the estimated Edge TPU time
