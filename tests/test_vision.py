"""coralrt.vision on real images and models (../shared), and on small built models."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import extra_model_paths, litert, shared_image, shared_model
from tests.support.models import image_times_zero
from coralrt import InferenceSession, load_model
from coralrt.testing import ModelBuilder
from coralrt import vision
from coralrt.vision import BBox, Class, Detection, Keypoint, Placement, Segmentation
from coralrt.vision._detect import detections_from_outputs
from coralrt.vision._imaging import resize

Image = pytest.importorskip("PIL.Image", reason="Pillow decodes the test images (dev extra)")

V2 = "mobilenet_v2_1.0_224_quant.tflite"
SSD_HEAD = "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite"
DEEPLAB = "deeplabv3_mnv2_dm05_pascal_quant.tflite"


@pytest.fixture(scope="module")
def mobilenet():
    return InferenceSession(shared_model(V2), target="cpu")


@pytest.fixture(scope="module")
def imagenet():
    return vision.read_labels(shared_image("imagenet_labels.txt"))


# -- preprocessing --------------------------------------------------------------------------


def test_quantized_input_gets_the_pixel_bytes(mobilenet):
    info = mobilenet.get_inputs()[0]
    assert info.quantization == (0.0078125, 128)      # real = (p - 128) / 128
    pixels = np.asarray(Image.open(shared_image("cat.bmp")).convert("RGB"))
    tensor, placement, _ = vision.prepare(info, pixels, resample="nearest")
    assert tensor.shape == (1, 224, 224, 3) and tensor.dtype == np.uint8
    np.testing.assert_array_equal(tensor[0], resize(pixels, (224, 224), "nearest"))
    # pycoral's classify example with its mean = std = 128: the same bytes.
    same, _, _ = vision.prepare(info, pixels, resample="nearest", mean=128, std=128)
    np.testing.assert_array_equal(same, tensor)
    # Other mean/std: q = round((p - mean) / std / scale + zero_point), clipped.
    q, _, _ = vision.prepare(info, pixels, resample="nearest", mean=0, std=255)
    want = np.clip(np.floor(resize(pixels, (224, 224), "nearest") / 255 * 128 + 128.5), 0, 255)
    np.testing.assert_array_equal(q[0], want)
    assert placement.fit == "stretch" and placement.to_image(224, 224) == (512, 341)


def test_float_input_defaults_and_options():
    from coralrt._tensors import TensorInfo
    info = TensorInfo("x", (1, 2, 2, 3), np.dtype(np.float32))
    pixels = np.full((2, 2, 3), 255, np.uint8)
    assert vision.prepare(info, pixels)[0].max() == 255.0
    assert vision.prepare(info, pixels, mean=127.5, std=127.5)[0].max() == 1.0
    int8 = TensorInfo("x", (1, 2, 2, 3), np.dtype(np.int8), (0.5, -128),
                      np.array([0.5], np.float32), np.array([-128]))
    assert vision.prepare(int8, pixels)[0].max() == 127


def test_nearest_resize_without_pillow_matches_its_documented_formula():
    a = np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3)
    out = resize(a, (3, 2), "nearest")
    rows, cols = np.floor((np.arange(2) + 0.5) * 5 / 2), np.floor((np.arange(3) + 0.5) * 7 / 3)
    np.testing.assert_array_equal(out, a[rows.astype(int)][:, cols.astype(int)])


@pytest.mark.parametrize("fit", vision.FITS)
def test_placements_map_input_corners_back(fit):
    p = Placement.compute((600, 400), (300, 300), fit)
    if fit == "stretch":
        assert p.to_image(300, 300) == (600, 400)
    elif fit == "letterbox":      # scale 0.5: 300x200 centred, 50 px bars above and below
        assert (p.resized, p.paste) == ((300, 200), (0, 50))
        assert p.to_image(0, 50) == (0, 0) and p.to_image(300, 250) == (600, 400)
    else:                         # centre 400x400 square of the image
        assert p.box == (100, 0, 500, 400)
        assert p.to_image(0, 0) == (100, 0) and p.to_image(300, 300) == (500, 400)


def test_bad_images_are_clear_errors(tmp_path, mobilenet):
    from coralrt.errors import InputError
    with pytest.raises(InputError, match="does not exist"):
        vision.classify(mobilenet, tmp_path / "nope.png")
    (tmp_path / "bad.png").write_text("not an image")
    with pytest.raises(InputError, match="cannot read"):
        vision.classify(mobilenet, tmp_path / "bad.png")
    with pytest.raises(InputError, match="uint8 RGB"):
        vision.classify(mobilenet, np.zeros((4, 4, 4), np.uint8))
    with pytest.raises(InputError, match="unknown fit"):
        vision.classify(mobilenet, np.zeros((4, 4, 3), np.uint8), fit="zoom")


# -- classification -------------------------------------------------------------------------


@pytest.mark.parametrize("name, want, label", [
    ("cat", 286, "Egyptian cat"), ("grace_hopper", 653, "military uniform"),
    ("bird", 20, "chickadee")])
def test_classify_mobilenet(mobilenet, imagenet, name, want, label):
    path = shared_image(f"{name}.bmp")
    for image in (path, Image.open(path), np.asarray(Image.open(path).convert("RGB"))):
        top = vision.classify(mobilenet, image, labels=imagenet)
        assert isinstance(top[0], Class) and (top[0].id, top[0].label) == (want, label)
        assert 1 <= len(top) <= 5 and [c.score for c in top] == sorted(
            (c.score for c in top), reverse=True)
        assert all(c.score > 0 for c in top)        # a class scoring 0 is no answer


def test_classify_top_k_threshold_and_fits(mobilenet):
    cat = shared_image("cat.bmp")
    assert len(vision.classify(mobilenet, cat, top_k=2)) == 2
    assert [c.id for c in vision.classify(mobilenet, cat, top_k=None, threshold=0.05)] == \
        [c.id for c in vision.classify(mobilenet, cat, top_k=1000) if c.score >= 0.05]
    assert vision.classify(mobilenet, cat, threshold=1.01) == []
    for fit in vision.FITS:
        assert vision.classify(mobilenet, cat, top_k=1, fit=fit)[0].id == 286


def test_letterbox_pads_with_black_bytes(mobilenet):
    info = mobilenet.get_inputs()[0]
    tensor, p, _ = vision.prepare(info, shared_image("cat.bmp"), fit="letterbox")
    assert p.resized == (224, 149) and p.paste == (0, 37)
    assert not tensor[0, :37].any() and not tensor[0, 37 + 149:].any()
    assert tensor[0, 37:37 + 149].any()


def test_classify_on_the_simulated_stick(imagenet):
    sess = InferenceSession(shared_model(V2), target="sim")
    top = vision.classify(sess, shared_image("bird.bmp"), top_k=1, labels=imagenet)
    assert top[0].label == "chickadee" and top[0].score > 0.9


# -- detection: the SSD post-process head, fed constructed inputs ---------------------------


def _head_anchors():
    sg = load_model(shared_model(SSD_HEAD)).main
    op = next(o for o in sg.operators if o.name == "TFLite_Detection_PostProcess")
    t = sg.tensors[op.inputs[2]]
    scale, zero_point = t.quantization.params
    return scale * (t.data.astype(np.float64) - zero_point)      # (yc, xc, h, w)


def _head_feed(sess, picks, moves):
    """Box encodings at real 0 (each box = its anchor) except ``moves`` (layer-0 anchor ->
    quantized tx), class logits at q = 0 (score ~0) except ``picks`` (anchor, column, q)."""
    infos = sess.get_inputs()
    feed = {i.name: np.full(i.shape, i.quantization[1] if "BoxEncoding" in i.name else 0,
                            np.uint8) for i in infos}
    boxes0, classes0 = infos[0].name, infos[6].name        # layer 0: 19 x 19 cells, 3 anchors
    assert "BoxEncoding" in boxes0 and "ClassPredictor" in classes0
    for anchor, column, q in picks:
        cell, k = divmod(anchor, 3)
        feed[classes0][0, cell // 19, cell % 19, k * 91 + column] = q
    for anchor, q in moves.items():
        cell, k = divmod(anchor, 3)
        feed[boxes0][0, cell // 19, cell % 19, 4 * k + 1] = q         # tx
    return feed


def _litert_head(feed):
    interp = litert(shared_model(SSD_HEAD))
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], feed[d["name"]])
    interp.invoke()
    return [interp.get_tensor(d["index"])[0] for d in interp.get_output_details()]


def test_detect_decodes_the_ssd_head_in_image_pixels():
    sess = InferenceSession(shared_model(SSD_HEAD), target="cpu")
    coco = vision.read_labels(shared_image("coco_labels.txt"))
    anchors = _head_anchors()
    a, c = (5 * 19 + 5) * 3, (15 * 19 + 12) * 3     # anchor 0 of cells (5, 5) and (15, 12)
    b = a + 3                                       # anchor 0 of cell (5, 6), moved onto a:
    tx = (anchors[a, 1] - anchors[b, 1]) / anchors[b, 3] * 10.0        # x_scale 10
    box_info = sess.get_inputs()[0]
    q = int(round(tx / box_info.quantization[0] + box_info.quantization[1]))
    feed = _head_feed(sess, [(a, 18, 255), (b, 18, 250), (c, 1, 245)], {b: q})
    outputs = sess.run(feed)
    # The operator's own NMS (IoU 0.6) keeps a, drops b; c is far away.
    boxes, classes, scores, count = _litert_head(feed)
    assert int(count) == 2 and classes[:2].tolist() == [17, 0]
    stretch = Placement.compute((600, 400), (300, 300), "stretch")
    got = detections_from_outputs(sess, outputs, stretch, threshold=0.5, labels=coco)
    assert [(d.id, d.label) for d in got] == [(17, coco[17]), (0, "person")]
    assert all(isinstance(d, Detection) and isinstance(d.bbox, BBox) for d in got)
    np.testing.assert_allclose([d.score for d in got], scores[:2], atol=1e-6)
    for det, (ymin, xmin, ymax, xmax) in zip(got, boxes[:2]):
        np.testing.assert_allclose(det.bbox.astuple(), (xmin * 600, ymin * 400, xmax * 600,
                                                        ymax * 400), atol=1e-3)
    # Letterboxed 600x400 image: scale 0.5, 50-pixel bars; boxes still in image pixels.
    letter = Placement.compute((600, 400), (300, 300), "letterbox")
    got = detections_from_outputs(sess, outputs, letter, threshold=0.5)
    for det, anchor in zip(got, (a, c)):
        yc, xc, h, w = anchors[anchor]
        want = ((xc - w / 2) * 300 / 0.5, ((yc - h / 2) * 300 - 50) / 0.5,
                (xc + w / 2) * 300 / 0.5, ((yc + h / 2) * 300 - 50) / 0.5)
        np.testing.assert_allclose(det.bbox.astuple(), np.clip(want, 0, [600, 400] * 2),
                                   atol=0.05)      # clipped to the image
    assert detections_from_outputs(sess, outputs, letter, threshold=0.7) == got[:1]


# -- detection: plain boxes + scores, built with the model builder --------------------------


def const_outputs_model(outputs, size=(16, 12)):
    """A float model whose image input [1, h, w, 3] is ignored: each output is a constant
    (ADD of the constant and 0 * mean(image))."""
    b = ModelBuilder()
    z = image_times_zero(b, size)
    outs = []
    for name, value in outputs:
        value = np.asarray(value, np.float32)
        zr = b.tensor(f"z_{name}", (1,) * value.ndim, np.float32)
        b.op("RESHAPE", [z, b.constant(f"s_{name}", np.ones(value.ndim, np.int32))], [zr])
        o = b.tensor(name, value.shape, np.float32)
        b.op("ADD", [b.constant(f"c_{name}", value), zr], [o])
        outs.append(o)
    b.output(*outs)
    return b.build().to_bytes()


BOXES = [[0.10, 0.10, 0.50, 0.50],      # ymin, xmin, ymax, xmax (normalised)
         [0.12, 0.12, 0.52, 0.52],      # IoU ~0.82 with box 0
         [0.60, 0.60, 0.90, 0.95],      # far away
         [0.11, 0.10, 0.50, 0.50],      # overlaps box 0, but another class
         [0.00, 0.00, 1.00, 1.00]]      # background wins: dropped by the threshold
SCORES = [[0.05, 0.90, 0.10], [0.05, 0.80, 0.10], [0.10, 0.20, 0.70],
          [0.10, 0.10, 0.60], [0.99, 0.30, 0.30]]     # column 0: background


def test_detect_plain_boxes_and_scores_with_nms():
    model = const_outputs_model([("boxes", [BOXES]), ("scores", [SCORES])])
    sess = InferenceSession(model, target="cpu")
    assert vision.guess_task(sess) == "detect"
    image = np.zeros((120, 160, 3), np.uint8)      # input is 16 x 12: stretch x10
    got = vision.detect(sess, image, threshold=0.5, labels=["cat", "dog"], resample="nearest")
    assert [(d.id, d.label, round(d.score, 2)) for d in got] == [
        (0, "cat", 0.9), (1, "dog", 0.7), (1, "dog", 0.6)]
    np.testing.assert_allclose(got[0].bbox.astuple(), (16, 12, 80, 60), atol=1e-4)
    np.testing.assert_allclose(got[1].bbox.astuple(), (96, 72, 152, 108), atol=1e-4)
    # A looser IoU keeps the overlapping box; without background, column 0 is a class.
    assert len(vision.detect(sess, image, iou_threshold=0.9, resample="nearest")) == 4
    assert vision.detect(sess, image, background=False, resample="nearest")[0].id == 0
    assert vision.detect(sess, image, background=False, resample="nearest")[0].score == \
        pytest.approx(0.99)
    # Letterbox: a 320 x 120 image in the 16 x 12 input: scale 0.05, bars of 3 rows.
    got = vision.detect(sess, np.zeros((120, 320, 3), np.uint8), fit="letterbox",
                        resample="nearest")
    # ymin 0.1 -> input row 1.2, inside the top bar: clipped to the image's row 0.
    np.testing.assert_allclose(got[0].bbox.astuple(),
                               (0.1 * 16 / 0.05, 0.0, 0.5 * 16 / 0.05, (0.5 * 12 - 3) / 0.05),
                               atol=1e-3)


def test_nms_and_box_geometry():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]])
    assert vision.nms(boxes, [0.9, 0.8, 0.7]) == [0, 2]
    assert vision.nms(boxes, [0.7, 0.8, 0.9], iou_threshold=0.9) == [2, 1, 0]
    assert BBox(0, 0, 10, 10).iou(BBox(5, 0, 15, 10)) == pytest.approx(1 / 3)
    assert BBox(0, 0, 0, 0).iou(BBox(0, 0, 0, 0)) == 0.0


# -- segmentation ---------------------------------------------------------------------------


def test_segment_dog_like_litert():
    path = shared_model(DEEPLAB)
    sess = InferenceSession(path, target="cpu")
    voc = vision.read_labels(shared_image("pascal_voc_segmentation_labels.txt"))
    image = shared_image("dog_segmentation.bmp")
    seg = vision.segment(sess, image, labels=voc)
    assert isinstance(seg, Segmentation) and seg.mask.shape == (128, 128)
    dog = voc_id = next(i for i, name in voc.items() if name == "dog")
    assert voc_id in seg.classes and seg.labels[seg.classes.index(dog)] == "dog"
    # LiteRT on the same input bytes (bilinear stretch to 513 x 513, raw pixels), its
    # 513 x 513 class map taken back to 128 x 128 by pixel centres.
    pixels = np.asarray(Image.open(image).convert("RGB"))
    interp = litert(path)
    interp.set_tensor(interp.get_input_details()[0]["index"],
                      np.asarray(Image.fromarray(pixels).resize((513, 513),
                                                                Image.BILINEAR))[None])
    interp.invoke()
    classes = interp.get_tensor(interp.get_output_details()[0]["index"])[0]
    centres = np.floor((np.arange(128) + 0.5) * 513 / 128).astype(int)
    want = classes[centres[:, None], centres[None, :]]
    np.testing.assert_array_equal(seg.mask, want)
    share = seg.shares()[dog]
    assert share == pytest.approx((want == dog).mean()) and 0.3 < share < 0.8


def test_segment_score_volume_and_letterbox():
    scores = np.zeros((1, 4, 4, 3), np.float32)
    scores[0, :, :2, 1] = 1.0          # left half: class 1
    scores[0, :, 2:, 2] = 1.0          # right half: class 2
    p = Placement.compute((8, 4), (4, 4), "letterbox")        # rows 1..2 of the input
    seg = vision.segmentation_from_output(scores, p, labels=["bg", "a", "b"])
    assert seg.mask.shape == (4, 8) and seg.classes == (1, 2) and seg.labels == ("a", "b")
    assert (seg.mask[:, :4] == 1).all() and (seg.mask[:, 4:] == 2).all()


# -- pose -----------------------------------------------------------------------------------


def test_pose_keypoints_in_image_pixels():
    rows = np.zeros((1, 1, 17, 3), np.float32)
    rows[0, 0, :, 0] = np.linspace(0.1, 0.9, 17)      # y
    rows[0, 0, :, 1] = 0.25                           # x
    rows[0, 0, :, 2] = 0.8
    sess = InferenceSession(const_outputs_model([("keypoints", rows)]), target="cpu")
    assert vision.guess_task(sess) == "pose"
    kps = vision.pose(sess, np.zeros((60, 40, 3), np.uint8), resample="nearest")
    assert [k.name for k in kps] == list(vision.KEYPOINT_NAMES) and len(kps) == 17
    assert all(isinstance(k, Keypoint) for k in kps)
    assert (kps[0].x, kps[0].y, kps[0].score) == pytest.approx((10, 6, 0.8))
    assert kps[-1].y == pytest.approx(54)
    # Letterbox: 40 x 60 image in 16 x 12: scale 0.2, 8 x 12, bars of 4 columns.
    kps = vision.pose(sess, np.zeros((60, 40, 3), np.uint8), fit="letterbox",
                      resample="nearest")
    assert (kps[0].x, kps[0].y) == pytest.approx(((0.25 * 16 - 4) / 0.2, 0.1 * 12 / 0.2))


MOVENET = "movenet_single_pose_lightning_ptq.tflite"


def _movenet_params():
    """MoveNet from CORALRT_EXTRA_MODELS, or one skipped param saying why not."""
    params = extra_model_paths()
    if params[0].values[0] is None:          # the variable is unset: its own skip reason
        return params
    found = [p for p in params if p.values[0].name == MOVENET]
    return found[:1] or [pytest.param(None, marks=pytest.mark.skip(
        reason=f"{MOVENET} is not in the CORALRT_EXTRA_MODELS folders"))]


@pytest.mark.parametrize("path", _movenet_params())
def test_movenet_on_squat(path):
    sess = InferenceSession(path, target="cpu")
    kps = vision.pose(sess, shared_image("squat.bmp"))
    width, height = Image.open(shared_image("squat.bmp")).size
    good = [k for k in kps if k.score > 0.3]
    assert len(good) >= 10
    assert all(0 <= k.x <= width and 0 <= k.y <= height for k in good)
    by = {k.name: k for k in kps}
    assert by["nose"].y < by["left_hip"].y < by["left_ankle"].y + 1


# -- drawing --------------------------------------------------------------------------------


def test_draw_boxes_mask_and_keypoints(tmp_path, mobilenet):
    image = np.asarray(Image.open(shared_image("cat.bmp")).convert("RGB"))
    det = [Detection(0, 0.9, BBox(100, 50, 300, 250), "cat")]
    out = tmp_path / "boxes.png"
    vision.draw(image, det, out)
    drawn = np.asarray(Image.open(out).convert("RGB"))
    assert drawn.shape == image.shape
    assert (drawn[150, 100] != image[150, 100]).any()     # on the box's left edge
    np.testing.assert_array_equal(drawn[300:, 400:], image[300:, 400:])   # far from it
    mask = np.zeros(image.shape[:2], np.int64)
    mask[:100, :200] = 12
    vision.draw(image, Segmentation(mask, (0, 12), ("background", "dog")), tmp_path / "m.jpg")
    blended = np.asarray(vision.draw(image, Segmentation(mask, (0, 12), (None, None))))
    assert (blended[:100, :200] != image[:100, :200]).any(axis=2).mean() > 0.9
    np.testing.assert_array_equal(blended[100:], image[100:])
    kps = [Keypoint("left_hip", 50, 50, 0.9), Keypoint("left_knee", 50, 150, 0.9)]
    pose = np.asarray(vision.draw(image, kps))
    assert (pose[100, 50] != image[100, 50]).any()      # the skeleton line
    with pytest.raises(ValueError, match=".png"):
        vision.draw(image, det, tmp_path / "x.tiff")


def test_labels_files(tmp_path):
    imagenet = vision.read_labels(shared_image("imagenet_labels.txt"))
    assert imagenet[0] == "background" and imagenet[286] == "Egyptian cat"
    (tmp_path / "l.txt").write_text("0  person\n3  car\n")
    assert vision.read_labels(tmp_path / "l.txt") == {0: "person", 3: "car"}


def test_classes_from_a_submitted_result_match_classify():
    from coralrt import InferenceSession, vision

    session = InferenceSession(shared_model("mobilenet_v2_1.0_224_quant.tflite"))
    info = session.get_inputs()[0]
    tensor, _, _ = vision.prepare(info, shared_image("cat.bmp"))
    outputs = session.submit({info.name: tensor}).result()
    got = vision.classes_from_outputs(session, outputs, top_k=3)
    assert got == vision.classify(session, shared_image("cat.bmp"), top_k=3)
    assert got[0].id == 286
