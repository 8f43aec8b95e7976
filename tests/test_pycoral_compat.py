"""coralrt.pycoral: pycoral's utils, adapters and pipeline API, checked piece by piece.

Most checks drive the adapters through a small fake Interpreter (only the
``tflite_runtime`` API they use) or LiteRT's Interpreter; the real images
are in test_pycoral_images.py.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import math
import sys
import threading
import time

import numpy as np
import pytest

from conftest import litert, shared_image, shared_model
from coralrt.pycoral.adapters import classify, common, detect, segment
from coralrt.pycoral.adapters.classify import Class
from coralrt.pycoral.adapters.detect import BBox, Object
from coralrt.pycoral.pipeline import PipelinedModelRunner
from coralrt.pycoral.utils import dataset, edgetpu



class FakeInterpreter:
    """The slice of the tflite_runtime Interpreter API the adapters use."""

    def __init__(self, inputs, outputs, signatures=None):
        self.arrays = {}
        self.inputs, self.outputs = [], []
        for index, (name, arr, quant) in enumerate(inputs + outputs):
            arr = np.asarray(arr)
            self.arrays[index] = arr
            d = {"name": name, "index": index, "shape": np.array(arr.shape, np.int32),
                 "dtype": arr.dtype.type, "quantization": quant}
            (self.inputs if index < len(inputs) else self.outputs).append(d)
        self.signatures = signatures or {}
        self.invoked = 0

    def get_input_details(self):
        return self.inputs

    def get_output_details(self):
        return self.outputs

    def tensor(self, index):
        return lambda: self.arrays[index]

    def set_tensor(self, index, value):
        self.arrays[index][...] = value

    def get_tensor(self, index):
        return self.arrays[index].copy()

    def invoke(self):
        self.invoked += 1

    def _get_full_signature_list(self):
        return self.signatures


# -- utils.dataset ---------------------------------------------------------------------------


def test_read_label_file_with_ids(tmp_path):
    path = tmp_path / "labels.txt"
    path.write_text("0 background\n1: cat\n2:dog\n7   traffic light \n\n10\tfire hydrant\n",
                    encoding="utf-8")
    assert dataset.read_label_file(path) == {
        0: "background", 1: "cat", 2: "dog", 7: "traffic light", 4: "", 10: "fire hydrant"}
    assert dataset.read_label_file(str(path))[7] == "traffic light"


def test_read_label_file_plain_lines(tmp_path):
    path = tmp_path / "labels.txt"
    path.write_text("background\ntench, Tinca tinca\n7up bottle\ncafé\n", encoding="utf-8")
    assert dataset.read_label_file(path) == {
        0: "background", 1: "tench, Tinca tinca", 2: "7up bottle", 3: "café"}


def test_read_shared_label_files():
    imagenet = dataset.read_label_file(shared_image("imagenet_labels.txt"))
    assert len(imagenet) == 1001
    assert imagenet[0] == "background"
    assert imagenet[286] == "Egyptian cat"
    assert imagenet[20] == "chickadee"
    coco = dataset.read_label_file(shared_image("coco_labels.txt"))
    assert coco[0] == "person"
    assert coco[9] == "traffic light"     # a label with a space stays whole
    voc = dataset.read_label_file(shared_image("pascal_voc_segmentation_labels.txt"))
    assert voc[0] == "background" and voc[20] == "tvmonitor"
    assert voc[21] == ""              # the file's trailing note: lines like any other
    assert len(coco) == 90 and coco[11] == "n/a"


# -- adapters.detect.BBox ---------------------------------------------------------------------


def test_bbox_properties():
    box = BBox(1, 2, 11, 7)
    assert (box.width, box.height, box.area, box.valid) == (10, 5, 50, True)
    assert BBox(0, 0, 0, 0).valid
    assert not BBox(5, 0, 4, 1).valid
    assert not BBox(0, 5, 1, 4).valid
    assert box == (1, 2, 11, 7) and box.xmin == 1 and box._fields == ("xmin", "ymin", "xmax",
                                                                       "ymax")


def test_bbox_transforms():
    box = BBox(1.0, 2.0, 3.0, 4.0)
    assert box.scale(2, 10) == BBox(2.0, 20.0, 6.0, 40.0)
    assert isinstance(box.scale(2, 10), BBox)
    assert box.translate(1, -2) == BBox(2.0, 0.0, 4.0, 2.0)
    assert BBox(1.7, -0.5, 3.2, 9.9).map(int) == BBox(1, 0, 3, 9)
    assert isinstance(box.map(round), BBox)


def test_bbox_intersect_union_iou():
    a, b = BBox(0, 0, 10, 10), BBox(5, 5, 15, 20)
    assert BBox.intersect(a, b) == BBox(5, 5, 10, 10)
    assert BBox.union(a, b) == BBox(0, 0, 15, 20)
    assert BBox.iou(a, b) == pytest.approx(25 / (100 + 150 - 25))
    assert BBox.iou(a, a) == 1.0
    far = BBox(20, 20, 30, 30)
    assert not BBox.intersect(a, far).valid
    assert BBox.iou(a, far) == 0.0
    assert BBox.iou(a, BBox(10, 0, 20, 10)) == 0.0   # touching edges: valid, empty
    assert a.iou(a, b) == BBox.iou(b, a)


# -- adapters.classify ------------------------------------------------------------------------


def test_get_classes_from_scores_order_and_top_k():
    scores = np.array([0.1, 0.5, 0.2, 0.9, 0.0], np.float32)
    got = classify.get_classes_from_scores(scores)
    assert [c.id for c in got] == [3, 1, 2, 0, 4]
    assert all(isinstance(c, Class) for c in got)
    assert got[0] == Class(3, pytest.approx(0.9))
    assert [c.id for c in classify.get_classes_from_scores(scores, top_k=2)] == [3, 1]
    assert [c.id for c in classify.get_classes_from_scores(scores, top_k=math.inf)] == \
        [3, 1, 2, 0, 4]
    assert len(classify.get_classes_from_scores(scores, top_k=100)) == 5
    assert classify.get_classes_from_scores(scores, top_k=0) == []


def test_get_classes_from_scores_threshold():
    scores = np.array([0.1, 0.5, 0.2, 0.9, 0.0])
    # >= threshold, applied after the top-k cut.
    assert [c.id for c in classify.get_classes_from_scores(scores, score_threshold=0.2)] == \
        [3, 1, 2]
    assert [c.id for c in classify.get_classes_from_scores(scores, 2, 0.6)] == [3]
    assert classify.get_classes_from_scores(scores, score_threshold=1.0) == []
    ties = np.array([0.5, 0.7, 0.5, 0.7])
    assert [c.id for c in classify.get_classes_from_scores(ties)] == [1, 3, 0, 2]


def test_get_scores_dequantizes():
    q = np.array([[0, 128, 255]], np.uint8)
    interp = FakeInterpreter([("in", np.zeros((1, 2, 2, 3), np.uint8), (0.0, 0))],
                             [("out", q, (0.5, 128))])
    scores = classify.get_scores(interp)
    np.testing.assert_allclose(scores, [-64.0, 0.0, 63.5])
    assert classify.num_classes(interp) == 3
    got = classify.get_classes(interp, top_k=1)
    assert got == [Class(2, 63.5)]
    floats = FakeInterpreter([("in", np.zeros((1, 1, 1, 1), np.float32), (0.0, 0))],
                             [("out", np.array([[0.25, 0.75]], np.float32), (0.0, 0))])
    out = classify.get_scores(floats)
    assert out.dtype == np.float32 and list(out) == [0.25, 0.75]
    out[0] = 9                                   # a copy, not the interpreter's buffer
    assert floats.arrays[1][0, 0] == 0.25
    int8 = FakeInterpreter([("in", np.zeros((1, 1, 1, 1), np.int8), (0.0, 0))],
                           [("out", np.array([[-128, 127]], np.int8), (0.1, -128))])
    np.testing.assert_allclose(classify.get_scores(int8), [0.0, 25.5])


def test_get_scores_matches_litert_dequantization():
    interp = litert(shared_model("mobilenet_v1_0.25_128_quant.tflite"))
    common.set_input(interp, np.full((128, 128, 3), 100, np.uint8))
    interp.invoke()
    d = interp.get_output_details()[0]
    raw = interp.get_tensor(d["index"]).reshape(-1)
    scale, zp = d["quantization"]
    np.testing.assert_allclose(classify.get_scores(interp), scale * (raw.astype(float) - zp))
    assert classify.num_classes(interp) == 1001


# -- adapters.common / segment ----------------------------------------------------------------


def test_common_input_helpers():
    interp = FakeInterpreter([("img", np.zeros((1, 4, 6, 3), np.uint8), (1.0, 0))],
                             [("out", np.zeros((1, 2), np.float32), (0.0, 0))])
    assert common.input_size(interp) == (6, 4)
    assert common.input_details(interp, "index") == 0
    assert common.input_details(interp, "name") == "img"
    view = common.input_tensor(interp)
    assert view.shape == (4, 6, 3)
    view[0, 0] = 7
    assert interp.arrays[0][0, 0, 0, 0] == 7       # a view of the buffer
    common.set_input(interp, np.full((4, 6, 3), 3, np.uint8))
    assert (interp.arrays[0] == 3).all()
    np.testing.assert_array_equal(common.output_tensor(interp, 0), np.zeros((1, 2)))


def test_set_resized_input_letterboxes():
    interp = FakeInterpreter([("img", np.full((1, 4, 8, 3), 9, np.uint8), (1.0, 0))],
                             [("out", np.zeros((1, 2), np.float32), (0.0, 0))])
    asked = []

    def resize(size):
        asked.append(size)
        w, h = size
        return np.full((h, w, 3), 200, np.uint8)

    result, scale = common.set_resized_input(interp, (20, 20), resize)
    assert asked == [(4, 4)] and scale == (0.2, 0.2)
    assert result.shape == (4, 4, 3)
    t = interp.arrays[0][0]
    assert (t[:, :4] == 200).all() and (t[:, 4:] == 0).all()
    # Wide image: width-bound; each side truncated.
    _, scale = common.set_resized_input(interp, (30, 7), resize)
    assert asked[-1] == (8, 1) and scale == (8 / 30, 8 / 30)


def test_segment_get_output():
    classes = np.array([[[1, 2], [300, 4]]], np.int32)
    interp = FakeInterpreter([("img", np.zeros((1, 2, 2, 3), np.uint8), (0.0, 0))],
                             [("seg", classes, (0.0, 0))])
    out = segment.get_output(interp)
    assert out.dtype == np.uint8 and out.shape == (2, 2)
    assert out.tolist() == [[1, 2], [44, 4]]     # astype(uint8) wraps, as pycoral's does


# -- adapters.detect.get_objects --------------------------------------------------------------

BOXES = np.array([[[0.1, 0.2, 0.5, 0.6], [0.0, 0.0, 1.0, 1.0], [0.25, 0.5, 0.75, 0.9]]],
                 np.float32)
CLASSES = np.array([[3, 0, 17]], np.float32)
SCORES = np.array([[0.9, 0.3, 0.6]], np.float32)
COUNT = np.array([3], np.float32)
IMAGE = ("img", np.zeros((1, 300, 200, 3), np.uint8), (1.0, 0))   # width 200, height 300


def _expected(sx, sy, threshold=-math.inf):
    out = []
    for i in range(3):
        ymin, xmin, ymax, xmax = BOXES[0, i]
        if SCORES[0, i] >= threshold:
            out.append(Object(int(CLASSES[0, i]), float(SCORES[0, i]),
                              BBox(int(xmin * sx), int(ymin * sy), int(xmax * sx),
                                   int(ymax * sy))))
    return out


def test_get_objects_tf1_order():
    interp = FakeInterpreter([IMAGE], [("boxes", BOXES, None), ("classes", CLASSES, None),
                                       ("scores", SCORES, None), ("count", COUNT, None)])
    got = detect.get_objects(interp)
    assert got == _expected(200, 300)
    assert got[0] == Object(3, pytest.approx(0.9), BBox(40, 30, 120, 150))
    assert all(type(v) is int for o in got for v in o.bbox)
    assert type(got[0].id) is int and type(got[0].score) is float
    assert detect.get_objects(interp, score_threshold=0.6) == _expected(200, 300, 0.6)
    scaled = detect.get_objects(interp, image_scale=(0.5, 0.25))
    assert scaled == _expected(400, 1200)


def test_get_objects_tf2_order():
    interp = FakeInterpreter([IMAGE], [("scores", SCORES, None), ("boxes", BOXES, None),
                                       ("count", COUNT, None), ("classes", CLASSES, None)])
    assert detect.get_objects(interp, 0.5) == _expected(200, 300, 0.5)


def test_get_objects_signature_names():
    # Tensor order deliberately unlike either layout: the signature decides.
    interp = FakeInterpreter(
        [IMAGE], [("a", CLASSES, None), ("b", COUNT, None), ("c", BOXES, None),
                  ("d", SCORES, None)],
        signatures={"serving_default": {"inputs": {"images": 0}, "outputs": {
            "output_0": 2, "output_1": 4, "output_2": 1, "output_3": 3}}})
    assert detect.get_objects(interp) == _expected(200, 300)
    interp.signatures["other"] = interp.signatures["serving_default"]
    with pytest.raises(ValueError, match="one signature"):
        detect.get_objects(interp)


def test_get_objects_without_signature_method():
    interp = FakeInterpreter([IMAGE], [("boxes", BOXES, None), ("classes", CLASSES, None),
                                       ("scores", SCORES, None), ("count", COUNT, None)])
    interp._get_full_signature_list = None     # an Interpreter that lacks the method
    assert detect.get_objects(interp) == _expected(200, 300)


# -- utils.edgetpu ----------------------------------------------------------------------------


class _FakeTflite:
    def __init__(self):
        self.calls = []

    def load_delegate(self, library, options=None):
        self.calls.append(("load_delegate", library, options))
        return ("delegate", dict(options or {}))

    def Interpreter(self, **kwargs):      # noqa: N802 - the module's class name
        self.calls.append(("Interpreter", kwargs))
        return kwargs


@pytest.fixture
def fake_tflite(monkeypatch):
    fake = _FakeTflite()
    monkeypatch.setattr(edgetpu, "_tflite", lambda: fake)
    return fake


@pytest.mark.parametrize("device", [None, "usb", "usb:1", ":0", "pci", "pci:2"])
def test_make_interpreter_device_option(fake_tflite, device, tmp_path):
    got = edgetpu.make_interpreter(str(tmp_path / "m.tflite"), device=device)
    options = {"device": device} if device else {}
    assert fake_tflite.calls[0] == ("load_delegate", "libedgetpu.so.1", options)
    assert got == {"model_path": str(tmp_path / "m.tflite"),
                   "experimental_delegates": [("delegate", options)]}


def test_make_interpreter_content_path_and_delegate(fake_tflite, tmp_path):
    got = edgetpu.make_interpreter(b"TFL3model", device="usb:0")
    assert got["model_content"] == b"TFL3model" and "model_path" not in got
    got = edgetpu.make_interpreter(tmp_path / "m.tflite")        # a PathLike is a path
    assert got["model_path"] == str(tmp_path / "m.tflite")
    fake_tflite.calls.clear()
    mine = object()
    got = edgetpu.make_interpreter(b"x", device="usb:3", delegate=mine)
    assert got["experimental_delegates"] == [mine]
    assert [c[0] for c in fake_tflite.calls] == ["Interpreter"]   # device ignored
    assert edgetpu.load_edgetpu_delegate() == ("delegate", {})
    assert edgetpu.load_edgetpu_delegate({"device": "usb"}) == ("delegate", {"device": "usb"})


def test_list_edge_tpus_shapes(monkeypatch):
    import coralrt._usb
    from coralrt._usb import DeviceInfo
    infos = [DeviceInfo("usb:0", "running", 2, 5, "/sys/bus/usb/devices/2-1", "usb3"),
             DeviceInfo("usb:1", "bootloader", 3, 2, "", "usb2")]
    monkeypatch.setattr(coralrt._usb, "list_devices", lambda: infos)
    assert edgetpu.list_edge_tpus() == [{"type": "usb", "path": "/sys/bus/usb/devices/2-1"},
                                        {"type": "usb", "path": "usb:1"}]


def test_list_edge_tpus_never_raises(monkeypatch):
    import coralrt._usb
    from coralrt.errors import DeviceNotFoundError

    def broken():
        raise DeviceNotFoundError("no libusb backend is available")

    monkeypatch.setattr(coralrt._usb, "list_devices", broken)
    assert edgetpu.list_edge_tpus() == []
    monkeypatch.setitem(sys.modules, "coralrt._usb", None)      # the import itself fails
    assert edgetpu.list_edge_tpus() == []


def test_list_edge_tpus_real_call_is_a_list():
    got = edgetpu.list_edge_tpus()
    assert isinstance(got, list)
    assert all(set(d) == {"type", "path"} and d["type"] == "usb" for d in got)


def test_run_inference_inputs():
    interp = FakeInterpreter([("img", np.zeros((1, 2, 2, 3), np.uint8), (1.0, 0))],
                             [("out", np.zeros((1, 2), np.float32), (0.0, 0))])
    data = bytes(range(12))
    edgetpu.run_inference(interp, data)
    assert interp.invoked == 1 and interp.arrays[0].reshape(-1).tolist() == list(range(12))
    edgetpu.run_inference(interp, np.arange(100, 116, dtype=np.uint8))    # longer is fine
    assert interp.arrays[0].reshape(-1).tolist() == list(range(100, 112))
    buf = (ctypes.c_uint8 * 12)(*range(50, 62))
    edgetpu.run_inference(interp, (ctypes.c_void_p(ctypes.addressof(buf)), 12))
    assert interp.arrays[0].reshape(-1).tolist() == list(range(50, 62))
    edgetpu.run_inference(interp, bytearray(range(20, 32)))
    assert interp.arrays[0].reshape(-1).tolist() == list(range(20, 32))
    assert interp.invoked == 4
    with pytest.raises(ValueError, match="input size=11, expected=12"):
        edgetpu.run_inference(interp, bytes(11))
    with pytest.raises(ValueError, match="expected=12"):
        edgetpu.run_inference(interp, np.zeros(5, np.uint8))
    with pytest.raises(TypeError, match="not supported"):
        edgetpu.run_inference(interp, [1, 2, 3])
    assert interp.invoked == 4


def test_run_inference_on_litert_matches_set_tensor():
    path = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    x = np.random.default_rng(1).integers(0, 256, (1, 128, 128, 3), dtype=np.uint8)
    a, b = litert(path), litert(path)
    edgetpu.run_inference(a, x.tobytes())
    b.set_tensor(b.get_input_details()[0]["index"], x)
    b.invoke()
    np.testing.assert_array_equal(classify.get_scores(a), classify.get_scores(b))


def test_runtime_version():
    from coralrt._version import version
    text = edgetpu.get_runtime_version()
    assert isinstance(text, str) and "coralrt" in text and version() in text


def test_set_verbosity():
    logger = logging.getLogger("coralrt")
    level, handlers = logger.level, list(logger.handlers)
    try:
        assert edgetpu.set_verbosity(1) is True and logger.level == logging.INFO
        assert edgetpu.set_verbosity(10) is True and logger.level == logging.DEBUG
        assert edgetpu.set_verbosity(0) is True and logger.level == logging.WARNING
        assert logger.handlers == handlers             # level 0 takes its handler away
        for bad in (-1, 11, "3", 2.0, None):
            assert edgetpu.set_verbosity(bad) is False
        assert logger.level == logging.WARNING
    finally:
        edgetpu.set_verbosity(0)
        logger.setLevel(level)


# -- learn ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, cls", [
    ("coralrt.pycoral.learn.imprinting.engine", "ImprintingEngine"),
    ("coralrt.pycoral.learn.backprop.softmax_regression", "SoftmaxRegression")])
def test_learn_modules_have_pycorals_classes(name, cls):
    # What they do: tests/test_pycoral_learn*.py.
    assert getattr(importlib.import_module(name), cls).__module__ == name


def test_package_layout():
    import coralrt.pycoral
    import coralrt.pycoral.pipeline.pipelined_model_runner as runner_module
    assert coralrt.pycoral.__version__ == "2.0.0"
    assert PipelinedModelRunner is runner_module.PipelinedModelRunner


# -- pipeline.PipelinedModelRunner ------------------------------------------------------------


def cut(path, bounds):
    """The model at ``path`` cut into segments at the operator indices ``bounds``, as bytes."""
    from coralrt import load_model
    model = load_model(path)
    edges = [0, *bounds, len(model.main.operators)]
    return [model.extract(range(a, b)).to_bytes() for a, b in zip(edges, edges[1:])]


def run_pipeline(runner, requests):
    for r in requests:
        runner.push(r)
    runner.push({})
    results = []
    while (out := runner.pop()) is not None:
        results.append(out)
    return results


@pytest.mark.parametrize("bounds", [[15], [7, 20]])
def test_pipeline_equals_whole_model(bounds):
    path = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    whole = litert(path)
    runner = PipelinedModelRunner([litert(b) for b in cut(path, bounds)])
    assert len(runner.interpreters()) == len(bounds) + 1
    rng = np.random.default_rng(3)
    xs = [rng.integers(0, 256, (1, 128, 128, 3), dtype=np.uint8) for _ in range(6)]
    results = run_pipeline(runner, [{"input": x} for x in xs])
    name = whole.get_output_details()[0]["name"]
    assert len(results) == len(xs)
    for x, got in zip(xs, results):
        assert list(got) == [name]
        whole.set_tensor(whole.get_input_details()[0]["index"], x)
        whole.invoke()
        want = whole.get_tensor(whole.get_output_details()[0]["index"])
        assert got[name].dtype == want.dtype and got[name].shape == want.shape
        np.testing.assert_array_equal(got[name], want)
    assert runner.pop() is None


class FnInterpreter(FakeInterpreter):
    """A fake whose ``invoke`` computes its outputs with ``fn(inputs dict) -> outputs dict``."""

    def __init__(self, ins, outs, fn, shape=(1, 4)):
        super().__init__([(n, np.zeros(shape, np.int32), (0.0, 0)) for n in ins],
                         [(n, np.zeros(shape, np.int32), (0.0, 0)) for n in outs])
        self.fn = fn

    def invoke(self):
        super().invoke()
        got = self.fn({d["name"]: self.arrays[d["index"]] for d in self.inputs})
        for d in self.outputs:
            self.arrays[d["index"]][...] = got[d["name"]]


def three_segments(gate=None):
    def first(t):
        if gate is not None:
            gate.wait()
        return {"a": t["x"] + 1}
    return [FnInterpreter(["x"], ["a"], first),
            FnInterpreter(["a"], ["b"], lambda t: {"b": t["a"] * 2}),
            FnInterpreter(["x", "b"], ["out"], lambda t: {"out": t["b"] - t["x"]})]


def test_pipeline_carries_tensors_past_segments():
    runner = PipelinedModelRunner(three_segments())
    xs = [np.full((1, 4), i, np.int32) for i in range(10)]
    results = run_pipeline(runner, [{"x": x} for x in xs])
    assert [r["out"].tolist() for r in results] == [((x + 1) * 2 - x).tolist() for x in xs]
    assert [list(r) for r in results] == [["out"]] * 10


def test_pipeline_end_and_push_after_end():
    runner = PipelinedModelRunner(three_segments())
    runner.push({"x": np.ones((1, 4), np.int32)})
    runner.push({})
    assert runner.pop()["out"].tolist() == [[3, 3, 3, 3]]
    assert runner.pop() is None
    assert runner.pop() is None
    assert runner._segments.join(5)              # the segment threads have ended
    with pytest.raises(RuntimeError, match="turned off"):
        runner.push({"x": np.ones((1, 4), np.int32)})
    with pytest.raises(RuntimeError, match="turned off"):
        runner.push({})


def test_pipeline_push_checks():
    runner = PipelinedModelRunner(three_segments())
    with pytest.raises(ValueError, match="Expected input of length 1, but got 2"):
        runner.push({"x": np.ones((1, 4), np.int32), "y": np.ones((1, 4), np.int32)})
    with pytest.raises(ValueError, match="not an input"):
        runner.push({"y": np.ones((1, 4), np.int32)})
    with pytest.raises(ValueError, match="numpy array of type int32"):
        runner.push({"x": np.ones((1, 4), np.float32)})
    with pytest.raises(ValueError, match="numpy array"):
        runner.push({"x": [[1, 2, 3, 4]]})
    with pytest.raises(ValueError, match="5 elements, expected 4"):
        runner.push({"x": np.ones(5, np.int32)})
    x = np.arange(4, dtype=np.int32)            # flat is fine: same element count
    runner.push({"x": x})
    x[:] = 100                                   # pushed arrays are copied
    runner.push({})
    assert runner.pop()["out"].tolist() == [[2, 3, 4, 5]]


def test_pipeline_construction_checks():
    with pytest.raises(ValueError, match="At least one interpreter"):
        PipelinedModelRunner([])
    segs = three_segments()
    with pytest.raises(ValueError, match="Interpreter 1 can not get its input tensors"):
        PipelinedModelRunner([segs[0], segs[2]])
    unread = FnInterpreter(["x"], ["a", "spare"], lambda t: {"a": t["x"], "spare": t["x"]})
    with pytest.raises(ValueError, match=r"\['spare'\] of interpreter 0"):
        PipelinedModelRunner([unread, segs[1]])
    single = PipelinedModelRunner([segs[0]])
    assert run_pipeline(single, [{"x": np.zeros((1, 4), np.int32)}])[0]["a"].tolist() == \
        [[1, 1, 1, 1]]


def test_pipeline_segment_error_reaches_pop_and_push():
    def boom(t):
        if t["a"][0, 0] == 3:
            raise RuntimeError("kaboom")
        return {"b": t["a"]}
    segs = [FnInterpreter(["x"], ["a"], lambda t: {"a": t["x"] + 1}),
            FnInterpreter(["a"], ["b"], boom)]
    runner = PipelinedModelRunner(segs)
    runner.push({"x": np.zeros((1, 4), np.int32)})
    runner.push({"x": np.full((1, 4), 2, np.int32)})
    assert runner.pop()["b"].tolist() == [[1, 1, 1, 1]]
    with pytest.raises(RuntimeError, match="Segment 1 runner error: kaboom$"):
        runner.pop()
    with pytest.raises(RuntimeError, match="Segment 1 runner error"):
        runner.push({"x": np.zeros((1, 4), np.int32)})
    assert runner.pop() is None
    assert runner._segments.join(5)


def test_pipeline_error_does_not_block_earlier_segments():
    segs = [FnInterpreter(["x"], ["a"], lambda t: {"a": t["x"]}),
            FnInterpreter(["a"], ["b"], lambda t: 1 / 0)]
    runner = PipelinedModelRunner(segs)
    for i in range(8):                           # more than the queues between segments hold
        runner.push({"x": np.full((1, 4), i, np.int32)})
    with pytest.raises(RuntimeError, match="Segment 1 runner error: ZeroDivisionError"):
        runner.pop()
    assert runner.pop() is None
    assert runner._segments.join(5)


def test_pipeline_input_queue_size_blocks_push():
    gate = threading.Event()
    runner = PipelinedModelRunner(three_segments(gate))
    runner.set_input_queue_size(1)
    runner.set_output_queue_size(2)
    x = np.zeros((1, 4), np.int32)
    runner.push({"x": x})                        # taken by segment 0, which waits at the gate
    deadline = time.monotonic() + 5
    while len(runner._segments.queues[0]) and time.monotonic() < deadline:
        time.sleep(0.01)
    runner.push({"x": x + 1})                    # fills the input queue
    done = threading.Event()
    pusher = threading.Thread(target=lambda: (runner.push({"x": x + 2}), done.set()))
    pusher.start()
    assert not done.wait(0.3)                    # blocked: the queue is full
    gate.set()
    assert done.wait(5)
    pusher.join()
    results = run_pipeline(runner, [])
    assert [r["out"][0, 0] for r in results] == [2, 3, 4]
    with pytest.raises(ValueError):
        runner.set_input_queue_size(-1)


def test_pipeline_dropped_without_end_stops_threads():
    import gc
    before = threading.active_count()
    runner = PipelinedModelRunner(three_segments())
    assert threading.active_count() == before + 3
    runner.push({"x": np.zeros((1, 4), np.int32)})
    del runner
    gc.collect()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before
