"""pycoral's example programs: the arguments each needs, and what it must print.

Each example is run unchanged (``python -m coralrt.compat --target sim
examples/NAME.py ARGS``) with models, images and label files from the test data
folder.  Where an example's usage names a compiled ``X_edgetpu.tflite`` that the
folder lacks, its plain ``X.tflite`` is the next choice (pycoral runs a plain model
too); the transfer-learning examples get a small dataset folder of links to the
folder's cat, dog and hot dog images.  A run passes when it exits with status 0
and its output has what the example prints on success (a label from the labels
file, a saved result image, ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["Example", "EXAMPLES", "Files", "Missing", "CheckFailed", "make_dataset"]


class Missing(Exception):
    """None of an example's candidate files is in the test data folder."""


class CheckFailed(Exception):
    """The example ran but its output lacks what it prints on success."""


# The transfer-learning dataset: class folder -> candidate images (test data paths).
DATASET = {
    "cat": ("imprinting/cat_train_0.bmp", "imprinting/cat_test_0.bmp", "cat.bmp",
            "resized_cat.bmp"),
    "dog": ("imprinting/dog_train_0.bmp", "imprinting/dog_test_0.bmp", "dog_segmentation.bmp",
            "dog_segmentation_256.bmp"),
    "hotdog": ("imprinting/hotdog_train_0.bmp", "imprinting/hotdog_train_1.bmp",
               "imprinting/hotdog_test_0.bmp", "hot_dog.jpg"),
}


class Files:
    """The test data folder (or the stand-in overlay) and a scratch folder."""

    def __init__(self, data: Path, work: Path):
        self.data, self.work = Path(data).absolute(), Path(work).absolute()
        self.used: list[Path] = []

    def pick(self, *names: str) -> str:
        for name in names:
            path = self.data / name
            if path.is_file():
                self.used.append(path)
                return str(path)
        raise Missing(" or ".join(names))

    def out(self, name: str) -> str:
        return str(self.work / name)

    def dataset(self) -> str:
        return str(make_dataset(self.data, self.work / "dataset", self.used))


def make_dataset(data: Path, folder: Path, used: list | None = None) -> Path:
    """A folder of class folders linking the test data's cat, dog and hot dog images
    (a class needs two images; two classes are needed)."""
    classes = {c: [data / n for n in names if (data / n).is_file()]
               for c, names in DATASET.items()}
    classes = {c: paths for c, paths in classes.items() if len(paths) >= 2}
    if len(classes) < 2:
        raise Missing("two images of two classes among " + ", ".join(
            n for names in DATASET.values() for n in names))
    for cls, paths in classes.items():
        (folder / cls).mkdir(parents=True, exist_ok=True)
        for path in paths:
            link = folder / cls / path.name
            if not link.exists():
                link.symlink_to(path)
            if used is not None:
                used.append(path)
    return folder


def _labels(path: str) -> set[str]:
    """The label texts of a labels file: ``ID LABEL`` lines, or one label per line."""
    out = set()
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.strip().split(maxsplit=1)
        if len(parts) == 2 and parts[0].isdigit():
            out.add(parts[1].strip())
        elif line.strip():
            out.add(line.strip())
    return out


def _after(text: str, marker: str) -> list[str]:
    if marker not in text:
        raise CheckFailed(f"no {marker!r} in the output")
    return [ln for ln in text.split(marker, 1)[1].splitlines() if ln.strip()]


def _saved(path: str) -> str:
    p = Path(path)
    if not p.is_file() or p.stat().st_size == 0:
        raise CheckFailed(f"{p.name} was not written")
    return f"{p.name} written ({p.stat().st_size} bytes)"


def _line(text: str, pattern: str) -> str:
    m = re.search(pattern, text, re.M)
    if not m:
        raise CheckFailed(f"no line matching {pattern!r} in the output")
    return m.group(0).strip()


@dataclass(frozen=True)
class Example:
    name: str                                   # examples/<name>.py
    args: Callable[[Files], list[str]]
    check: Callable[[str, Files, list[str]], str]   # (stdout, files, args) -> note


def _classify_args(f: Files) -> list[str]:
    return ["--model", f.pick("mobilenet_v2_1.0_224_inat_bird_quant_edgetpu.tflite",
                              "mobilenet_v2_1.0_224_inat_bird_quant.tflite"),
            "--labels", f.pick("inat_bird_labels.txt"), "--input", f.pick("parrot.jpg")]


def _classify_check(out: str, f: Files, args: list[str]) -> str:
    lines = _after(out, "-------RESULTS--------")
    m = re.match(r"^(.*): ([0-9.]+)$", lines[0]) if lines else None
    if not m:
        raise CheckFailed("no 'LABEL: SCORE' line after the results header")
    if m.group(1) not in _labels(args[args.index("--labels") + 1]):
        raise CheckFailed(f"{m.group(1)!r} is not a label of the labels file")
    return f"top-1 {lines[0]}"


