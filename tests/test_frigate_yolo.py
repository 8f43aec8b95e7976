"""A detector written the way Frigate's Edge TPU detector is, for ``model_type:
yologeneric``, runs unchanged on coralrt's simulated stick.

The program (below) imports tflite_runtime, loads libedgetpu's delegate by its soname
(``libedgetpu.so.1.0``) with an empty option dict, makes an Interpreter with it and
post-processes the one YOLO output itself in NumPy, as Frigate does: it dequantizes
the output, reads [1, 4 + C, N] or [1, N, 5 + C], keeps scores of at least 0.4, runs
its own suppression and returns 20 rows of [class id, score, y_min, x_min, y_max,
x_max] normalised to the input.  It runs in a plain ``python`` with
``CORALRT_COMPAT=1 CORALRT_TARGET=sim`` and coralrt's start-up hook (no stick is
attached here).  Its rows are checked against coralrt.vision's decoding of the same
frame on ``sim`` and against LiteRT's raw output for that frame.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import run_litert, shared_image, shared_model

from coralrt import InferenceSession, vision
from coralrt.vision import Placement
from tests.support.compat_hook import hook_pythonpath

Image = pytest.importorskip("PIL.Image", reason="Pillow decodes the test images (dev extra)")

YOLO = "detect/yolov8n_192.tflite"
SCORE, IOU = 0.4, 0.4          # the program's own thresholds

DETECTOR = """\
    import json
    import sys

    import numpy as np

    try:
        from tflite_runtime.interpreter import Interpreter, load_delegate
    except ModuleNotFoundError:
        from tensorflow.lite.python.interpreter import Interpreter, load_delegate


    def suppress(boxes, scores, iou_limit):
        order = list(np.argsort(-scores))
        keep = []
        while order:
            best = order.pop(0)
            keep.append(best)
            rest = []
            for other in order:
                y0 = max(boxes[best][0], boxes[other][0])
                x0 = max(boxes[best][1], boxes[other][1])
                y1 = min(boxes[best][2], boxes[other][2])
                x1 = min(boxes[best][3], boxes[other][3])
                inter = max(0.0, y1 - y0) * max(0.0, x1 - x0)
                area = lambda b: (b[2] - b[0]) * (b[3] - b[1])
                union = area(boxes[best]) + area(boxes[other]) - inter
                if union <= 0 or inter / union <= iou_limit:
                    rest.append(other)
            order = rest
        return keep


    class EdgeTpuTfl:
        def __init__(self, model_path, model_type, device_config):
            edge_tpu_delegate = load_delegate("libedgetpu.so.1.0", device_config)
            self.interpreter = Interpreter(model_path=model_path,
                                           experimental_delegates=[edge_tpu_delegate])
            self.interpreter.allocate_tensors()
            self.tensor_input_details = self.interpreter.get_input_details()
            self.tensor_output_details = self.interpreter.get_output_details()
            self.model_type = model_type
            self.height, self.width = (int(v) for v in self.tensor_input_details[0]["shape"][1:3])

        def detect_raw(self, tensor_input):
            self.interpreter.set_tensor(self.tensor_input_details[0]["index"], tensor_input)
            self.interpreter.invoke()
            if self.model_type != "yologeneric":
                raise ValueError(self.model_type)
            detail = self.tensor_output_details[0]
            raw = self.interpreter.get_tensor(detail["index"])
            scale, zero_point = detail["quantization"]
            out = raw.astype(np.float32)
            if scale:
                out = (out - zero_point) * scale
            out = out[0]
            if out.shape[0] < out.shape[1]:          # (4 + C, N): no objectness
                out = out.T
                class_scores = out[:, 4:]
            else:                                    # (N, 5 + C): objectness first
                class_scores = out[:, 5:] * out[:, 4:5]
            class_ids = class_scores.argmax(axis=1)
            scores = class_scores.max(axis=1)
            cx, cy, w, h = out[:, 0], out[:, 1], out[:, 2], out[:, 3]
            if max(cx.max(), cy.max()) > 1.5:         # input pixels: normalise
                cx, w = cx / self.width, w / self.width
                cy, h = cy / self.height, h / self.height
            boxes = np.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=1)
            detections = np.zeros((20, 6), np.float32)
            row = 0
            for c in np.unique(class_ids[scores >= SCORE]):
                picked = np.flatnonzero((scores >= SCORE) & (class_ids == c))
                for k in suppress(boxes[picked], scores[picked], IOU):
                    i = picked[k]
                    if row < 20:
                        detections[row] = [c, scores[i], *np.clip(boxes[i], 0, 1)]
                        row += 1
            order = np.argsort(-detections[:row, 1], kind="stable")
            detections[:row] = detections[:row][order]
            return detections


    SCORE, IOU = float(sys.argv[3]), float(sys.argv[4])
    detector = EdgeTpuTfl(sys.argv[1], "yologeneric", {})
    frame = np.load(sys.argv[2])
    rows = [detector.detect_raw(frame).tolist() for _ in range(2)]
    print(json.dumps({"interpreter": Interpreter.__module__, "rows": rows}))
