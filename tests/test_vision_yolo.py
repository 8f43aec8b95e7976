"""YOLO heads decoded by coralrt.vision, on models built in code with known boxes planted
in their output (every layout, float and quantized outputs).

Each model ignores its image: its only output is a constant head tensor (an ADD of
the constant and 0 * mean(image)), QUANTIZEd to int8 or uint8 for the quantized
cases.  Planted values are multiples of 1/128, so every dtype carries them exactly and
the expected detections are computed by hand from the planted numbers.
"""

from __future__ import annotations

import numpy as np
import pytest

from coralrt import InferenceSession, vision
from coralrt.errors import InputError
from coralrt.testing import ModelBuilder
from coralrt.vision import Placement
from coralrt.vision._results import box_iou
from coralrt.vision._yolo import grid_anchors
from tests.support.models import image_times_zero

W, H = 64, 48            # the models' input (width, height)
IMAGE = (128, 96)        # the test image: stretch is x2 on both axes

QUANT = {"float32": None, "int8": (1 / 128, -128), "uint8": (1 / 128, 0)}


def head_model(head, dtype: str = "float32", size=(W, H)) -> bytes:
    """A model with an image input [1, h, w, 3] whose only output is ``head``."""
    head = np.asarray(head, np.float32)
    b = ModelBuilder()
    z = image_times_zero(b, size)
    zr = b.tensor("zr", (1,) * head.ndim, np.float32)
    b.op("RESHAPE", [z, b.constant("ones", np.ones(head.ndim, np.int32))], [zr])
    f = b.tensor("head_f" if QUANT[dtype] else "head", head.shape, np.float32)
    b.op("ADD", [b.constant("planted", head), zr], [f])
    if QUANT[dtype]:
        scale, zero_point = QUANT[dtype]
        q = b.tensor("head", head.shape, np.dtype(dtype), scale=scale, zero_point=zero_point)
        b.op("QUANTIZE", [f], [q])
        f = q
    b.output(f)
    return b.build().to_bytes()


def _q(v):
    """``v`` rounded to a multiple of 1/128 (what every dtype here carries exactly)."""
    return np.round(np.asarray(v, np.float64) * 128) / 128


# Planted anchors: (anchor, class, score, cx, cy, w, h), normalised to the input.
PLANTED = [
    (3, 1, 0.90625, 0.25, 0.25, 0.25, 0.25),     # the best box
    (7, 1, 0.8125, 0.265625, 0.25, 0.25, 0.25),  # IoU 0.88 with anchor 3, same class: dropped
    (11, 2, 0.75, 0.25, 0.25, 0.25, 0.25),       # same box, another class: kept
    (20, 0, 0.625, 0.75, 0.6875, 0.25, 0.375),   # far away
    (25, 0, 0.375, 0.5, 0.5, 0.25, 0.25),        # under the threshold
]
N, C = 40, 3


def _anchors(rng, n=N):
    """(n, 4) background boxes (cx, cy, w, h) and (n, C) low class scores."""
    boxes = _q(rng.uniform(0.1, 0.9, (n, 4)) * [1, 1, 0.2, 0.2])
    scores = _q(rng.uniform(0, 0.1, (n, C)))
    return boxes, scores


def v8_head(pixels: bool = False):
    boxes, scores = _anchors(np.random.default_rng(8))
    for a, c, s, *box in PLANTED:
        boxes[a], scores[a, c] = box, s
    if pixels:
        boxes = boxes * [W, H, W, H]
    return np.concatenate([boxes, scores], axis=1).T[None]          # [1, 4 + C, N]


def v5_head(n=3 * grid_anchors((W, H))):
    """Three anchors per grid cell by default (the count auto-detection recognises)."""
    boxes, scores = _anchors(np.random.default_rng(5), n)
    obj = np.full((n, 1), 0.5)
    for a, c, s, *box in PLANTED:
        boxes[a], scores[a, c], obj[a] = box, 1.0, s      # score = objectness x 1.0
    # Objectness alone is not the score: a high objectness, a low class score.
    obj[30], scores[30], boxes[30] = 1.0, [0.25, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]
    return np.concatenate([boxes, obj, scores], axis=1)[None]      # [1, N, 5 + C]


def v10_head():
    rows = np.zeros((300, 6))
    for k, (_, c, s, cx, cy, w, h) in enumerate(PLANTED):
        rows[k] = [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, s, c]
    return rows[None]                                               # [1, 300, 6]


