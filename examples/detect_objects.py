"""Detect objects in one image, print them and save the image with their boxes.

Shows: coralrt.vision._detect (boxes come back in the image's pixels, whatever
the model's input size) and coralrt.vision._draw.

It reads both detector layouts: Coral's SSD models with the post-process
operator, and plain boxes [1, N, 4] + scores [1, N, C]. Without a real
detector at hand, build the tiny UNTRAINED one (its boxes mean nothing) and
run it without a stick (simulated Edge TPU), from the repository root:

    python examples/tiny_detector.py /tmp/tiny_detector.tflite
    python examples/detect_objects.py /tmp/tiny_detector.tflite ../shared/images/kite_and_cold.jpg \
        --save /tmp/kites.png --labels ../shared/images/coco_labels.txt --target sim

On a Coral USB Accelerator use --target coral (or the default, auto) with
Coral's ssd_mobilenet_v2_coco_quant_postprocess_edgetpu.tflite and
coco_labels.txt from github.com/google-coral/test_data.
"""

import argparse
import time

from coralrt import InferenceSession, vision


def main():
    parser = argparse.ArgumentParser(description="Detect objects in one image with coralrt.")
    parser.add_argument("model", help="a detection .tflite (SSD post-process, or boxes + scores)")
    parser.add_argument("image", help="an image file (BMP, PNG, JPEG ...)")
    parser.add_argument("--save", required=True, metavar="OUT.png",
                        help="where to write the image with the boxes (.png or .jpg)")
    parser.add_argument("--labels", help="label file, e.g. coco_labels.txt")
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="lowest score reported (default 0.5)")
    parser.add_argument("--target", default="auto", choices=["auto", "sim", "coral", "cpu"],
                        help="where to run (default: auto, a stick if present, else the CPU)")
    args = parser.parse_args()

    labels = vision.read_labels(args.labels) if args.labels else None
    with InferenceSession(args.model, target=args.target) as session:
        start = time.perf_counter()
        objects = vision.detect(session, args.image, threshold=args.threshold, labels=labels)
        ms = (time.perf_counter() - start) * 1000
        print(f"target: {session.target}, first inference: {ms:.1f} ms")

    print(f"{len(objects)} objects scoring >= {args.threshold}")
    for obj in objects:
        box = obj.bbox
        print(f"  {obj.label or obj.id}  score {obj.score:.2f}  box "
              f"({box.xmin:.0f}, {box.ymin:.0f}) - ({box.xmax:.0f}, {box.ymax:.0f})")

    drawn = vision.draw(args.image, objects, args.save)
    print(f"saved {args.save} ({drawn.width}x{drawn.height})")


if __name__ == "__main__":
    main()
