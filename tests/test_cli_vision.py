"""``coralrt run MODEL --image PATH``: classes, detections, segments, keypoints, drawing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import shared_image, shared_model
from coralrt._cli.main import main

Image = pytest.importorskip("PIL.Image", reason="Pillow decodes the test images (dev extra)")

V2 = "mobilenet_v2_1.0_224_quant.tflite"


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_run_image_prints_the_top_class(capsys):
    code, out, _ = run(capsys, "run", shared_model(V2), "--image", shared_image("cat.bmp"),
                       "--labels", shared_image("imagenet_labels.txt"))
    assert code == 0 and "task     classify" in out
    first = next(line for line in out.splitlines() if line.strip().startswith("1 "))
    assert "286" in first and "Egyptian cat" in first


def test_run_image_json_top_k_and_save(capsys, tmp_path):
    out_png = tmp_path / "cat.png"
    code, out, _ = run(capsys, "run", shared_model(V2), "--image", shared_image("cat.bmp"),
                       "--top-k", 3, "--json", "--save", out_png)
    r = json.loads(out)
    assert code == 0 and r["task"] == "classify" and len(r["classes"]) == 3
    assert r["classes"][0]["id"] == 286 and r["classes"][0]["label"] is None
    assert r["image"] == {"path": str(shared_image("cat.bmp")), "width": 512, "height": 341}
    saved = Image.open(out_png)
    assert saved.format == "PNG" and saved.size == (512, 341)
    original = np.asarray(Image.open(shared_image("cat.bmp")).convert("RGB"))
    assert (np.asarray(saved.convert("RGB")) != original).any()


def test_run_image_segmentation(capsys, tmp_path):
    code, out, _ = run(capsys, "run", shared_model("deeplabv3_mnv2_dm05_pascal_quant.tflite"),
                       "--image", shared_image("dog_segmentation.bmp"), "--labels",
                       shared_image("pascal_voc_segmentation_labels.txt"), "--json",
                       "--save", tmp_path / "dog.jpg")
    r = json.loads(out)
    assert code == 0 and r["task"] == "segment"
    dog = next(s for s in r["segments"] if s["label"] == "dog")
    assert 0.3 < dog["share"] < 0.8
    assert Image.open(tmp_path / "dog.jpg").format == "JPEG"


def test_image_and_input_exclude_each_other(capsys):
    code, _, err = run(capsys, "run", shared_model(V2), "--image", shared_image("cat.bmp"),
                       "--input", "random")
    assert code == 2 and "not allowed with argument" in err


def test_missing_image_is_a_clear_error(capsys, tmp_path):
    code, out, err = run(capsys, "run", shared_model(V2), "--image", tmp_path / "no.bmp")
    assert code == 1 and out == ""
    assert err.strip() == f"coralrt: error: image file {str(tmp_path / 'no.bmp')!r} does not " \
                          f"exist"


def test_task_that_does_not_fit_the_model(capsys):
    code, _, err = run(capsys, "run", shared_model(V2), "--image", shared_image("cat.bmp"),
                       "--task", "pose")
    assert code == 1 and "[1, 1, 17, 3]" in err


def test_without_pillow_one_line_names_the_extra(capsys, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "PIL", None)      # import PIL raises ImportError
    code, _, err = run(capsys, "run", shared_model(V2), "--image", shared_image("cat.bmp"))
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "pip install 'coralrt[image]'" in err


def test_run_without_image_keeps_its_detection_threshold(capsys):
    code, out, _ = run(capsys, "run",
                       shared_model("ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite"),
                       "--repeat", 1, "--json")
    assert code == 0 and json.loads(out)["detections"]["threshold"] == 0.0


def test_classes_scoring_zero_are_not_listed(capsys):
    """MobileNet v2 gives the sunflower 0.988 'daisy' and a quantized 0 to every other
    class: those are no answer and are left out of the top-5."""
    code, out, _ = run(capsys, "run", shared_model(V2), "--image",
                       shared_image("sunflower.bmp"), "--json")
    classes = json.loads(out)["classes"]
    assert code == 0 and classes and all(c["score"] > 0 for c in classes)
    assert classes[0]["id"] == 986 and len(classes) < 5
    from coralrt.vision import classes_from_scores
    scores = np.array([0.0, 0.5, 0.0, 0.25])
    assert [c.id for c in classes_from_scores(scores, top_k=4)] == [1, 3]
    assert [c.id for c in classes_from_scores(scores, top_k=4, threshold=-1)] == [1, 3, 0, 2]


def test_segmentation_picture_has_a_legend(tmp_path):
    """Each class drawn gets a swatch of its colour and its name, top left."""
    from coralrt import InferenceSession, vision
    labels = vision.read_labels(shared_image("pascal_voc_segmentation_labels.txt"))
    image = shared_image("dog_segmentation.bmp")
    seg = vision.segment(InferenceSession(shared_model(
        "deeplabv3_mnv2_dm05_pascal_quant.tflite")), image, labels=labels)
    drawn = np.asarray(vision.draw(image, seg).convert("RGB"))
    shown = [c for c in seg.classes if c != 0]
    assert "dog" in seg.labels and shown
    colours = vision.palette()
    corner = drawn[:16 * len(shown) + 8, :16]
    for cid in shown:          # the legend's swatches hold the exact class colours
        assert (corner == colours[cid]).all(axis=-1).sum() >= 20, cid
    assert (drawn[2, 2] == 0).all()                 # on the legend's black backing
    original = np.asarray(Image.open(image).convert("RGB"))
    assert (drawn[:, 80:] != original[:, 80:]).any()   # the mask itself is drawn too
