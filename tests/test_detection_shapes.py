"""The SSD post-processing head: output shapes the file leaves out, and ``coralrt run``.

``TFLite_Detection_PostProcess`` outputs are declared without a shape; LiteRT
sets them when it prepares the operator.  coralrt infers the same shapes from
the operator's options (``coralrt._model.shapes``) for ``get_outputs()`` and
``coralrt inspect``; the yardstick is LiteRT itself after ``allocate_tensors``
and ``invoke``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_litert, shared_model, shared_model_names

from coralrt import InferenceSession
from coralrt._cli.main import main
from coralrt._cli.run_cmd import detections, make_inputs
from coralrt import load_model
from coralrt._model.shapes import DETECTION_POSTPROCESS, inferred_shapes
from coralrt._model.writer import write_model
from coralrt._tensors import TensorInfo, tensor_infos

SSD = "ssd_mobilenet_v1_coco_quant_postprocess_head_layers.tflite"
MOBILENET = "mobilenet_v1_0.25_128_quant.tflite"


def litert_output_shapes(path) -> list[tuple[int, ...]]:
    from conftest import litert_module
    Interpreter = litert_module().Interpreter
    interp = Interpreter(model_path=str(path))
    interp.allocate_tensors()
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    interp.invoke()
    return [tuple(int(n) for n in interp.get_tensor(d["index"]).shape)
            for d in interp.get_output_details()]


@pytest.mark.parametrize("target", ["cpu", "sim"])
def test_session_output_shapes_are_litert_s(target):
    path = shared_model(SSD)
    want = litert_output_shapes(path)
    assert want == [(1, 20, 4), (1, 20), (1, 20), (1,)]    # max_detections 20, 1 class each
    sess = InferenceSession(path, target=target)
    infos = sess.get_outputs()
    assert [i.shape for i in infos] == want
    assert [i.shape_signature for i in infos] == want
    out = sess.run(make_inputs(sess.get_inputs(), None, 0)[0])
    assert [a.shape for a in out.values()] == want


def test_every_shared_detector_gets_litert_s_output_shapes():
    from conftest import MODELS_DIR
    shared_model(SSD)                                   # skips when the folder is absent
    detectors = [p for p in sorted(MODELS_DIR.rglob("*.tflite"))
                 if p.parent.name not in ("invalid", "edgetpu")
                 and DETECTION_POSTPROCESS.encode() in p.read_bytes()]
    assert len(detectors) >= 2                          # the SSD head and the whole SSD
    for path in detectors:
        sess = InferenceSession(path, target="cpu")
        assert [i.shape for i in sess.get_outputs()] == litert_output_shapes(path), path


def test_inspect_json_output_shapes_are_litert_s(capsys):
    path = shared_model(SSD)
    assert main(["inspect", "--json", str(path)]) == 0
    outputs = json.loads(capsys.readouterr().out)["outputs"]
    assert [tuple(o["shape"]) for o in outputs] == litert_output_shapes(path)
    assert all("shape_signature" not in o for o in outputs)
    assert main(["inspect", str(path)]) == 0
    text = capsys.readouterr().out
    assert "1x20x4" in text and "scalar" not in text


def _postprocess_outputs(sg) -> set[int]:
    return {t for op in sg.operators if op.name == DETECTION_POSTPROCESS for t in op.outputs}


@pytest.mark.parametrize("name", shared_model_names())
def test_declared_shapes_are_kept(name):
    """Only undeclared outputs of SSD post-processing are inferred, nothing else anywhere."""
    model = load_model(shared_model(name))
    for sg in model.subgraphs:
        inferred = inferred_shapes(sg)
        assert set(inferred) <= _postprocess_outputs(sg)
        for i, shape in inferred.items():
            assert sg.tensors[i].shape == () and not sg.tensors[i].has_rank
        declared = [t for t in range(len(sg.tensors)) if t not in inferred]
        assert [x.shape for x in tensor_infos(sg, declared)] == \
            [sg.tensors[t].shape for t in declared]


def test_a_file_that_declares_the_shapes_keeps_its_own(tmp_path):
    model = load_model(shared_model(SSD))
    sg = model.main
    op = next(op for op in sg.operators if op.name == DETECTION_POSTPROCESS)
    for t, shape in zip(op.outputs, [(1, 20, 4), (1, 20), (1, 20), (1,)]):
        sg.tensors[t].shape = shape
    sg.tensors[op.outputs[3]].shape, sg.tensors[op.outputs[3]].has_rank = (), True  # a scalar
    path = tmp_path / "declared.tflite"
    path.write_bytes(write_model(model))
    again = load_model(path).main
    assert inferred_shapes(again) == {}
    shapes = [x.shape for x in tensor_infos(again, again.outputs)]
    assert shapes == [(1, 20, 4), (1, 20), (1, 20), ()]


# -- coralrt run ---------------------------------------------------------------------------

def expected_detections(path) -> list[dict]:
    """From LiteRT's outputs for the inputs ``coralrt run`` makes (seed 0)."""
    sess = InferenceSession(path)
    arrays, _ = make_inputs(sess.get_inputs(), None, 0)
    boxes, classes, scores, count = run_litert(path.read_bytes(), arrays)
    n = int(count[0])
    order = np.argsort(-scores[0, :n], kind="stable")
    return [{"class_id": int(classes[0, i]), "score": float(scores[0, i]),
             "box": [float(v) for v in boxes[0, i]]} for i in order]


