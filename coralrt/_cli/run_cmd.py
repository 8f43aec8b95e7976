"""``coralrt run MODEL``: run a model on a target, print its outputs and latency.

Classifier outputs get a top-5.  A model whose outputs are the four of the SSD
post-processing head (``TFLite_Detection_PostProcess``: boxes, classes, scores,
count) gets its detections instead: the first ``count`` of them, sorted by
score, those below ``--threshold`` left out.  The default threshold is 0.0
(keep all): the operator has already dropped the boxes under its own
``nms_score_threshold``.  On ``--target sim`` the estimated Coral USB
Accelerator time of the Edge TPU steps is reported as ``coralrt bench`` does.
"""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np

from coralrt._cli import run_image
from coralrt._cli._report import device_estimate, estimate_lines
from coralrt._cli._text import dumps, json_num, num, plural, shape_str, table, whole_number
from coralrt.errors import InputError
from coralrt.vision._detect import postprocess_operator_outputs
from coralrt import _targets as targets
from coralrt._session import InferenceSession
from coralrt._tensors import TensorInfo

__all__ = ["add_parser", "command", "count_type", "make_inputs", "random_input", "output_summary",
           "timed_runs", "detection_outputs", "detections"]

log = logging.getLogger("coralrt.cli")

RANDOM = "random"


#: argparse ``type`` of a count option: ``count_type(1)`` takes 1 or more.
count_type = whole_number