def expected(placement: Placement, suppressed=True):
    """(class, score, box in image pixels) of the planted anchors scoring >= 0.5, best
    first; anchor 7 drops out under suppression."""
    out = []
    for a, c, s, cx, cy, w, h in sorted(PLANTED, key=lambda p: -p[2]):
        if s < 0.5 or (suppressed and a == 7):
            continue
        x = np.array([cx - w / 2, cx + w / 2]) * W
        y = np.array([cy - h / 2, cy + h / 2]) * H
        (x0, x1), (y0, y1) = placement.to_image(x, y)
        iw, ih = placement.image_size
        out.append((c, s, tuple(np.clip([x0, y0, x1, y1], 0, [iw, ih, iw, ih]))))
    return out


def _check(dets, want):
    assert [(d.id, d.score) for d in dets] == [(c, s) for c, s, _ in want]
    for d, (_, _, box) in zip(dets, want):
        np.testing.assert_allclose(d.bbox.astuple(), box, atol=1e-4)


HEADS = {"yolov8": v8_head, "yolov5": v5_head, "yolov10": v10_head}


@pytest.mark.parametrize("dtype", list(QUANT))
@pytest.mark.parametrize("layout", list(HEADS))
def test_each_layout_float_and_quantized(layout, dtype):
    sess = InferenceSession(head_model(HEADS[layout](), dtype), target="cpu")
    assert sess.get_outputs()[0].dtype == np.dtype(dtype)
    assert vision.guess_task(sess) == "detect"
    image = np.zeros((IMAGE[1], IMAGE[0], 3), np.uint8)
    got = vision.detect(sess, image, resample="nearest")
    # v10 is NMS-free: its overlapping pair stays; v5 and v8 drop anchor 7.
    want = expected(Placement.compute(IMAGE, (W, H)), suppressed=layout != "yolov10")
    _check(got, want)
    assert [d.label for d in vision.detect(sess, image, labels=["a", "b", "c"],
                                           resample="nearest")] == \
        [["a", "b", "c"][c] for c, _, _ in want]
    # Forcing the layout the shape says changes nothing.
    _check(vision.detect(sess, image, layout=layout, resample="nearest"), want)


def test_letterbox_maps_boxes_back_to_the_image():
    sess = InferenceSession(head_model(v8_head()), target="cpu")
    image = np.zeros((48, 128, 3), np.uint8)      # 128 x 48 in 64 x 48: x0.5, bars of 12 rows
    placement = Placement.compute((128, 48), (W, H), "letterbox")
    assert placement.paste == (0, 12)
    got = vision.detect(sess, image, fit="letterbox", resample="nearest")
    _check(got, expected(placement))
    # The best box: input x 8..24 -> image 16..48; input y 6..18 -> (6 - 12) / 0.5 < 0
    # (in the bar: clipped to 0) .. (18 - 12) / 0.5 = 12.
    np.testing.assert_allclose(got[0].bbox.astuple(), (16, 0, 48, 12), atol=1e-4)


def test_pixel_coordinates_are_detected_or_forced():
    image = np.zeros((IMAGE[1], IMAGE[0], 3), np.uint8)
    want = expected(Placement.compute(IMAGE, (W, H)))
    pixels = InferenceSession(head_model(v8_head(pixels=True)), target="cpu")
    _check(vision.detect(pixels, image, resample="nearest"), want)
    _check(vision.detect(pixels, image, coordinates="pixels", resample="nearest"), want)
    normal = InferenceSession(head_model(v8_head()), target="cpu")
    _check(vision.detect(normal, image, coordinates="normalized", resample="nearest"), want)
    # Forced wrongly, normalised boxes read as pixels are 64 x 48 times smaller.
    tiny = vision.detect(normal, image, coordinates="pixels", resample="nearest")
    assert tiny[0].bbox.width == pytest.approx(want[0][2][2] / W - want[0][2][0] / W, abs=1e-4)
    with pytest.raises(InputError, match="unknown coordinates 'pixel'"):
        vision.detect(normal, image, coordinates="pixel")
    with pytest.raises(InputError, match="unknown YOLO layout 'v8'"):
        vision.detect(normal, image, layout="v8")


