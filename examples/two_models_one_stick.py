"""Two models on one stick: open the stick once, give it to two sessions.

Shows: device= with an open stick. Each session loads its own model; the
stick runs one request at a time, so requests from the two sessions take
turns. The loop alternates between the models, printing each one's top
class and time. Without a stick, from the repository root:

    python examples/two_models_one_stick.py ../shared/models/mobilenet_v2_1.0_224_quant.tflite \
        ../shared/models/mobilenet_v1_0.25_128_quant.tflite ../shared/images/cat.bmp \
        --labels ../shared/images/imagenet_labels.txt --target sim

--target sim opens one simulated stick (coralrt._sim.stick.open_simulated_sticks).

On a Coral USB Accelerator use --target coral (auto picks it when a stick is
plugged in). A stick caches the parameters of the model it ran last in its
8 MiB of memory; two models that take turns would upload theirs again and
again. Compile them together so that both stay on the stick:

    coralrt compile --compiler edgetpu_compiler a.tflite b.tflite

and run the a_edgetpu.tflite and b_edgetpu.tflite it writes (docs/cli.md).
"""

import argparse
import time

from coralrt import InferenceSession, vision, list_devices, open_device


def open_one_stick(target):
    """(target for the sessions, an open stick or None for the CPU)."""
    if target == "auto":
        try:
            target = "coral" if list_devices() else "cpu"
        except Exception:                    # no libusb, no permission: no stick
            target = "cpu"
    if target == "cpu":
        return "cpu", None
    if target == "sim":
        from coralrt.testing import open_simulated_sticks
        return "sim", open_simulated_sticks(1)[0]
    return "coral", open_device("usb:0")


def main():
    parser = argparse.ArgumentParser(description="Two classification models on one stick.")
    parser.add_argument("model_a", help="first classification .tflite")
    parser.add_argument("model_b", help="second classification .tflite")
    parser.add_argument("image", help="an image file")
    parser.add_argument("--labels", help="label file for both models")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each model")
    parser.add_argument("--target", default="auto", choices=["auto", "sim", "coral", "cpu"],
                        help="where to run (default: auto, a stick if present, else the CPU)")
    args = parser.parse_args()

    labels = vision.read_labels(args.labels) if args.labels else None
    target, stick = open_one_stick(args.target)
    try:
        with InferenceSession(args.model_a, target=target, device=stick) as session_a, \
                InferenceSession(args.model_b, target=target, device=stick) as session_b:
            print(f"target: {target}, both sessions on {stick if stick is not None else 'the CPU'}")
            for round_ in range(1, args.rounds + 1):
                for name, session in (("A", session_a), ("B", session_b)):
                    start = time.perf_counter()
                    top = vision.classify(session, args.image, top_k=1, labels=labels)[0]
                    ms = (time.perf_counter() - start) * 1000
                    print(f"round {round_}  model {name}  {top.label or top.id}  "
                          f"{top.score:.2f}  {ms:6.1f} ms")
    finally:
        if stick is not None:
            stick.close()      # sessions leave a stick they were given open: close it here


if __name__ == "__main__":
    main()
