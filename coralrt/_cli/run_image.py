"""``coralrt run MODEL --image PATH``: one image through a vision model.

The task (``--task``, default ``auto``) is chosen from the model's outputs by
:func:`coralrt.vision.guess_task`: the SSD post-process outputs or boxes +
scores -> detect; a [1, 1, 17, 3] output -> pose; one [1, H, W(, C)] output ->
segment; one YOLO head output -> detect; one score vector -> classify.  The result is printed (or one JSON
object with ``--json``) and, with ``--save``, drawn on the image.  On
``--target sim`` the estimated Coral USB Accelerator time of the Edge TPU steps
follows the measured latency, as ``coralrt run`` without ``--image`` prints it.
"""

from __future__ import annotations

import logging
import time
import warnings

from coralrt._cli._report import device_estimate, estimate_lines
from coralrt._cli._text import dumps, json_num, table, whole_number
from coralrt.vision import (
    FITS, TASKS, as_rgb_array, classes_from_scores, detections_from_outputs, draw,
    guess_task, keypoints_from_output, prepare, read_labels, segmentation_from_output,
)
from coralrt.vision._classify import score_output
from coralrt.vision._imaging import DEFAULT_MAX_IMAGE_PIXELS
from coralrt.vision._pose import pose_output
from coralrt.vision._preprocess import image_input
from coralrt.vision._segment import segmentation_output

__all__ = ["add_arguments", "image_command"]

log = logging.getLogger("coralrt.cli")

DEFAULT_THRESHOLD = {"classify": 0.0, "detect": 0.5, "segment": 0.0, "pose": 0.0}


def add_arguments(p) -> None:
    """The image options of ``coralrt run`` (``--image`` itself is added next to ``--input``)."""
    p.add_argument("--labels", metavar="FILE",
                   help="with --image: label file (one label per line, or 'id label' lines)")
    p.add_argument("--task", choices=("auto",) + TASKS, default="auto",
                   help="with --image: what the model does (default: auto, told from its "
                        "outputs)")
    p.add_argument("--top-k", type=int, default=5, metavar="K",
                   help="with --image, classify: how many classes to print (default: 5)")
    p.add_argument("--fit", choices=FITS, default="stretch",
                   help="with --image: how the image fits the input (default: stretch)")
    p.add_argument("--max-image-pixels", type=whole_number(1), default=None, metavar="N",
                   help=f"with --image: decode the image only if its header declares at "
                        f"most N pixels (width x height; default: "
                        f"{DEFAULT_MAX_IMAGE_PIXELS}); raise it for a larger trusted image")
    p.add_argument("--save", metavar="OUT.png",
                   help="with --image: draw the result on the image and write it "
                        "(PNG or JPEG, by suffix)")


def _result(task: str, sess, outputs: dict, placement, labels, args, threshold: float):
    if task == "classify":
        return classes_from_scores(score_output(sess, outputs), args.top_k, threshold, labels)
    if task == "detect":
        return detections_from_outputs(sess, outputs, placement, threshold, labels)
    if task == "segment":
        return segmentation_from_output(segmentation_output(sess, outputs), placement, labels)
    return keypoints_from_output(pose_output(sess, outputs), placement)


def _items(task: str, result, threshold: float) -> dict:
    if task == "classify":
        return {"classes": [{"id": c.id, "score": json_num(c.score), "label": c.label}
                            for c in result]}
    if task == "detect":
        return {"detections": [
            {"id": d.id, "label": d.label, "score": json_num(d.score),
             "box": [json_num(round(v, 2)) for v in d.bbox.astuple()]} for d in result]}
    if task == "segment":
        shares = result.shares()
        return {"segments": [{"id": i, "label": label, "share": json_num(round(shares[i], 6))}
                             for i, label in zip(result.classes, result.labels)]}
    return {"keypoints": [{"name": k.name, "x": json_num(round(k.x, 2)),
                           "y": json_num(round(k.y, 2)), "score": json_num(k.score)}
                          for k in result if k.score >= threshold]}


