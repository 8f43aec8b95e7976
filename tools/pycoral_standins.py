"""Stand-in models for pycoral test files that a Coral test data folder lacks.

Coral's test data keeps its larger models in Git LFS, so a checkout without LFS
(or a partial download) has only some of them.  A stand-in is a plain model
that exists, put under the missing file's name in an *overlay* folder: every
file of the test data folder linked into a fresh folder, plus the stand-ins.
The programs then run unchanged against the overlay.  A stand-in is a different
model from the one it replaces: a test that checks the exact labels, scores or
boxes of the original may fail on it, which is reported as "stand-in differs",
not hidden.  ``STAND-INS.md`` in the overlay lists each stand-in and its source.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coralrt._model.extract import extract  # noqa: E402
from coralrt._model.reader import load_model  # noqa: E402

__all__ = ["StandIn", "STAND_INS", "build_overlay", "Overlay"]

_PIPELINE_SOURCES = ("mobilenet_v1_0.25_128_quant.tflite", "mobilenet_v1_0.5_160_quant.tflite",
                     "mobilenet_v2_1.0_224_quant.tflite")


@dataclass(frozen=True)
class StandIn:
    name: str                       # the missing file, relative to the test data folder
    sources: tuple[str, ...]        # candidates, relative to the data or shared models folder
    made: str                       # how the file is made from the source
    build: Callable[[Path], bytes] | None = None   # None: the source's bytes as they are


def _single_io(path: Path):
    model = load_model(str(path))
    sg = model.subgraphs[0]
    names = [sg.tensors[i].name for i in sg.inputs]
    if names != ["input"] or len(sg.outputs) != 1:
        raise ValueError(f"{path.name} has inputs {names} and {len(sg.outputs)} outputs; "
                         "the pipeline test needs one input named 'input' and one output")
    return model


def _segment(index: int) -> Callable[[Path], bytes]:
    def build(path: Path) -> bytes:
        model = _single_io(path)
        count = len(model.subgraphs[0].operators)
        half = count // 2
        ops = range(half) if index == 0 else range(half, count)
        return extract(model, ops).model.to_bytes()
    return build


def _whole(path: Path) -> bytes:
    _single_io(path)
    return path.read_bytes()


def _imprinting(path: Path) -> bytes:
    # The L2-norm imprinting layout (L2_NORMALIZATION, a 1x1 CONV_2D of class rows, MUL,
    # RESHAPE, SOFTMAX) on Coral's own MobileNet v1 embedding extractor, with 1001
    # random (seeded) base classes.  The MUL factor of Coral's model is not known here;
    # 32 is what the test's score thresholds need, so a pass says nothing of Coral's.
    import numpy as np
    from tests.support.learn_models import imprinting_model
    extractor = load_model(path)
    dim = extractor.main.tensors[extractor.main.outputs[0]].shape[-1]
    rows = np.random.default_rng(0).standard_normal((1001, dim))
    return imprinting_model(extractor, rows, 32.0).to_bytes()


STAND_INS = (
    StandIn("pipeline/inception_v3_299_quant_segment_0_of_2_edgetpu.tflite", _PIPELINE_SOURCES,
            "the first half of the source's operators (coralrt._model.extract), plain",
            _segment(0)),
    StandIn("pipeline/inception_v3_299_quant_segment_1_of_2_edgetpu.tflite", _PIPELINE_SOURCES,
            "the second half of the source's operators, plain", _segment(1)),
    StandIn("inception_v3_299_quant_edgetpu.tflite", _PIPELINE_SOURCES,
            "the whole source model (the two segments' reference), plain", _whole),
    StandIn("mobilenet_v1_1.0_224_quant_edgetpu.tflite",
            ("mobilenet_v2_1.0_224_quant.tflite",),
            "a copy: another uint8 224x224x3 ImageNet classifier (1001 classes), plain"),
    StandIn("mobilenet_v1_1.0_224_l2norm_quant.tflite",
            ("mobilenet_v1_1.0_224_quant_embedding_extractor.tflite",),
            "Coral's MobileNet v1 embedding extractor with the L2-norm imprinting layers "
            "appended (1001 random base classes, MUL factor 32: Coral's factor is unknown "
            "here), plain", _imprinting),
    StandIn("mobilenet_v1_1.0_224_quant.tflite", ("mobilenet_v2_1.0_224_quant.tflite",),
            "a copy: another uint8 224x224x3 ImageNet classifier (1001 classes), plain"),
    StandIn("ssd_mobilenet_v1_coco_quant_postprocess_edgetpu.tflite",
            ("detect/coco_ssd_mobilenet_v1_1.0_quant_2018_06_29.tflite",),
            "a copy: TensorFlow Lite's uint8 SSD MobileNet v1 COCO detector (300x300x3, "
            "TFLite_Detection_PostProcess), plain"),
)


@dataclass
class Overlay:
    root: Path
    made: dict[str, str]            # stand-in name -> "from SOURCE: how"
    not_made: dict[str, str]        # stand-in name -> why not

    def is_stand_in(self, path) -> bool:
        try:
            rel = Path(path).absolute().relative_to(self.root.absolute())
        except ValueError:
            return False
        return rel.as_posix() in self.made


def _find(source: str, folders: list[Path]) -> Path | None:
    for folder in folders:
        if (folder / source).is_file():
            return folder / source
    return None


def _link_tree(data_dir: Path, root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(data_dir):
        rel = Path(dirpath).relative_to(data_dir)
        (root / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            os.symlink(Path(dirpath).absolute() / name, root / rel / name)


def build_overlay(data_dir: Path, root: Path, shared_models: Path | None) -> Overlay:
    """Link ``data_dir`` into the empty folder ``root`` and add a stand-in for
    each file of :data:`STAND_INS` that ``data_dir`` lacks."""
    data_dir = Path(data_dir).absolute()
    _link_tree(data_dir, root)
    folders = [data_dir] + ([Path(shared_models)] if shared_models else [])
    made, not_made = {}, {}
    for stand_in in STAND_INS:
        if (data_dir / stand_in.name).exists():
            continue
        data, source, why = None, None, []
        for candidate in stand_in.sources:
            path = _find(candidate, folders)
            if path is None:
                why.append(f"{candidate}: in none of {', '.join(map(str, folders))}")
                continue
            try:
                data = stand_in.build(path) if stand_in.build else path.read_bytes()
            except ValueError as e:
                why.append(str(e))
                continue
            source = path
            break
        if data is None:
            not_made[stand_in.name] = "no usable source: " + "; ".join(why)
            continue
        target = root / stand_in.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        made[stand_in.name] = f"from {source}: {stand_in.made}"
    _write_listing(root, data_dir, made, not_made)
    return Overlay(root, made, not_made)


def _write_listing(root: Path, data_dir: Path, made: dict, not_made: dict) -> None:
    lines = ["# Stand-in models", "",
             f"Every other file here is a link to {data_dir}. These files are not the",
             "models their names say: each is a plain model that exists, under the name",
             "of one the test data folder lacks, so that the programs that open it run.",
             "Results that depend on the original model's exact labels, scores or",
             "boxes may differ.", "", "| file | made |", "|---|---|"]
    lines += [f"| `{name}` | {how} |" for name, how in made.items()]
    if not_made:
        lines += ["", "Not made:", ""] + [f"- `{n}`: {why}" for n, why in not_made.items()]
    (root / "STAND-INS.md").write_text("\n".join(lines) + "\n")
