"""Build a tiny, UNTRAINED object detector: the fallback of examples/detect_objects.py.

    python examples/tiny_detector.py /tmp/tiny_detector.tflite

examples/detect_objects.py uses a real detector (the shared SSD MobileNet v1);
it builds this model itself only when that file is absent, and says so. Pass
the file written here with detect_objects.py --model to try the second output
layout. On a real stick (--target coral) it is compiled the first time, by
edgetpu_compiler or a compile service, like any plain .tflite.

The model has the layout coralrt.vision._detect reads as "plain boxes and
scores": one uint8 image input [1, 64, 64, 3] and two outputs, boxes
[1, 16, 4] (ymin, xmin, ymax, xmax, normalised) and scores [1, 16, 91]
(column 0 the background, then the 90 COCO classes of coco_labels.txt).
Inside: three quantized convolutions, an average pool, a logistic and a
box = anchor + offset addition, operators the Edge TPU runs.

Its weights are a fixed arithmetic pattern, not trained: the boxes and
classes it reports mean NOTHING, they are only the same on every run and
machine.
"""

import argparse

import numpy as np

from coralrt.testing import ModelBuilder

SIZE = 64        # input width and height
GRID = 4         # GRID x GRID cells, one box each
CLASSES = 91     # background + the 90 COCO classes


def pattern(shape, seed):
    """Deterministic uint8 'weights' from a hash of each index (no random generator,
    so the model is the same with every NumPy)."""
    n = np.arange(int(np.prod(shape)), dtype=np.uint64) + np.uint64(seed * 7919)
    return ((n * np.uint64(2654435761)) >> np.uint64(13) & np.uint64(255)).astype(
        np.uint8).reshape(shape)


def conv(b, name, x, in_ch, in_scale, out_shape, out_scale, out_zp, *, k, stride, seed,
         w_scale=0.004, relu=True, bias_shift=0.0):
    """A quantized CONV_2D (k x k, SAME padding) with pattern weights; returns its output."""
    out_ch = out_shape[-1]
    w = b.constant(f"{name}/weights", pattern((out_ch, k, k, in_ch), seed),
                   scale=w_scale, zero_point=128)
    bias = np.full(out_ch, round(bias_shift / (in_scale * w_scale)), np.int32)
    bias = b.constant(f"{name}/bias", bias, scale=in_scale * w_scale, zero_point=0)
    y = b.tensor(name, out_shape, np.uint8, scale=out_scale, zero_point=out_zp)
    b.op("CONV_2D", [x, w, bias], [y], stride_w=stride, stride_h=stride, padding="SAME",
         fused_activation_function="RELU" if relu else "NONE")
    return y


def anchors():
    """One box per grid cell: centred on the cell, 0.4 wide and high, clipped to [0, 1]."""
    c = (np.arange(GRID) + 0.5) / GRID
    cy, cx = np.meshgrid(c, c, indexing="ij")
    boxes = np.stack([cy - 0.2, cx - 0.2, cy + 0.2, cx + 0.2], axis=-1).reshape(1, -1, 4)
    return np.clip(np.round(boxes * 255), 0, 255).astype(np.uint8)   # scale 1/255


def build():
    b = ModelBuilder(description="coralrt examples: tiny untrained detector")
    x = b.input("image", (1, SIZE, SIZE, 3), np.uint8, scale=1 / 128, zero_point=128)
    h = conv(b, "conv1", x, 3, 1 / 128, (1, 32, 32, 8), 1 / 255, 0, k=3, stride=2, seed=1)
    h = conv(b, "conv2", h, 8, 1 / 255, (1, 16, 16, 16), 2 / 255, 0, k=3, stride=2, seed=2)
    cell = SIZE // 4 // GRID
    pooled = b.tensor("pool", (1, GRID, GRID, 16), np.uint8, scale=2 / 255, zero_point=0)
    b.op("AVERAGE_POOL_2D", [h], [pooled], padding="VALID", stride_w=cell, stride_h=cell,
         filter_width=cell, filter_height=cell)
    # Boxes: anchor + a small offset (+-0.05) computed from the image.
    offsets = conv(b, "offsets", pooled, 16, 2 / 255, (1, GRID, GRID, 4), 0.1 / 255, 128,
                   k=1, stride=1, seed=3, w_scale=0.0003, relu=False)
    flat = b.tensor("offsets/flat", (1, GRID * GRID, 4), np.uint8, scale=0.1 / 255,
                    zero_point=128)
    b.op("RESHAPE", [offsets, b.constant("shape4", np.array([1, -1, 4], np.int32))], [flat])
    boxes = b.tensor("boxes", (1, GRID * GRID, 4), np.uint8, scale=1 / 255, zero_point=0)
    b.op("ADD", [flat, b.constant("anchors", anchors(), scale=1 / 255, zero_point=0)],
         [boxes])
    # Scores: a logistic over per-class logits, biased low so only a few pass 0.5.
    logits = conv(b, "logits", pooled, 16, 2 / 255, (1, GRID, GRID, CLASSES), 16 / 255, 128,
                  k=1, stride=1, seed=4, w_scale=0.02, relu=False, bias_shift=-2.0)
    probs = b.tensor("probs", (1, GRID, GRID, CLASSES), np.uint8, scale=1 / 256, zero_point=0)
    b.op("LOGISTIC", [logits], [probs])
    scores = b.tensor("scores", (1, GRID * GRID, CLASSES), np.uint8, scale=1 / 256,
                      zero_point=0)
    b.op("RESHAPE", [probs, b.constant("shape_c", np.array([1, -1, CLASSES], np.int32))],
         [scores])
    b.output(boxes, scores)
    return b.build()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="where to write the .tflite file")
    args = parser.parse_args()
    data = build().to_bytes()
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"wrote {args.out} ({len(data)} bytes): an UNTRAINED detector, its boxes mean nothing")


if __name__ == "__main__":
    main()
