"""One model over two sticks: one session, device=[stick 0, stick 1].

Shows: strategy="replicate" (the whole model on each stick, every request on
whichever stick is free: more requests per second) and strategy="pipeline"
(the model's Edge TPU segments spread over the sticks, segment i on stick
i mod 2: for models too big for one stick's 8 MiB). It submits N requests at
once, waits for all, and prints the throughput and session.stats(), which
says how many requests each stick (or pipeline stage) ran. Without sticks,
from the repository root:

    python examples/one_model_two_sticks.py ../shared/models/mobilenet_v1_0.25_128_quant.tflite \
        ../shared/images/bird.bmp --labels ../shared/images/imagenet_labels.txt \
        --strategy replicate --requests 16 --target sim

DeepLab v3 has two Edge TPU segments, so "pipeline" gives each stick one:

    python examples/one_model_two_sticks.py \
        ../shared/models/deeplabv3_mnv2_dm05_pascal_quant.tflite \
        ../shared/images/dog_segmentation.bmp --strategy pipeline --requests 4 --target sim

--target sim opens two simulated sticks (coralrt._sim.stick.open_simulated_sticks).
With two Coral USB Accelerators plugged in: --target coral, which opens
"usb:0" and "usb:1" (auto does too when it finds two sticks).
"""

import argparse
import json
import time

from coralrt import InferenceSession, vision, list_devices


def open_two_sticks(target):
    """(target for the session, the two sticks to pass as device=, or None for the CPU)."""
    if target == "auto":
        try:
            target = "coral" if len(list_devices()) >= 2 else "cpu"
        except Exception:                    # no libusb, no permission: no sticks
            target = "cpu"
    if target == "cpu":
        return "cpu", None
    if target == "sim":
        from coralrt.testing import open_simulated_sticks
        return "sim", open_simulated_sticks(2)
    return "coral", ["usb:0", "usb:1"]      # paths: the session opens and closes them


def main():
    parser = argparse.ArgumentParser(description="One model over two sticks.")
    parser.add_argument("model", help="a .tflite with one image input")
    parser.add_argument("image", help="an image file")
    parser.add_argument("--labels", help="label file (for a classifier)")
    parser.add_argument("--strategy", default="replicate", choices=["replicate", "pipeline"])
    parser.add_argument("--requests", type=int, default=64, help="how many requests to submit")
    parser.add_argument("--target", default="auto", choices=["auto", "sim", "coral", "cpu"],
                        help="where to run (default: auto, two sticks if present, else the CPU)")
    args = parser.parse_args()

    labels = vision.read_labels(args.labels) if args.labels else None
    target, sticks = open_two_sticks(args.target)
    if sticks is None:
        print("no two sticks: running on the CPU, session.stats() will be empty")
    try:
        with InferenceSession(args.model, target=target, device=sticks,
                              strategy=args.strategy, max_pending=8) as session:
            info = session.get_inputs()[0]
            tensor, _, _ = vision.prepare(info, args.image)
            # The first request on each stick also uploads the model's parameters to it.
            start = time.perf_counter()
            futures = [session.submit({info.name: tensor}) for _ in range(args.requests)]
            results = [f.result() for f in futures]
            seconds = time.perf_counter() - start
            stats = session.stats()
            print(f"target: {target}, strategy: {args.strategy}")
            if vision.guess_task(session) == "classify":
                scores = session.get_outputs()[0].dequantize(next(iter(results[0].values())))
                top = vision.classes_from_scores(scores, top_k=1, labels=labels)[0]
                print(f"top class: {top.label or top.id} {top.score:.2f}")
            else:
                print("outputs:", {name: a.shape for name, a in results[0].items()})

        print(f"{args.requests} requests in {seconds:.2f} s: "
              f"{args.requests / seconds:.1f} requests per second")
        for row in stats.get("replicas", []):
            print(f"  stick {row['device']}: {row['requests']} requests")
        for row in stats.get("stages", []):
            print(f"  stage {row['stage']} on stick {row['device']}: {row['requests']} "
                  f"requests, busy {row['busy_seconds']:.2f} s")
        print("stats:", json.dumps(stats))
    finally:
        if target == "sim":
            for stick in sticks:   # a session leaves open sticks it was given open
                stick.close()


if __name__ == "__main__":
    main()
