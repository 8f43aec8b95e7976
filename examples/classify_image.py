"""Classify one image and print the top classes.

Shows: an InferenceSession on a chosen target and coralrt.vision._classify,
which resizes the image to the model's input, runs it and returns the best
classes with their labels.

Run it from the repository root without a stick (simulated Edge TPU):

    python examples/classify_image.py ../shared/models/mobilenet_v2_1.0_224_quant.tflite \
        ../shared/images/cat.bmp --labels ../shared/images/imagenet_labels.txt --target sim

On a Coral USB Accelerator use --target coral (or leave the default, auto:
the stick when one is plugged in and the model can run there, else the CPU).
A plain .tflite is compiled for the stick the first time (edgetpu_compiler or
a compile service, see docs/cli.md); a *_edgetpu.tflite runs as it is.
"""

import argparse
import time

from coralrt import InferenceSession, vision


def main():
    parser = argparse.ArgumentParser(description="Classify one image with coralrt.")
    parser.add_argument("model", help="a classification .tflite (uint8 image in, scores out)")
    parser.add_argument("image", help="an image file (BMP, PNG, JPEG ...)")
    parser.add_argument("--labels", help="label file: one label per line, or 'id label' lines")
    parser.add_argument("--top-k", type=int, default=3, help="how many classes to print")
    parser.add_argument("--target", default="auto", choices=["auto", "sim", "coral", "cpu"],
                        help="where to run (default: auto, a stick if present, else the CPU)")
    args = parser.parse_args()

    labels = vision.read_labels(args.labels) if args.labels else None
    with InferenceSession(args.model, target=args.target) as session:
        start = time.perf_counter()
        classes = vision.classify(session, args.image, top_k=args.top_k, labels=labels)
        ms = (time.perf_counter() - start) * 1000
        # The first inference on a stick also uploads the model's parameters.
        print(f"target: {session.target}, first inference: {ms:.1f} ms")

    print(f"{'rank':>4}  {'id':>5}  {'score':>6}  label")
    for rank, c in enumerate(classes, 1):
        print(f"{rank:>4}  {c.id:>5}  {c.score:6.4f}  {c.label or '-'}")


if __name__ == "__main__":
    main()