def _detect_args(f: Files) -> list[str]:
    return ["--model", f.pick("ssd_mobilenet_v2_coco_quant_postprocess_edgetpu.tflite",
                              "ssd_mobilenet_v2_coco_quant_postprocess.tflite",
                              "ssd_mobilenet_v1_coco_quant_postprocess_edgetpu.tflite"),
            "--labels", f.pick("coco_labels.txt"), "--input", f.pick("grace_hopper.bmp"),
            "--output", f.out("grace_hopper_processed.bmp")]


def _detect_check(out: str, f: Files, args: list[str]) -> str:
    lines = _after(out, "-------RESULTS--------")
    labels = _labels(args[args.index("--labels") + 1])
    found = [ln.strip() for ln in lines if ln.strip() in labels]
    if not found:
        raise CheckFailed("no detected object with a label of the labels file: "
                          + " / ".join(lines[:3]))
    return f"objects: {', '.join(found)}; " + _saved(args[args.index("--output") + 1])


def _segment_args(f: Files) -> list[str]:
    return ["--model", f.pick("deeplabv3_mnv2_pascal_quant_edgetpu.tflite",
                              "deeplabv3_mnv2_pascal_quant.tflite"),
            "--input", f.pick("bird.bmp"), "--keep_aspect_ratio",
            "--output", f.out("segmentation_result.jpg")]


def _saved_check(out: str, f: Files, args: list[str]) -> str:
    _line(out, r"^Done\. Results saved at .*$")
    return _saved(args[args.index("--output") + 1])


def _movenet_args(f: Files) -> list[str]:
    return ["--model", f.pick("movenet_single_pose_lightning_ptq_edgetpu.tflite",
                              "movenet_single_pose_lightning_ptq.tflite"),
            "--input", f.pick("squat.bmp"), "--output", f.out("movenet_result.jpg")]


def _movenet_check(out: str, f: Files, args: list[str]) -> str:
    rows = re.findall(r"\[\s*[-+0-9.e]+\s+[-+0-9.e]+\s+[-+0-9.e]+\s*\]", out)
    if len(rows) != 17:
        raise CheckFailed(f"the pose has {len(rows)} keypoints printed, not 17")
    return "17 keypoints; " + _saved_check(out, f, args)


def _two_models_args(f: Files) -> list[str]:
    return ["--classification_model", f.pick("mobilenet_v2_1.0_224_quant_edgetpu.tflite",
                                             "mobilenet_v2_1.0_224_quant.tflite"),
            "--detection_model", f.pick("ssd_mobilenet_v2_face_quant_postprocess_edgetpu.tflite",
                                        "ssd_mobilenet_v2_face_quant_postprocess.tflite",
                                        "ssd_mobilenet_v1_coco_quant_postprocess_edgetpu.tflite"),
            "--image", f.pick("parrot.jpg"), "--num_inferences", "20", "--batch_size", "5"]


def _two_models_check(out: str, f: Files, args: list[str]) -> str:
    return "; ".join(_line(out, rf"^Inference with {n} costs .*$")
                     for n in ("one Edge TPU", "two Edge TPUs"))


def _imprinting_args(f: Files) -> list[str]:
    return ["--model_path", f.pick("mobilenet_v1_1.0_224_l2norm_quant_edgetpu.tflite",
                                   "mobilenet_v1_1.0_224_l2norm_quant.tflite"),
            "--data", f.dataset(), "--output", f.out("imprinted.tflite")]


def _imprinting_check(out: str, f: Files, args: list[str]) -> str:
    return _line(out, r"^Top 1 : .*$") + "; " + _saved(args[args.index("--output") + 1])


def _backprop_args(f: Files) -> list[str]:
    return ["--embedding_extractor_path",
            f.pick("mobilenet_v1_1.0_224_quant_embedding_extractor_edgetpu.tflite",
                   "mobilenet_v1_1.0_224_quant_embedding_extractor.tflite"),
            "--data_dir", f.dataset(), "--output_dir", f.out("retrain")]


def _backprop_check(out: str, f: Files, args: list[str]) -> str:
    note = _line(out, r"^Saved tflite model test accuracy: .*$")
    return note + "; " + _saved(str(Path(args[-1]) / "retrained_model_edgetpu.tflite"))


EXAMPLES = (
    Example("classify_image", _classify_args, _classify_check),
    Example("detect_image", _detect_args, _detect_check),
    Example("semantic_segmentation", _segment_args, _saved_check),
    Example("movenet_pose_estimation", _movenet_args, _movenet_check),
    Example("two_models_inference", _two_models_args, _two_models_check),
    Example("imprinting_learning", _imprinting_args, _imprinting_check),
    Example("backprop_last_layer", _backprop_args, _backprop_check),
)
