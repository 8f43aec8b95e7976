"""coralrt.pycoral.learn.backprop.softmax_regression: a last layer trained with SGD and
appended to an embedding extractor, as pycoral's SoftmaxRegression.

Synthetic embeddings (well separated Gaussian clusters) train it; the model
it writes runs on LiteRT, the NumPy backend and the simulated Edge TPU and is
compared with the same layer computed in float.  A real extractor (../shared's
MobileNet v1 0.25 cut after its average pool) checks the whole path on images.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_image, shared_model
from PIL import Image

from coralrt import InferenceSession
from coralrt.errors import ConfigError, InputError, ModelError
from coralrt._compile.partition import partition
from coralrt._model import load_model
from coralrt.pycoral.learn.backprop.softmax_regression import SoftmaxRegression
from coralrt.testing import ModelBuilder
from tests.support.learn_models import embedding_extractor, run_dequantized

TARGETS = [pytest.param("cpu", {"backend": "litert"}, id="cpu-litert"),
           pytest.param("cpu", {"backend": "numpy"}, id="cpu-numpy"),
           pytest.param("sim", {}, id="sim")]
IN_SCALE = 0.05


def clusters(n_per_class: int, dim: int, classes: int, seed: int, spread: float = 0.6):
    """Embeddings in [0, 12) (what a uint8 input of scale 0.05 holds) around one
    centre per class; (data, labels), shuffled."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(2, 10, (classes, dim))
    x = np.concatenate([c + spread * rng.standard_normal((n_per_class, dim)) for c in centres])
    y = np.repeat(np.arange(classes), n_per_class)
    order = rng.permutation(len(y))
    return np.clip(x[order], 0, 12.7).astype(np.float32), y[order]


def extractor_model(dim: int, dtype=np.uint8) -> bytes:
    """A stand-in extractor: the embedding comes in as [1, dim] and is reshaped to
    [1, 1, 1, dim], the shape a MobileNet's pooled features have."""
    b = ModelBuilder()
    zp = 0 if dtype == np.uint8 else -128
    x = b.input("embedding", (1, dim), dtype, scale=IN_SCALE, zero_point=zp)
    y = b.tensor("features", (1, 1, 1, dim), dtype, scale=IN_SCALE, zero_point=zp)
    shape = b.constant("shape", np.array([1, 1, 1, dim], np.int32))
    b.op("RESHAPE", [x, shape], [y])
    b.output(y)
    return b.build().to_bytes()


def trained(dim=16, classes=4, seed=3):
    x, y = clusters(60, dim, classes, seed)
    np.random.seed(seed)
    model = SoftmaxRegression(dim, classes, weight_scale=0.01)
    split = len(y) * 3 // 4
    data = {"data_train": x[:split], "labels_train": y[:split],
            "data_val": x[split:], "labels_val": y[split:]}
    model.train_with_sgd(data, num_iter=300, learning_rate=0.05, batch_size=50,
                         print_every=0)
    return model, x, y


run = run_dequantized


def test_training_separates_separable_data_like_a_float_reference():
    model, x, y = trained()
    assert model.get_accuracy(x, y) == 1.0
    # The float reference: the same weights, applied with NumPy directly.
    logits = x.astype(np.float64) @ model.weights + model.biases
    assert np.array_equal(np.argmax(logits, axis=1) == y,
                          np.ones(len(y), bool))
    # Untrained (random) weights are not that good: training did the work.
    np.random.seed(0)
    assert SoftmaxRegression(16, 4).get_accuracy(x, y) < 0.9


def test_the_same_seed_trains_the_same_weights():
    a, _, _ = trained(seed=5)
    b, _, _ = trained(seed=5)
    assert np.array_equal(a.weights, b.weights) and np.array_equal(a.biases, b.biases)


def test_reg_shrinks_the_weights():
    x, y = clusters(40, 8, 3, seed=2)
    data = {"data_train": x, "labels_train": y, "data_val": x[:0], "labels_val": y[:0]}
    norms = []
    for reg in (0.0, 0.5):
        np.random.seed(1)
        m = SoftmaxRegression(8, 3, reg=reg)
        m.train_with_sgd(data, 200, 0.05, batch_size=40, print_every=0)
        norms.append(np.linalg.norm(m.weights))
    assert norms[1] < 0.7 * norms[0]


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("target, kw", TARGETS)
def test_appended_layer_matches_the_float_layer_on_every_target(target, kw, dtype, tmp_path):
    model, x, y = trained()
    path = tmp_path / "extractor.tflite"
    path.write_bytes(extractor_model(16, dtype))
    retrained = model.serialize_model(str(path))
    zp = 0 if dtype == np.uint8 else -128
    agree, worst = 0, 0.0
    for row, label in zip(x[:40], y[:40]):
        q = np.clip(np.round(row / IN_SCALE) + zp, np.iinfo(dtype).min,
                    np.iinfo(dtype).max).astype(dtype)[None]
        scores = run(retrained, target, kw, q)
        xq = IN_SCALE * (q.astype(np.float64) - zp).reshape(-1)
        z = xq @ model.weights + model.biases
        want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        worst = max(worst, float(np.abs(scores - want).max()))
        agree += int(np.argmax(scores)) == label
    assert agree == 40
    assert worst < 0.03, worst


