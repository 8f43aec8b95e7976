"""Classify a stream of frames, keeping the stick busy, and print frames per second.

Shows: InferenceSession.submit(). It returns a future at once, so the loop
prepares and submits frame N+1 while the stick still runs frame N, and only
then takes frame N's result. The session's queue (max_pending, default 4)
bounds how far ahead the loop can get: a full queue makes submit() wait.

Frames come from a camera (--camera N, needs OpenCV: pip install
opencv-python-headless) or from the images of a folder, read in a loop
(--folder DIR, needs only Pillow). Without a stick, from the repository root:

    python examples/camera_loop.py ../shared/models/mobilenet_v1_0.25_128_quant.tflite \
        --folder ../shared/images --frames 20 --labels ../shared/images/imagenet_labels.txt \
        --target sim

On a Coral USB Accelerator with a USB camera: --camera 0 --target coral (or
the default target, auto).
"""

import argparse
import collections
import itertools
import os
import sys
import time

from coralrt import InferenceSession, vision

IMAGE_SUFFIXES = (".bmp", ".png", ".jpg", ".jpeg")


def camera_frames(index):
    """(name, RGB frame) from camera ``index`` with OpenCV, until the camera stops."""
    try:
        import cv2
    except ImportError:
        sys.exit("--camera needs OpenCV: pip install opencv-python-headless "
                 "(or use --folder DIR)")
    capture = cv2.VideoCapture(index)
    if not capture.isOpened():
        sys.exit(f"cannot open camera {index}")

    def frames():
        try:
            while True:
                ok, bgr = capture.read()
                if not ok:
                    return
                yield f"camera {index}", cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        finally:
            capture.release()
    return frames()


def folder_frames(folder):
    """(name, RGB image) for the images of ``folder`` (read with Pillow), over and over."""
    names = sorted(n for n in os.listdir(folder) if n.lower().endswith(IMAGE_SUFFIXES))
    if not names:
        sys.exit(f"no {'/'.join(IMAGE_SUFFIXES)} images in {folder}")
    images = [vision.as_rgb_array(os.path.join(folder, n)) for n in names]
    return itertools.cycle(zip(names, images))


def main():
    parser = argparse.ArgumentParser(description="Classify frames with coralrt, kept in flight.")
    parser.add_argument("model", help="a classification .tflite")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--camera", type=int, metavar="N", help="camera index (OpenCV)")
    source.add_argument("--folder", metavar="DIR", help="loop over the images of a folder")
    parser.add_argument("--frames", type=int, default=100, help="stop after this many frames")
    parser.add_argument("--labels", help="label file")
    parser.add_argument("--target", default="auto", choices=["auto", "sim", "coral", "cpu"],
                        help="where to run (default: auto, a stick if present, else the CPU)")
    args = parser.parse_args()

    frames = folder_frames(args.folder) if args.folder else camera_frames(args.camera or 0)
    labels = vision.read_labels(args.labels) if args.labels else None

    with InferenceSession(args.model, target=args.target) as session:
        input_info = session.get_inputs()[0]
        in_flight = collections.deque()      # (frame number, name, future), oldest first

        def report(number, name, future):
            outputs = future.result()        # waits for this frame only
            best = vision.classes_from_outputs(session, outputs, top_k=1, labels=labels)[0]
            print(f"frame {number:4d}  {name:24.24s}  {best.label or best.id}  {best.score:.2f}")

        start = time.perf_counter()
        count = 0
        for count, (name, frame) in enumerate(itertools.islice(frames, args.frames), 1):
            tensor, _, _ = vision.prepare(input_info, frame)
            in_flight.append((count, name, session.submit({input_info.name: tensor})))
            if len(in_flight) > 1:           # frame N+1 is submitted: now take frame N
                report(*in_flight.popleft())
        while in_flight:
            report(*in_flight.popleft())
        seconds = time.perf_counter() - start
        print(f"target: {session.target}")

    if count:
        print(f"{count} frames in {seconds:.2f} s: {count / seconds:.1f} frames per second")


if __name__ == "__main__":
    main()
