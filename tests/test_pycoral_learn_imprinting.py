"""coralrt.pycoral.learn.imprinting.engine: weight imprinting, as pycoral's ImprintingEngine.

The base model is ../shared's MobileNet v1 0.25 cut after its average pool with the
imprinting layers appended (tests/support/learn_models.py), its 1001 ImageNet
classes kept as the base classes; a small int8 model is built in code.  The
retrained models run on LiteRT, the NumPy backend and the simulated Edge TPU,
and are compared with a float computation of the same cosine classifier.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_image, shared_model
from PIL import Image

from coralrt.errors import ModelError, TrainingError
from coralrt._compile.partition import partition
from coralrt._model import load_model
from coralrt.pycoral.learn.imprinting.engine import ImprintingEngine
from coralrt.testing import ModelBuilder
from tests.support.learn_models import (run_dequantized, 
    classifier_rows, embedding_extractor, imprinting_model,
)

IMAGES = ["cat.bmp", "bird.bmp", "sunflower.bmp", "grace_hopper.bmp"]
TARGETS = [pytest.param("cpu", {"backend": "litert"}, id="cpu-litert"),
           pytest.param("cpu", {"backend": "numpy"}, id="cpu-numpy"),
           pytest.param("sim", {}, id="sim")]
FACTOR = 16.0


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """(path of the base model, its classifier's rows, the images as model inputs)."""
    clf = load_model(shared_model("mobilenet_v1_0.25_128_quant.tflite"))
    rows = classifier_rows(clf)
    path = tmp_path_factory.mktemp("imprinting") / "base.tflite"
    path.write_bytes(imprinting_model(embedding_extractor(clf), rows, FACTOR).to_bytes())
    images = [np.asarray(Image.open(shared_image(n)).convert("RGB")
                         .resize((128, 128), Image.NEAREST))[None] for n in IMAGES]
    return path, rows, images


run = run_dequantized


def float_scores(class_sums: np.ndarray, embedding: np.ndarray) -> np.ndarray:
    """The imprinted classifier in float: softmax(factor * cosine(class, embedding))."""
    w = class_sums / np.linalg.norm(class_sums, axis=1, keepdims=True)
    e = embedding / np.linalg.norm(embedding)
    z = FACTOR * (w @ e)
    p = np.exp(z - z.max())
    return p / p.sum()


def kernel_rows(model: bytes) -> np.ndarray:
    sg = load_model(model).main
    k = sg.tensors[sg.operators[-4].inputs[1]]
    scale, zp = k.quantization.params
    return scale * (k.data.reshape(k.shape[0], -1).astype(np.float64) - zp)


@pytest.mark.parametrize("target, kw", TARGETS)
def test_new_classes_classify_their_images_on_every_target(base, target, kw):
    path, _, images = base
    engine = ImprintingEngine(str(path), keep_classes=False)
    assert engine.num_classes == 0 and engine.embedding_dim == 256
    extractor = engine.serialize_extractor_model()
    embeddings = [run(extractor, target, kw, x) for x in images]
    for e in embeddings:
        assert e.shape == (256,) and abs(np.linalg.norm(e) - 1) < 0.05   # L2-normalized
    for class_id, e in enumerate(embeddings):
        engine.train(e, class_id)
    assert engine.num_classes == len(IMAGES)
    model = engine.serialize_model()
    for class_id, (x, e) in enumerate(zip(images, embeddings)):
        scores = run(model, target, kw, x)
        assert scores.shape == (len(IMAGES),)
        assert int(np.argmax(scores)) == class_id
        want = float_scores(np.stack(embeddings), e)
        assert np.abs(scores - want).max() < 0.02, (scores, want)


def test_keep_classes_adds_after_the_base_classes(base):
    path, _, images = base
    engine = ImprintingEngine(path, keep_classes=True)
    assert engine.num_classes == 1001
    extractor = engine.serialize_extractor_model()
    e_cat, e_bird = (run(extractor, "sim", {}, x) for x in images[:2])
    with pytest.raises(TrainingError, match="base model"):
        engine.train(e_cat, 286)              # a class of the base model
    with pytest.raises(TrainingError, match="next new class is 1001"):
        engine.train(e_cat, 1002)             # skips 1001
    engine.train(e_cat, 1001)
    engine.train(e_bird, 1002)
    model = engine.serialize_model()
    got = kernel_rows(model)
    assert got.shape == (1003, 256)
    # The base classes: the base model's rows, normalized and quantized again with the
    # new kernel's (finer) step.
    before = kernel_rows(path.read_bytes())
    unit = before / np.linalg.norm(before, axis=1, keepdims=True)
    sg = load_model(model).main
    step = sg.tensors[sg.operators[-4].inputs[1]].quantization.params[0]
    assert step < 1 / 128
    assert np.abs(got[:1001] - unit).max() <= step * 0.501
    scores = run(model, "sim", {}, images[0])
    assert scores.shape == (1003,) and int(np.argmax(scores)) == 1001
    assert int(np.argmax(run(model, "sim", {}, images[1]))) == 1002


def test_retraining_a_saved_model_continues_its_classes(base, tmp_path):
    path, _, images = base
    first = ImprintingEngine(path)
    extractor = first.serialize_extractor_model()
    e = [run(extractor, "cpu", {"backend": "numpy"}, x) for x in images[:3]]
    first.train(e[0], 0)
    saved = tmp_path / "cat_only.tflite"
    saved.write_bytes(first.serialize_model())
    assert load_model(saved).description.split() == ["0", f"{np.linalg.norm(e[0]):f}"]

    again = ImprintingEngine(saved, keep_classes=True)
    assert again.num_classes == 1
    again.train(e[2], 0)                      # an imprinted class can take more images
    again.train(e[1], 1)
    at_once = ImprintingEngine(path)
    for v, c in [(e[0], 0), (e[2], 0), (e[1], 1)]:
        at_once.train(v, c)
    a, b = kernel_rows(again.serialize_model()), kernel_rows(at_once.serialize_model())
    assert a.shape == b.shape == (2, 256)
    assert np.abs(a - b).max() < 0.02         # the cat's sum came back from the norm


def test_extractor_round_trip(base):
    path, _, images = base
    engine = ImprintingEngine(path)
    extractor = load_model(engine.serialize_extractor_model())
    model = load_model(path)
    names = [op.name for op in model.main.operators]
    assert [op.name for op in extractor.main.operators] == names[:names.index("CONV_2D", 27)]
    out = extractor.main.tensors[extractor.main.outputs[0]]
    assert out.shape == (1, 1, 1, 256) and out.quantization.params == (1 / 128, 128)
    # Its output is the pooled features of the classifier, L2-normalized.
    pooled = embedding_extractor(load_model(shared_model("mobilenet_v1_0.25_128_quant.tflite")))
    for x in images:
        e = run(extractor.to_bytes(), "cpu", {"backend": "numpy"}, x)
        p = run(pooled.to_bytes(), "cpu", {"backend": "numpy"}, x)
        assert np.abs(e - p / np.linalg.norm(p)).max() < 1.5 / 128
    # The same bytes every time; not an imprinting model itself.
    assert ImprintingEngine(path).serialize_extractor_model() == \
        engine.serialize_extractor_model()
    with pytest.raises(ModelError, match="last 4 operators"):
        ImprintingEngine(engine.serialize_extractor_model())


def test_retrained_model_maps_fully_to_the_edge_tpu(base):
    path, _, images = base
    engine = ImprintingEngine(path, keep_classes=True)
    engine.train(run(engine.serialize_extractor_model(), "sim", {}, images[0]), 1001)
    model = load_model(engine.serialize_model())
    for mode in ("compat", "multi"):
        plan = partition(model, mode)
        assert plan.summary["cpu_ops"] == 0, [(o.index, o.reason) for o in plan.ops
                                              if o.unit == "cpu"]
        assert plan.summary["tpu_ops"] == len(model.main.operators)
        assert plan.summary["segments"] == 1


def tiny_int8_base(with_quantize: bool) -> bytes:
    """An int8 extractor (average pool of a 4x4x8 input) with the imprinting layers."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8), np.int8, scale=0.05, zero_point=0)
    y = b.tensor("pool", (1, 1, 1, 8), np.int8, scale=0.05, zero_point=0)
    b.op("AVERAGE_POOL_2D", [x], [y], filter_width=4, filter_height=4, stride_w=1,
         stride_h=1, padding="VALID")
    b.output(y)
    rows = np.random.default_rng(1).standard_normal((3, 8))
    return imprinting_model(b.build(), rows, FACTOR, with_quantize=with_quantize).to_bytes()


@pytest.mark.parametrize("with_quantize", [False, True])
@pytest.mark.parametrize("target, kw", TARGETS)
def test_int8_model_keeps_int8_and_classifies(target, kw, with_quantize):
    rng = np.random.default_rng(7)
    inputs = [rng.integers(-60, 60, (1, 4, 4, 8), dtype=np.int8) for _ in range(4)]
    engine = ImprintingEngine(tiny_int8_base(with_quantize), keep_classes=True)
    assert engine.num_classes == 3
    extractor = engine.serialize_extractor_model()
    embeddings = [run(extractor, target, kw, x) for x in inputs]
    for i, e in enumerate(embeddings):
        engine.train(e, 3 + i)
    model = engine.serialize_model()
    sg = load_model(model).main
    kernel = sg.tensors[sg.operators[-4].inputs[1]]
    assert kernel.type_name == "INT8" and kernel.quantization.params[1] == 0
    for i, x in enumerate(inputs):
        assert int(np.argmax(run(model, target, kw, x))) == 3 + i


# -- errors ----------------------------------------------------------------------------------


def test_a_missing_file_is_a_model_error():
    with pytest.raises(ModelError, match="Failed to open file: no_such_model.tflite"):
        ImprintingEngine("no_such_model.tflite")


def test_a_classifier_without_l2norm_is_refused():
    with pytest.raises(ModelError, match="Input model must have an L2Norm layer"):
        ImprintingEngine(shared_model("mobilenet_v1_0.25_128_quant.tflite"))


def test_a_model_whose_tail_differs_is_refused(base):
    path, rows, _ = base
    model = load_model(path)
    sg = model.main
    sg.outputs[:] = [sg.operators[-2].outputs[0]]        # drop the SOFTMAX
    del sg.operators[-1]
    with pytest.raises(ModelError, match=r"last 4 operators must be Conv2d, Mul, Reshape"):
        ImprintingEngine(model.to_bytes())


def test_saving_before_training_is_a_training_error(base):
    with pytest.raises(TrainingError, match="Model is not trained"):
        ImprintingEngine(base[0]).serialize_model()


@pytest.mark.parametrize("embedding, class_id, match", [
    (np.ones(255), 0, r"shape \(255,\), expected \(256,\)"),
    (np.ones((1, 256)), 0, r"shape \(1, 256\)"),
    (np.full(256, np.nan), 0, "NaN"),
    (np.ones(256), 1, "too large"),
    (np.ones(256), -1, "negative"),
    (np.ones(256), 0.5, "must be an integer"),
])
def test_wrong_training_inputs_are_training_errors(base, embedding, class_id, match):
    engine = ImprintingEngine(base[0])
    with pytest.raises(TrainingError, match=match):
        engine.train(embedding, class_id)
    assert engine.num_classes == 0