def test_output_scale_comes_from_the_logits_of_the_data(tmp_path):
    model, x, _ = trained()
    path = tmp_path / "extractor.tflite"
    path.write_bytes(extractor_model(16))
    sg = load_model(model.serialize_model(path)).main
    fc = sg.operators[-2]
    assert [op.name for op in sg.operators[-2:]] == ["FULLY_CONNECTED", "SOFTMAX"]
    kernel, bias, out = (sg.tensors[i] for i in (*fc.inputs[1:], fc.outputs[0]))
    assert kernel.type_name == "UINT8" and kernel.shape == (4, 16)
    assert bias.type_name == "INT32" and bias.quantization.params == pytest.approx(
        (IN_SCALE * kernel.quantization.params[0], 0))
    scale, zp = out.quantization.params
    logits = x.astype(np.float64) @ model.weights + model.biases
    lo, hi = min(logits.min(), 0), max(logits.max(), 0)
    assert scale * (0 - zp) <= lo + scale and scale * (255 - zp) >= hi - scale
    assert scale * 255 <= (hi - lo) * 1.01          # no wasted range
    assert sg.tensors[sg.outputs[0]].quantization.params == (1 / 256, 0)


def test_a_real_extractor_learns_images_and_maps_to_the_edge_tpu(tmp_path):
    ext = embedding_extractor(load_model(shared_model("mobilenet_v1_0.25_128_quant.tflite")))
    path = tmp_path / "extractor.tflite"
    path.write_bytes(ext.to_bytes())
    names = ["cat.bmp", "bird.bmp", "sunflower.bmp", "grace_hopper.bmp"]
    rng = np.random.default_rng(0)
    inputs, data, labels = [], [], []
    with InferenceSession(path.read_bytes(), target="cpu", backend="numpy") as s:
        out = s.get_outputs()[0]
        for label, name in enumerate(names):
            image = Image.open(shared_image(name)).convert("RGB")
            inputs.append(np.asarray(image.resize((128, 128), Image.NEAREST))[None])
            w, h = image.size
            for _ in range(6):      # crops of the image as its training examples
                dx, dy = rng.integers(0, w // 5), rng.integers(0, h // 5)
                crop = image.crop((dx, dy, dx + w * 4 // 5, dy + h * 4 // 5))
                q = s.run(np.asarray(crop.resize((128, 128), Image.NEAREST))[None])[out.name]
                data.append(out.quantization[0] * q.reshape(-1).astype(np.float32))
                labels.append(label)
    data, labels = np.stack(data), np.array(labels)
    np.random.seed(0)
    model = SoftmaxRegression(256, 4, weight_scale=0.05)
    model.train_with_sgd({"data_train": data, "labels_train": labels, "data_val": data[:0],
                          "labels_val": labels[:0]}, 200, 0.05, batch_size=24, print_every=0)
    assert model.get_accuracy(data, labels) == 1.0
    retrained = model.serialize_model(path)
    for label, x in enumerate(inputs):
        assert int(np.argmax(run(retrained, "sim", {}, x))) == label
    for mode in ("compat", "multi"):
        plan = partition(load_model(retrained), mode)
        assert plan.summary["cpu_ops"] == 0 and plan.summary["segments"] == 1


def test_an_untrained_model_can_be_written(tmp_path):
    path = tmp_path / "extractor.tflite"
    path.write_bytes(extractor_model(16))
    np.random.seed(0)
    model = SoftmaxRegression(16, 5)
    sg = load_model(model.serialize_model(path)).main
    scale, zp = sg.tensors[sg.operators[-2].outputs[0]].quantization.params
    # A bound from the weights and the extractor's output range [0, 12.75].
    bound = np.max(12.75 * np.abs(model.weights).sum(axis=0))
    assert scale * (0 - zp) <= -bound * 0.99 and scale * (255 - zp) >= bound * 0.99


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("args, match", [
    ((None, 3), "feature_dim must be a positive integer"),
    ((4, 0), "num_classes must be a positive integer"),
    ((4, 3, 0.01, -1.0), "reg must be zero or positive"),
])
def test_bad_constructor_arguments_are_config_errors(args, match):
    with pytest.raises(ConfigError, match=match):
        SoftmaxRegression(*args)


@pytest.mark.parametrize("change, match", [
    ({"data_train": np.ones((10, 3))}, r"data_train must have shape \(N, 4\)"),
    ({"labels_train": np.full(10, 3)}, "class id 3, outside 0...2"),
    ({"labels_train": np.zeros(9, int)}, "must be 10 integer class ids"),
    ({"data_val": np.ones((2, 4)), "labels_val": [0.5, 1.0]}, "integer class ids"),
    ({"data_train": np.full((10, 4), np.inf)}, "NaN or infinite"),
])
def test_wrong_training_data_are_input_errors(change, match):
    data = {"data_train": np.ones((10, 4)), "labels_train": np.zeros(10, int),
            "data_val": np.ones((0, 4)), "labels_val": []}
    data.update(change)
    with pytest.raises(InputError, match=match):
        SoftmaxRegression(4, 3).train_with_sgd(data, 5, 0.1, print_every=0)


def test_missing_data_keys_are_named():
    with pytest.raises(InputError, match=r"lacks \['data_val', 'labels_val'\]"):
        SoftmaxRegression(4, 3).train_with_sgd(
            {"data_train": np.ones((2, 4)), "labels_train": [0, 1]}, 5, 0.1)


def test_extractors_that_cannot_take_the_layer_are_model_errors(tmp_path):
    model = SoftmaxRegression(16, 3)
    with pytest.raises(ModelError, match="Failed to open file"):
        model.serialize_model(tmp_path / "missing.tflite")
    other = tmp_path / "other_dim.tflite"
    other.write_bytes(extractor_model(8))
    with pytest.raises(ModelError, match="feature_dim=16"):
        model.serialize_model(other)
    b = ModelBuilder()
    x = b.input("x", (1, 16), np.float32)
    y = b.tensor("y", (1, 16), np.float32)
    b.op("RELU", [x], [y])
    b.output(y)
    floating = tmp_path / "float.tflite"
    floating.write_bytes(b.build().to_bytes())
    with pytest.raises(ModelError, match="must be a uint8 or int8 tensor"):
        model.serialize_model(floating)
    two = load_model(extractor_model(16))
    two.main.outputs.append(two.main.inputs[0])
    twice = tmp_path / "two_outputs.tflite"
    twice.write_bytes(two.to_bytes())
    with pytest.raises(ModelError, match="one and only one output"):
        model.serialize_model(twice)


def test_a_layer_on_a_compiled_model_carries_its_plain_twin(tmp_path):
    # pycoral's backprop example appends the layer to an edgetpu_compiler extractor. A
    # stick runs that file; cpu and sim run the same layer on the plain model, which the
    # file carries (edgetpu_compiler's MobileNet v1 0.25 and its plain model, ../shared).
    import shutil
    from coralrt._model.compiled import compiled_by, plain_twin
    compiled = tmp_path / "mobilenet_v1_0.25_128_quant_edgetpu.tflite"
    shutil.copy(shared_model("edgetpu/mobilenet_v1_0.25_128_quant_edgetpu.tflite"), compiled)
    plain = shared_model("mobilenet_v1_0.25_128_quant.tflite")
    x, y = clusters(30, 1001, 3, seed=5, spread=0.3)
    np.random.seed(5)
    model = SoftmaxRegression(1001, 3, weight_scale=0.01)
    model.train_with_sgd({"data_train": x, "labels_train": y, "data_val": x,
                          "labels_val": y}, num_iter=20, learning_rate=0.01, print_every=0)
    with pytest.raises(ModelError, match="compiled by edgetpu_compiler"):   # no plain: no twin
        InferenceSession(model.serialize_model(str(compiled)), target="sim")
    shutil.copy(plain, tmp_path / plain.name)
    out = tmp_path / "retrained_model_edgetpu.tflite"             # alone: no plain beside it
    out.write_bytes(model.serialize_model(str(compiled)))
    written = load_model(out)
    assert compiled_by(written) == "edgetpu_compiler" and plain_twin(written) is not None
    frame = np.random.default_rng(1).integers(0, 256, (1, 128, 128, 3), dtype=np.uint8)
    want = run(model.serialize_model(str(tmp_path / plain.name)), "sim", {}, frame)
    for target in ("sim", "cpu"):
        np.testing.assert_array_equal(run(out.read_bytes(), target, {}, frame), want)