"""


def _hook_env(tmp_path) -> dict:
    """A plain Python's environment with coralrt's start-up hook in a site folder (a
    ``sitecustomize`` adds it, so the ``.pth`` line runs as in site-packages) and
    ``CORALRT_COMPAT=1 CORALRT_TARGET=sim``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORALRT_")
           and k != "PYTHONPATH"}
    env.update(PYTHONPATH=hook_pythonpath(tmp_path), CORALRT_COMPAT="1", CORALRT_TARGET="sim",
               CORALRT_CACHE_DIR=str(tmp_path / "cache"))
    return env


@pytest.fixture(scope="module")
def frame():
    """squat.bmp resized (Pillow, bilinear) to the model's 192 x 192 input, as Frigate's
    own pipeline hands the detector a frame of the input's size."""
    with Image.open(shared_image("squat.bmp")) as im:
        return np.asarray(im.convert("RGB").resize((192, 192), Image.BILINEAR))[None]


def test_frigate_style_yologeneric_detector_on_sim(tmp_path, frame):
    model = shared_model(YOLO)
    script = tmp_path / "detector.py"
    script.write_text(textwrap.dedent(DETECTOR))
    np.save(tmp_path / "frame.npy", frame)
    proc = subprocess.run([sys.executable, str(script), str(model), "frame.npy", str(SCORE),
                           str(IOU)], cwd=tmp_path, env=_hook_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout)
    assert got["interpreter"].startswith("coralrt."), got["interpreter"]
    first, second = (np.array(r) for r in got["rows"])
    np.testing.assert_array_equal(first, second)          # a second frame: the same rows
    rows = first[first[:, 1] > 0]
    assert len(rows) == 1 and rows[0][0] == 0              # one person

    # coralrt.vision on the same frame on sim, boxes normalised to the input.
    with InferenceSession(model, target="sim") as sess:
        outputs = sess.run([frame])
        placement = Placement.compute((192, 192), (192, 192))
        dets = vision.detections_from_outputs(sess, outputs, placement, SCORE,
                                              iou_threshold=IOU)
    assert len(dets) == len(rows)
    for d, r in zip(dets, rows):
        b = d.bbox
        assert (d.id, d.score) == (int(r[0]), pytest.approx(r[1], abs=1e-5))
        np.testing.assert_allclose(r[2:], [b.ymin / 192, b.xmin / 192, b.ymax / 192,
                                           b.xmax / 192], atol=1e-5)

    # LiteRT's raw output for the frame: its best anchor is the row, within 0.02.
    (raw,) = run_litert(model.read_bytes(), [frame])
    anchors = raw[0].T.astype(np.float64)
    cx, cy, w, h, score = anchors[anchors[:, 4].argmax()]
    np.testing.assert_allclose(rows[0][1:], [score, cy - h / 2, cx - w / 2, cy + h / 2,
                                             cx + w / 2], atol=0.02)
