"""Throughput of MobileNet v2 (one Edge TPU segment) on timing-only simulated sticks.

The sticks are ``SimulatedBackend(timing_only=True)``: every segment run waits
the latency model's estimate (2.6 ms per MobileNet v2 224 inference on USB 3,
the published figure the model is fitted to) and answers zeros, so what is
measured is coralrt's host side (session, worker threads, executor, USB
driver, framing, transfers to the simulated backend) plus device time as wall
time, not the simulator's numpy kernels, which on a 2-core host would
otherwise be what is measured.  Figures are the latency model's, not a real
stick's; docs/multi-stick.md quotes them.

- ``test_submit_loop_against_run_loop``: one stick; each frame the caller does
  some host work (builds the input from a camera-sized frame), then ``run``
  (waits) or ``submit`` (the next frame is prepared while this one runs).
- ``test_sticks_throughput``: 1, 2 and 4 sticks, ``strategy="replicate"`` and
  ``"pipeline"``, a burst of submitted requests.  Goals, reported and not
  asserted: replicate >= 1.8x on 2 sticks and >= 3.4x on 4.  A one-segment
  model has one pipeline stage, so ``"pipeline"`` cannot use a second stick.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from coralrt import InferenceSession

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import shared_model  # noqa: E402
from support.sim import timing_sticks  # noqa: E402

pytestmark = pytest.mark.bench

MODEL = "mobilenet_v2_1.0_224_quant.tflite"
FRAMES = 60          # per round of the submit/run loops
BURST = 96           # requests per round of the multi-stick case
GOALS = {2: 1.8, 4: 3.4}
_RESULTS: dict = {}


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("CORALRT_RUNTIME_DIR", str(tmp_path / "run"))


def camera_frames(k: int = 4) -> list[np.ndarray]:
    return [np.random.default_rng(i).integers(0, 256, (480, 640, 3), np.uint8) for i in range(k)]


def prepare(camera: np.ndarray, k: int) -> np.ndarray:
    """The caller's host work per frame: crop, subsample, brighten into a new input."""
    crop = camera[16:464:2, 96:544:2]                      # 224 x 224
    frame = np.empty((1, 224, 224, 3), np.uint8)
    np.add(crop, k % 7, out=frame[0], casting="unsafe")
    return frame


@pytest.mark.parametrize("mode", ["run", "submit"])
@pytest.mark.benchmark(group="one stick: run loop vs submit loop (timing-only sim)")
def test_submit_loop_against_run_loop(benchmark, record_value, mode, capsys):
    (stick,) = timing_sticks(1)
    cams = camera_frames()
    try:
        with InferenceSession(shared_model(MODEL), target="sim", device=stick) as s:
            assert [r["kind"] for r in s.profile()] == ["tpu"]    # one Edge TPU segment
            s.run(prepare(cams[0], 0))                     # parameters uploaded

            def run_loop():
                for k in range(FRAMES):
                    s.run(prepare(cams[k % len(cams)], k))

            def submit_loop():
                pending: deque = deque()
                for k in range(FRAMES):
                    pending.append(s.submit(prepare(cams[k % len(cams)], k)))
                    if len(pending) > 2:
                        pending.popleft().result(10)
                for f in pending:
                    f.result(10)

            benchmark.pedantic(run_loop if mode == "run" else submit_loop, rounds=5,
                               iterations=1, warmup_rounds=1)
            device = s.profile()[0]["device_seconds"]
    finally:
        stick.close()
    stats = getattr(benchmark, "stats", None)
    if stats is None:
        return
    per_frame = stats.stats.median / FRAMES
    _RESULTS[("loop", mode)] = per_frame
    record_value(f"throughput {mode} loop, 1 stick, per frame", per_frame)
    start = time.perf_counter()
    for k in range(200):
        prepare(cams[k % len(cams)], k)
    host = (time.perf_counter() - start) / 200
    with capsys.disabled():
        print(f"\n{mode} loop: {1 / per_frame:.0f} frames/s (host work {host * 1e3:.2f} ms "
              f"per frame, device time {device * 1e3:.2f} ms per inference)")
        other = _RESULTS.get(("loop", "run"))
        if mode == "submit" and other is not None:
            print(f"submit loop / run loop: {other / per_frame:.2f}x frames per second")


@pytest.mark.parametrize("n_sticks", [1, 2, 4])
@pytest.mark.parametrize("strategy", ["replicate", "pipeline"])
@pytest.mark.benchmark(group="MobileNet v2 on 1, 2, 4 sticks (timing-only sim)")
def test_sticks_throughput(benchmark, record_value, strategy, n_sticks, capsys):
    sticks = timing_sticks(n_sticks)
    x = prepare(camera_frames(1)[0], 0)
    try:
        with InferenceSession(shared_model(MODEL), target="sim", device=sticks,
                              strategy=strategy, max_pending=4 * n_sticks) as s:
            for f in [s.submit(x) for _ in range(2 * n_sticks)]:
                f.result(10)                               # every stick has its parameters

            def burst():
                futures = [s.submit(x) for _ in range(BURST)]
                return [f.result(30) for f in futures]
            benchmark.pedantic(burst, rounds=5, iterations=1, warmup_rounds=1)
    finally:
        for d in sticks:
            d.close()
    stats = getattr(benchmark, "stats", None)
    if stats is None:
        return
    per_inference = stats.stats.median / BURST
    _RESULTS[(strategy, n_sticks)] = per_inference
    record_value(f"throughput {strategy} {n_sticks} stick(s) per inference", per_inference)
    one = _RESULTS.get(("replicate", 1))
    scaling = "" if one is None else f", {one / per_inference:.2f}x one stick"
    goal = f" (goal >= {GOALS[n_sticks]}x)" if strategy == "replicate" and n_sticks in GOALS \
        else ""
    with capsys.disabled():
        print(f"\n{strategy}, {n_sticks} stick(s): {1 / per_inference:.0f} inferences/s"
              f"{scaling}{goal}")