def test_thresholds_and_nms_parameters():
    sess = InferenceSession(head_model(v8_head()), target="cpu")
    image = np.zeros((IMAGE[1], IMAGE[0], 3), np.uint8)
    placement = Placement.compute(IMAGE, (W, H))
    # IoU of anchors 3 and 7 is 0.88: a looser threshold keeps both.
    both = vision.detect(sess, image, iou_threshold=0.9, resample="nearest")
    _check(both, expected(placement, suppressed=False))
    low = vision.detect(sess, image, threshold=0.3, resample="nearest")
    assert [d.score for d in low] == [0.90625, 0.75, 0.625, 0.375]
    assert vision.detect(sess, image, threshold=0.95, resample="nearest") == []


def test_decode_yolo_on_arrays():
    placement = Placement.compute(IMAGE, (W, H))
    want = expected(placement)
    _check(vision.decode_yolo(v8_head(), placement), want)
    _check(vision.decode_yolo(v5_head(), placement), want)
    _check(vision.decode_yolo(v5_head()[0], placement, layout="yolov5"), want)
    _check(vision.decode_yolo(v8_head()[0].T, placement, layout="yolov8"), want)
    with pytest.raises(InputError, match="not a YOLO head"):
        vision.decode_yolo(np.zeros((1, 4, 4)), placement)
    with pytest.raises(InputError, match="6 values per row"):
        vision.decode_yolo(np.zeros((1, 300, 7)), placement, layout="yolov10")


def test_layout_rules():
    assert grid_anchors((640, 640)) == 8400 and grid_anchors((192, 192)) == 756
    assert grid_anchors((320, 256)) == 40 * 32 + 20 * 16 + 10 * 8
    layout = vision.yolo_layout
    assert layout((1, 84, 8400), (640, 640)) == "yolov8"
    assert layout((1, 8400, 84), (640, 640)) == "yolov8"      # transposed v8: grid count
    assert layout((1, 25200, 85), (640, 640)) == "yolov5"
    assert layout((1, 300, 6), (640, 640)) == "yolov10"
    assert layout((1, 5, 756), (192, 192)) == "yolov8"
    assert layout((1, 84, 1000)) == "yolov8"
    assert layout((1, 1000, 85)) == "yolov5"
    assert layout((1, 1000, 85), strict=True) is None
    for shape in [(1, 10, 10), (1, 4, 100), (2, 84, 8400), (84, 8400), (1, 1, 84, 8400)]:
        assert layout(shape, (640, 640)) is None, shape


def test_a_head_of_unclear_layout_needs_the_task_named():
    # [1, N, 5 + C] with N no grid count of the input: v5 by default rule, but auto
    # detection does not guess; naming the task decodes it as v5.
    head = v5_head(N)
    assert head.shape == (1, N, 5 + C) and N not in (grid_anchors((W, H)),
                                                      3 * grid_anchors((W, H)))
    sess = InferenceSession(head_model(head), target="cpu")
    with pytest.raises(InputError, match="looks like a YOLO head.*name the task detect"):
        vision.guess_task(sess)
    got = vision.detect(sess, np.zeros((IMAGE[1], IMAGE[0], 3), np.uint8), resample="nearest")
    _check(got, expected(Placement.compute(IMAGE, (W, H))))


def test_nms_matches_the_greedy_definition():
    rng = np.random.default_rng(1)
    for _ in range(20):
        xy = rng.uniform(0, 50, (60, 2))
        boxes = np.concatenate([xy, xy + rng.uniform(0, 30, (60, 2))], axis=1)
        scores = rng.choice([0.5, 0.6, 0.7, 0.8], 60)         # ties: earlier first
        for thr in (0.0, 0.3, 0.5, 0.9):
            keep: list[int] = []
            for i in np.argsort(-scores, kind="stable"):
                if all(box_iou(boxes[i], boxes[j]) <= thr for j in keep):
                    keep.append(int(i))
            assert vision.nms(boxes, scores, thr) == keep


def test_other_outputs_are_not_taken_for_a_head():
    image = np.zeros((IMAGE[1], IMAGE[0], 3), np.uint8)
    scores = InferenceSession(head_model(np.full((1, 10), 0.5)), target="cpu")
    assert vision.guess_task(scores) == "classify"
    with pytest.raises(InputError, match=r"not a detection model .*outputs \[\[1, 10\]\]"):
        vision.detect(scores, image)
    # Forcing a layout on an output that is no head is refused too, saying why.
    with pytest.raises(InputError, match=r"a YOLO head is one .* got shape \[1, 10\]"):
        vision.detect(scores, image, layout="yolov8")