def add_parser(sub, parents) -> None:
    p = sub.add_parser(
        "run", parents=parents, help="run a model and time it",
        description="Run a model on a target with given or random inputs; print each "
                    "output's statistics (the top-5 classes of classifier outputs, the "
                    "detections of an SSD post-processing head) and the latency; on "
                    "--target sim also the estimated Edge TPU time.  With --image, run "
                    "one image through a vision model and print its result.")
    p.add_argument("model", metavar="MODEL", help="path of the .tflite file")
    p.add_argument("--target", choices=targets.names(), default="cpu",
                   help="where to run (default: cpu)")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--input", action="append", metavar="FILE.npy|random", dest="inputs",
                        help="a .npy file per model input, in input order, or 'random' "
                             "(default: random data for every input)")
    source.add_argument("--image", metavar="PATH",
                        help="an image (BMP, PNG, JPEG...) for a vision model: prints its "
                             "classes, detections, segments or keypoints (needs Pillow: "
                             "pip install 'coralrt[image]')")
    run_image.add_arguments(p)
    p.add_argument("--repeat", type=count_type(1), default=10, metavar="N",
                   help="timed runs (default: 10)")
    p.add_argument("--warmup", type=count_type(0), default=1, metavar="N",
                   help="untimed runs first (default: 1)")
    p.add_argument("--threads", type=count_type(1), default=None, metavar="N",
                   help="CPU backend threads (default: the backend's choice)")
    p.add_argument("--backend", default=None, metavar="NAME",
                   help="CPU backend: litert or tflite_runtime (default: first installed)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the random inputs (default: 0)")
    p.add_argument("--threshold", type=float, default=None, metavar="SCORE",
                   help="detection models: leave out detections scoring below SCORE "
                        "(default: 0.0, keep every detection the model returns; with "
                        "--image: 0.5 for detection, 0.0 otherwise)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=command)


def random_input(info: TensorInfo, rng: np.random.Generator) -> np.ndarray:
    """Random data of the input's dtype and shape: the whole range of integer
    types, standard normal for floats."""
    dt, shape = info.dtype, info.shape
    if dt == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dt.kind in "iu":
        ii = np.iinfo(dt)
        return rng.integers(ii.min, ii.max, size=shape, dtype=dt, endpoint=True)
    if dt.kind in "fc":
        return rng.standard_normal(shape).astype(dt)
    raise InputError(f"input {info.name!r} has dtype {dt.name}, for which coralrt cannot "
                     f"make random data; pass a .npy file with --input")


def _load_npy(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        magic = f.read(6)
        # numpy.load guesses "pickled data" for anything without the NPY
        # magic, which misleads for a wrong file: say what it is not.
        if magic != b"\x93NUMPY":
            raise InputError(f"{path} is not a .npy file (no NPY header); save each input "
                             f"with numpy.save")
        f.seek(0)
        try:
            return np.load(f, allow_pickle=False)
        except ValueError as e:  # an object array, or a damaged header
            raise InputError(f"cannot read {path} as a .npy array: {e}") from e


def make_inputs(infos: list[TensorInfo], specs: list[str] | None,
                seed: int) -> tuple[list[np.ndarray], list[str]]:
    """Arrays for ``--input`` values, and where each came from."""
    if not specs or specs == [RANDOM]:
        specs = [RANDOM] * len(infos)
    if len(specs) != len(infos):
        names = [i.name for i in infos]
        raise InputError(f"the model has {len(infos)} input(s) {names} but --input was "
                         f"given {len(specs)} time(s); give it once per input, in order, or "
                         f"use --input random")
    rng = np.random.default_rng(seed)
    arrays = [random_input(info, rng) if spec == RANDOM else _load_npy(spec)
              for info, spec in zip(infos, specs)]
    sources = [f"random (seed {seed})" if spec == RANDOM else spec for spec in specs]
    return arrays, sources


def timed_runs(sess: InferenceSession, feed, repeat: int,
               warmup: int) -> tuple[dict, list[float]]:
    """Run ``warmup`` untimed then ``repeat`` timed times; the last outputs and
    the latencies in milliseconds."""
    outputs = None
    for _ in range(warmup):
        outputs = sess.run(feed)
    times = []
    clock = time.perf_counter
    for _ in range(repeat):
        t0 = clock()
        outputs = sess.run(feed)
        times.append((clock() - t0) * 1e3)
    return outputs, times


def _is_classifier(a: np.ndarray) -> bool:
    # A vector of scores, possibly with leading batch dimensions of 1.
    return a.ndim >= 1 and a.size > 1 and a.shape[-1] > 1 and a.size == a.shape[-1]


def output_summary(info: TensorInfo, a: np.ndarray) -> dict:
    """``{shape, dtype, min, max, mean[, top5]}`` of one output (JSON-ready)."""
    d: dict = {"shape": list(a.shape), "dtype": a.dtype.name}
    if a.size and a.dtype.kind in "biuf":
        cast = int if a.dtype.kind in "biu" else float
        d.update(min=json_num(cast(a.min())), max=json_num(cast(a.max())),
                 mean=json_num(float(a.astype(np.float64).mean())))
    else:
        d.update(min=None, max=None, mean=None)
    if _is_classifier(a) and a.dtype.kind in "biuf":
        flat = a.reshape(-1)
        # Stable sort on the negated float64 values: ties keep the lower index.
        order = np.argsort(-flat.astype(np.float64), kind="stable")[:5]
        real = info.dequantize(flat[order]) if info.is_quantized else None
        top = []
        for k, i in enumerate(order):
            v = flat[i]
            entry = {"index": int(i), "value": json_num(v.item())}
            if real is not None:
                entry["dequantized"] = json_num(float(real[k]))
            top.append(entry)
        d["top5"] = top
    return d


# The four outputs of a TFLite_Detection_PostProcess operator, when the model's outputs
# include them (coralrt.vision finds them; --image also takes pycoral's shape rule).
detection_outputs = postprocess_operator_outputs


def detections(arrays: list[np.ndarray], infos: list[TensorInfo],
               threshold: float = 0.0) -> list[dict]:
    """The detections in the (boxes, classes, scores, count) outputs of batch item 0:
    the first ``count``, best score first, none below ``threshold`` (JSON-ready)."""
    boxes, classes, scores, count = (info.dequantize(a) if info.is_quantized else
                                     np.asarray(a, np.float64)
                                     for a, info in zip(arrays, infos))
    scores = scores.reshape(-1)
    n = int(count.reshape(-1)[0]) if count.size and np.isfinite(count.reshape(-1)[0]) else 0
    n = max(0, min(n, scores.size, classes.size, boxes.size // 4))
    boxes, classes, scores = boxes.reshape(-1, 4)[:n], classes.reshape(-1)[:n], scores[:n]
    out = []
    for i in np.argsort(-scores, kind="stable"):
        if not scores[i] >= threshold:
            continue
        out.append({"class_id": int(classes[i]), "score": json_num(float(scores[i])),
                    "box": [json_num(float(v)) for v in boxes[i]]})  # ymin, xmin, ymax, xmax
    return out


def latency_summary(times: list[float]) -> dict:
    """Milliseconds, rounded to 0.1 us: finer digits are timer noise."""
    return {"min": round(min(times), 4), "median": round(statistics.median(times), 4),
            "mean": round(statistics.fmean(times), 4), "runs": len(times)}


def command(args) -> int:
    from coralrt._cli._progress import Progress  # a bar while a cold load compiles
    sess = InferenceSession(args.model, target=args.target, num_threads=args.threads,
                            backend=args.backend, plugins=Progress.for_args(args).plugins())
    if getattr(args, "image", None) is not None:
        return run_image.image_command(args, sess)
    threshold = 0.0 if args.threshold is None else args.threshold
    infos = sess.get_inputs()
    arrays, sources = make_inputs(infos, args.inputs, args.seed)
    log.info("running %s on %s (%s): %d warmup, %d timed runs", args.model, sess.target,
             sess.backend, args.warmup, args.repeat)
    first, warmup = None, args.warmup
    if sess.target == "sim" and warmup:
        sess.run(arrays)        # the first run uploads the parameters: its estimate differs
        first, warmup = sess.profile(), warmup - 1
    outputs, times = timed_runs(sess, arrays, args.repeat, warmup)
    out_infos = dict(zip(outputs, sess.get_outputs()))
    summaries = {name: output_summary(out_infos[name], a) for name, a in outputs.items()}
    result = {
        "model": str(args.model), "target": sess.target, "backend": sess.backend,
        "threads": args.threads,
        "inputs": [{"name": i.name, "source": s} for i, s in zip(infos, sources)],
        "outputs": summaries, "latency_ms": latency_summary(times),
    }
    heads = detection_outputs(sess)
    if heads is not None:
        names = list(outputs)
        for k in heads:
            summaries[names[k]].pop("top5", None)   # class ids and scores are no classifier
        result["detections"] = {
            "outputs": [names[k] for k in heads], "threshold": threshold,
            "items": detections([outputs[names[k]] for k in heads],
                                [sess.get_outputs()[k] for k in heads], threshold)}
    if sess.target == "sim":
        usb = getattr(sess.device, "usb_speed", None) or "usb3"
        result["estimate_ms"] = device_estimate(sess.profile(), first, usb=usb)
    if args.json:
        print(dumps(result))
    else:
        print(format_result(result, warmup=args.warmup))
    return 0


def format_result(r: dict, *, warmup: int) -> str:
    threads = "backend default" if r["threads"] is None else r["threads"]
    lines = [f"model    {r['model']}",
             f"target   {r['target']} (CPU backend {r['backend']}, threads: {threads})", "",
             "inputs",
             table(["name", "source"], [[i["name"], i["source"]] for i in r["inputs"]]), "",
             "outputs"]
    rows = [[name, shape_str(s["shape"]), s["dtype"], *(num(s[k]) if s[k] is not None else "-"
                                                      for k in ("min", "max", "mean"))]
            for name, s in r["outputs"].items()]
    lines.append(table(["name", "shape", "dtype", "min", "max", "mean"], rows,
                       right={3, 4, 5}))
    for name, s in r["outputs"].items():
        if "top5" not in s:
            continue
        has_real = any("dequantized" in t for t in s["top5"])
        rows = [[k + 1, t["index"], num(t["value"]) if t["value"] is not None else "nan",
                 *([num(t["dequantized"])] if has_real else [])]
                for k, t in enumerate(s["top5"])]
        headers = ["rank", "index", "value"] + (["dequantized"] if has_real else [])
        lines += ["", f"top-5 of {name}", table(headers, rows, right={0, 1, 2, 3})]
    if "detections" in r:
        lines += ["", *_detection_lines(r["detections"])]
    lat = r["latency_ms"]
    lines += ["", f"latency  min {lat['min']:.3f} ms  median {lat['median']:.3f} ms  "
                  f"({plural(lat['runs'], 'run')} after {plural(warmup, 'warmup')})"]
    if "estimate_ms" in r:
        lines += estimate_lines(r["estimate_ms"])
    return "\n".join(lines)


def _detection_lines(d: dict) -> list[str]:
    items = d["items"]
    head = (f"detections ({len(items)}, score >= {d['threshold']:g}; boxes ymin, xmin, ymax, "
            f"xmax)")
    if not items:
        return [head, "  none"]
    rows = [[k + 1, t["class_id"], "nan" if t["score"] is None else f"{t['score']:.4f}",
             *("nan" if v is None else f"{v:.4f}" for v in t["box"])]
            for k, t in enumerate(items)]
    return [head, table(["#", "class", "score", "ymin", "xmin", "ymax", "xmax"], rows,
                        right=set(range(7)))]