def image_command(args, sess) -> int:
    """Run ``sess`` on ``args.image`` and print (or draw) the result."""
    with warnings.catch_warnings():
        # Pillow warns of a possible decompression bomb from its own size limit on,
        # a size coralrt refuses by default (InputError, one line) or was told to accept.
        warnings.simplefilter("ignore", getattr(_pil_image(), "DecompressionBombWarning",
                                                Warning))
        # A missing, unreadable or oversized file fails here, clearly, before decoding.
        pixels = as_rgb_array(args.image, max_pixels=args.max_image_pixels)
    labels = read_labels(args.labels) if args.labels else None
    task = guess_task(sess) if args.task == "auto" else args.task
    threshold = DEFAULT_THRESHOLD[task] if args.threshold is None else args.threshold
    info = image_input(sess)
    t0 = time.perf_counter()
    tensor, placement, _ = prepare(info, pixels, fit=args.fit)
    outputs = sess.run({info.name: tensor})
    ms = (time.perf_counter() - t0) * 1e3
    estimate = None
    if sess.target == "sim":
        # The first run uploads the parameters; a second one gives the steady estimate.
        first = sess.profile()
        sess.run({info.name: tensor})
        usb = getattr(sess.device, "usb_speed", None) or "usb3"
        estimate = device_estimate(sess.profile(), first, usb=usb)
    result = _result(task, sess, outputs, placement, labels, args, threshold)
    report = {"model": str(args.model), "target": sess.target,
              "image": {"path": str(args.image), "width": int(pixels.shape[1]),
                        "height": int(pixels.shape[0])},
              "task": task, "fit": args.fit, "threshold": threshold,
              **_items(task, result, threshold), "latency_ms": round(ms, 4)}
    if estimate is not None:
        report["estimate_ms"] = estimate
    if args.save:
        draw(pixels, [k for k in result if k.score >= threshold] if task == "pose" else result,
             args.save)
        report["saved"] = str(args.save)
    print(dumps(report) if args.json else format_report(report))
    return 0


def _pil_image():
    try:
        from PIL import Image
    except ImportError:
        return None         # as_rgb_array says what to install
    return Image


def format_report(r: dict) -> str:
    img = r["image"]
    lines = [f"model    {r['model']}", f"target   {r['target']}",
             f"image    {img['path']} ({img['width']}x{img['height']}, fit {r['fit']})",
             f"task     {r['task']}", ""]
    if "classes" in r:
        rows = [[k + 1, c["id"], f"{c['score']:.4f}", c["label"] or ""]
                for k, c in enumerate(r["classes"])]
        lines += [table(["rank", "id", "score", "label"], rows, right={0, 1, 2})]
    elif "detections" in r:
        rows = [[k + 1, d["label"] or d["id"], f"{d['score']:.4f}",
                 *(f"{v:.1f}" for v in d["box"])] for k, d in enumerate(r["detections"])]
        lines += [f"detections ({len(rows)}, score >= {r['threshold']:g}; boxes in image "
                  f"pixels)"]
        lines += [table(["#", "label", "score", "xmin", "ymin", "xmax", "ymax"], rows,
                        right={0, 2, 3, 4, 5, 6})] if rows else ["  none"]
    elif "segments" in r:
        rows = [[s["id"], s["label"] or "", f"{100 * s['share']:.2f}%"] for s in r["segments"]]
        lines += [table(["id", "label", "pixels"], rows, right={0, 2})]
    else:
        rows = [[k["name"], f"{k['x']:.1f}", f"{k['y']:.1f}", f"{k['score']:.3f}"]
                for k in r["keypoints"]]
        lines += [table(["keypoint", "x", "y", "score"], rows, right={1, 2, 3})]
    lines += ["", f"latency  {r['latency_ms']:.3f} ms (one run, preprocessing included)"]
    if "estimate_ms" in r:
        lines += estimate_lines(r["estimate_ms"])
    if "saved" in r:
        lines.append(f"saved    {r['saved']}")
    return "\n".join(lines)
