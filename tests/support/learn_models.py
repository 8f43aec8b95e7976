"""Base models for the on-device training tests, made from real classifiers with coralrt's
own model layer.

``embedding_extractor`` cuts a MobileNet classifier after its global average pool;
``imprinting_model`` appends the layers of Coral's L2-norm imprinting models
(L2_NORMALIZATION, a 1x1 CONV_2D whose kernel rows are the class vectors, MUL
by a scalar, RESHAPE, SOFTMAX) to such an extractor.  They stand in for
``mobilenet_v1_1.0_224_l2norm_quant.tflite``, which is not in ../shared.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from coralrt._model import Model
from coralrt._tensors import dequantize
from coralrt.testing import make_operator, make_tensor


def embedding_extractor(classifier: Model) -> Model:
    """The classifier cut after its last AVERAGE_POOL_2D (output [1, 1, 1, D])."""
    names = [op.name for op in classifier.main.operators]
    last = len(names) - 1 - names[::-1].index("AVERAGE_POOL_2D")
    return classifier.extract(range(last + 1))


def classifier_rows(classifier: Model) -> np.ndarray:
    """The real-valued kernel rows (one per class) of the classifier's last CONV_2D."""
    sg = classifier.main
    conv = [op for op in sg.operators if op.name == "CONV_2D"][-1]
    k = sg.tensors[conv.inputs[1]]
    q = k.quantization
    return dequantize(k.data, q.scale, q.zero_point).reshape(k.shape[0], -1)


def imprinting_model(extractor: Model, class_rows: np.ndarray, scale_factor: float = 16.0,
                     with_quantize: bool = False) -> Model:
    """``extractor`` followed by the imprinting layers, with one class per row of
    ``class_rows`` (normalized here).  ``with_quantize`` puts a QUANTIZE (same
    parameters) between the normalization and the convolution, as some converters do."""
    sg = extractor.main
    tensors, ops = list(sg.tensors), list(sg.operators)
    emb = tensors[sg.outputs[0]]
    dtype = np.dtype(emb.dtype)
    zp = 128 if dtype == np.uint8 else 0
    dim = emb.shape[-1]
    rows = np.asarray(class_rows, np.float64)
    rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    n = len(rows)

    def add(t) -> int:
        tensors.append(t)
        return len(tensors) - 1

    def act(name, shape, scale):
        return add(make_tensor(name, shape, dtype, scale=scale, zero_point=zp))

    norm = act("imprinting/l2norm", (1, 1, 1, dim), 1 / 128)
    ops.append(make_operator("L2_NORMALIZATION", [sg.outputs[0]], [norm]))
    fed = norm
    if with_quantize:
        fed = act("imprinting/quantize", (1, 1, 1, dim), 1 / 128)
        ops.append(make_operator("QUANTIZE", [norm], [fed]))
    if dtype == np.uint8:
        kq = np.clip(np.round(rows * 128) + 128, 0, 255).astype(np.uint8)
    else:
        kq = np.clip(np.round(rows * 127), -127, 127).astype(np.int8)
    w_scale = 1 / 128 if dtype == np.uint8 else 1 / 127
    kernel = add(make_tensor("imprinting/kernel", (n, 1, 1, dim), dtype,
                             data=kq.reshape(n, 1, 1, dim), scale=w_scale, zero_point=zp))
    bias = add(make_tensor("imprinting/bias", (n,), np.int32, data=np.zeros(n, np.int32),
                           scale=w_scale / 128, zero_point=0))
    cos = act("imprinting/cosine", (1, 1, 1, n), 1 / 128)
    ops.append(make_operator("CONV_2D", [fed, kernel, bias], [cos], padding="SAME",
                             stride_w=1, stride_h=1))
    # The factor as one quantized constant: q * scale == scale_factor.
    factor_q = np.array([127 if dtype == np.int8 else 255], dtype)
    factor = add(make_tensor("imprinting/scale", (1,), dtype, data=factor_q,
                             scale=scale_factor / int(factor_q[0]), zero_point=0))
    logits = act("imprinting/logits", (1, 1, 1, n), scale_factor / 128)
    ops.append(make_operator("MUL", [cos, factor], [logits]))
    shape = add(make_tensor("imprinting/shape", (2,), np.int32,
                            data=np.array([1, n], np.int32)))
    flat = act("imprinting/flat", (1, n), scale_factor / 128)
    ops.append(make_operator("RESHAPE", [logits, shape], [flat]))
    probs = add(make_tensor("imprinting/probabilities", (1, n), dtype, scale=1 / 256,
                            zero_point=0 if dtype == np.uint8 else -128))
    ops.append(make_operator("SOFTMAX", [flat], [probs], beta=1.0))
    main = dataclasses.replace(sg, tensors=tensors, operators=ops, outputs=[probs])
    return dataclasses.replace(extractor, subgraphs=[main], buffers=[], source=None,
                               description="coralrt imprinting test model")


def run_dequantized(model: bytes, target: str, kw: dict, x: np.ndarray) -> np.ndarray:
    """The model's one output for ``x`` on ``target``, dequantized and flattened."""
    from coralrt import InferenceSession
    with InferenceSession(model, target=target, **kw) as s:
        out = s.get_outputs()[0]
        q = s.run(x)[out.name]
    scale, zp = out.quantization
    return (scale * (q.astype(np.float64) - zp)).reshape(-1)
