"""Detect objects in one image, print them and save the image with their boxes.

Shows: coralrt.vision._detect (boxes come back in the image's pixels, whatever
the model's input size) and coralrt.vision._draw.

The model is a real detector: by default the SSD MobileNet v1 (COCO) of the
test models, ../shared/models/detect/coco_ssd_mobilenet_v1_1.0_quant_2018_06_29.tflite
beside the repository. Without a stick, on the simulated Edge TPU, from the
repository root:

    python examples/detect_objects.py ../shared/images/kite_and_cold.jpg \
        --save /tmp/kites.png --labels ../shared/images/coco_labels.txt --target sim

--model PATH takes another detector (Coral's SSD post-process layout, or plain
boxes [1, N, 4] + scores [1, N, C]). Only when no --model is given and the
shared SSD is absent does it fall back to the tiny UNTRAINED detector of
examples/tiny_detector.py, and says so: its boxes mean nothing.

On a Coral USB Accelerator use --target coral (or the default, auto): the plain
SSD is compiled for the stick the first time (edgetpu_compiler or a compile
service), or pass Coral's ssd_mobilenet_v2_coco_quant_postprocess_edgetpu.tflite.
"""

import argparse
import sys
import time
from pathlib import Path

from coralrt import InferenceSession, vision

HERE = Path(__file__).resolve().parent
SHARED_SSD = (HERE.parent.parent / "shared" / "models" / "detect"
              / "coco_ssd_mobilenet_v1_1.0_quant_2018_06_29.tflite")


def default_model():
    """The shared SSD, or the bytes of the untrained fallback when it is absent."""
    if SHARED_SSD.is_file():
        return str(SHARED_SSD)
    sys.path.insert(0, str(HERE))
    from tiny_detector import build
    print(f"WARNING: {SHARED_SSD} not found: using the tiny UNTRAINED detector of "
          f"examples/tiny_detector.py instead; its boxes and labels mean nothing")
    return build().to_bytes()


def main():
    parser = argparse.ArgumentParser(description="Detect objects in one image with coralrt.")
    parser.add_argument("image", help="an image file (BMP, PNG, JPEG ...)")
    parser.add_argument("--model", help="a detection .tflite (default: the shared SSD)")
    parser.add_argument("--save", required=True, metavar="OUT.png",
                        help="where to write the image with the boxes (.png or .jpg)")
    parser.add_argument("--labels", help="label file, e.g. coco_labels.txt")
    parser.add_argument("--threshold", type=float, default=0.5,
                        help="lowest score reported (default 0.5)")
    parser.add_argument("--target", default="auto", choices=["auto", "sim", "coral", "cpu"],
                        help="where to run (default: auto, a stick if present, else the CPU)")
    args = parser.parse_args()

    model = args.model or default_model()
    labels = vision.read_labels(args.labels) if args.labels else None
    with InferenceSession(model, target=args.target) as session:
        start = time.perf_counter()
        objects = vision.detect(session, args.image, threshold=args.threshold, labels=labels)
        ms = (time.perf_counter() - start) * 1000
        print(f"model: {model if isinstance(model, str) else 'tiny untrained detector'}")
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
