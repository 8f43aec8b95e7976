"""The shared YOLOv8n person detector on the squat picture, decoded by coralrt.vision.

The yardstick is LiteRT's raw output for the picture resized (Pillow, bilinear) to the
model's 192 x 192 input: its best-scoring anchor (cx, cy, w, h normalised to the input,
and a score) is the person.  coralrt's decoding of the same picture must give one
box (suppression folds the anchors that agree) matching that anchor within 0.02 of the
image's size, on ``cpu`` and on the simulated Edge TPU, from the Python API, the
command line and pycoral's adapter.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_litert, shared_image, shared_model

from coralrt import InferenceSession, vision
from coralrt._cli.main import main
from coralrt.pycoral.adapters import common, detect
from coralrt.tflite import Interpreter

Image = pytest.importorskip("PIL.Image", reason="Pillow decodes the test images (dev extra)")

YOLO = "detect/yolov8n_192.tflite"
SQUAT = "squat.bmp"
TOL = 0.02


@pytest.fixture(scope="module")
def litert_person():
    """(cx, cy, w, h, score) of LiteRT's best anchor, and how many anchors score >= 0.5."""
    with Image.open(shared_image(SQUAT)) as im:
        picture = np.asarray(im.convert("RGB").resize((192, 192), Image.BILINEAR))
    (raw,) = run_litert(shared_model(YOLO).read_bytes(), [picture[None]])
    assert raw.shape == (1, 5, 756)
    anchors = raw[0].T.astype(np.float64)
    best = anchors[anchors[:, 4].argmax()]
    return best, int((anchors[:, 4] >= 0.5).sum())


def _normalised(det, size):
    w, h = size
    b = det.bbox
    return np.array([(b.xmin + b.xmax) / 2 / w, (b.ymin + b.ymax) / 2 / h,
                     b.width / w, b.height / h])


@pytest.mark.parametrize("target", ["cpu", "sim"])
def test_the_person_is_litert_s_best_anchor(litert_person, target):
    best, agreeing = litert_person
    assert agreeing > 1                          # several anchors see the person ...
    with Image.open(shared_image(SQUAT)) as im:
        size = im.size
    with InferenceSession(shared_model(YOLO), target=target) as sess:
        assert vision.guess_task(sess) == "detect"
        dets = vision.detect(sess, shared_image(SQUAT))
    assert len(dets) == 1                        # ... and suppression leaves one box
    assert dets[0].id == 0 and dets[0].score == pytest.approx(best[4], abs=TOL)
    np.testing.assert_allclose(_normalised(dets[0], size), best[:4], atol=TOL)


def test_cli_detects_and_draws_the_person(litert_person, capsys, tmp_path):
    best, _ = litert_person
    out_png = tmp_path / "squat.png"
    for task in ("auto", "detect"):
        assert main(["run", str(shared_model(YOLO)), "--target", "sim", "--image",
                     str(shared_image(SQUAT)), "--task", task, "--json",
                     "--save", str(out_png)]) == 0
        r = json.loads(capsys.readouterr().out)
        assert r["task"] == "detect" and len(r["detections"]) == 1
        w, h = r["image"]["width"], r["image"]["height"]
        x0, y0, x1, y1 = r["detections"][0]["box"]
        np.testing.assert_allclose([(x0 + x1) / 2 / w, (y0 + y1) / 2 / h, (x1 - x0) / w,
                                    (y1 - y0) / h], best[:4], atol=TOL)
    with Image.open(out_png) as drawn, Image.open(shared_image(SQUAT)) as original:
        a = np.asarray(drawn.convert("RGB"), np.int16)
        b = np.asarray(original.convert("RGB"), np.int16)
    changed = (a != b).any(axis=-1)
    xl, yt, xr, yb = (int(round(v)) for v in (x0, y0, x1, y1))
    for x in (xl, xr):                           # both sides drawn (within a pixel)
        assert changed[yt:yb + 1, x - 1:x + 2].any(axis=1).mean() > 0.8
    assert changed.mean() < 0.05                 # an outline, not a filled box


def test_pycoral_get_objects_reads_the_head(litert_person):
    best, _ = litert_person
    it = Interpreter(model_path=str(shared_model(YOLO)))
    it.allocate_tensors()
    with Image.open(shared_image(SQUAT)) as im:
        im = im.convert("RGB")
        _, scale = common.set_resized_input(it, im.size, lambda s: im.resize(s, Image.BILINEAR))
    it.invoke()
    objs = detect.get_objects(it, score_threshold=0.5, image_scale=scale)
    assert len(objs) == 1 and objs[0].id == 0 and objs[0].score > 0.5
    # set_resized_input pads at the bottom right: the box is in the image's pixels, its
    # size about LiteRT's (normalised to the stretched input) times the image's.
    box = objs[0].bbox
    assert abs(box.width / im.size[0] - best[2]) < 0.05
    assert abs(box.height / im.size[1] - best[3]) < 0.05
    assert isinstance(box.xmin, int)