def test_run_prints_the_detections(capsys):
    path = shared_model(SSD)
    assert main(["run", str(path), "--repeat", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    d = r["detections"]
    assert d["threshold"] == 0.0 and d["outputs"] == list(r["outputs"])
    want = expected_detections(path)
    assert [(x["class_id"], x["score"]) for x in d["items"]] == \
        [(x["class_id"], pytest.approx(x["score"])) for x in want]
    np.testing.assert_allclose([x["box"] for x in d["items"]], [x["box"] for x in want],
                               rtol=1e-6)
    assert len(d["items"]) == 20
    assert all("top5" not in s for s in r["outputs"].values())
    assert [s["shape"] for s in r["outputs"].values()] == [[1, 20, 4], [1, 20], [1, 20], [1]]

    assert main(["run", str(path), "--repeat", "1"]) == 0
    text = capsys.readouterr().out
    assert "detections (20, score >= 0; boxes ymin, xmin, ymax, xmax)" in text
    assert "top-5" not in text
    first = d["items"][0]
    row = next(line for line in text.splitlines() if line.strip().startswith("1 "))
    assert row.split()[1:3] == [str(first["class_id"]), f"{first['score']:.4f}"]

    assert main(["run", str(path), "--repeat", "1", "--threshold", "0.9"]) == 0
    text = capsys.readouterr().out
    assert "detections (0, score >= 0.9;" in text and "  none" in text


def test_detections_are_cut_at_count_sorted_and_thresholded():
    infos = [TensorInfo(n, (), np.dtype(np.float32)) for n in "bcsn"]
    boxes = np.arange(4 * 4, dtype=np.float32).reshape(1, 4, 4)
    classes = np.array([[3, 1, 2, 9]], np.float32)
    scores = np.array([[0.2, 0.9, 0.5, 0.99]], np.float32)
    count = np.array([3], np.float32)       # the fourth slot is padding
    got = detections([boxes, classes, scores, count], infos)
    assert [(x["class_id"], x["box"][0]) for x in got] == [(1, 4.0), (2, 8.0), (3, 0.0)]
    got = detections([boxes, classes, scores, count], infos, threshold=0.5)
    assert [x["class_id"] for x in got] == [1, 2]
    assert detections([boxes, classes, scores, np.array([99.0])], infos)[0]["class_id"] == 9
    assert detections([boxes, classes, scores, np.array([np.nan])], infos) == []


def test_run_on_sim_reports_the_estimated_device_time(capsys):
    path = shared_model(MOBILENET)
    assert main(["run", str(path), "--target", "sim", "--repeat", "1"]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("estimated Coral USB"))
    assert line.startswith("estimated Coral USB Accelerator latency (usb3, max clock): ")
    assert "ms per run for the Edge TPU steps (first run" in line
    assert main(["run", str(path), "--target", "sim", "--repeat", "1", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)["estimate_ms"]
    assert est["usb"] == "usb3" and 0 < est["edgetpu"] < est["first_run_edgetpu"]
    assert main(["run", str(path), "--repeat", "1"]) == 0
    assert "estimated" not in capsys.readouterr().out      # the CPU target: no estimate
